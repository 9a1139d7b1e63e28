"""The allowed values of heads.mix: plain Python, no torch (functional.py and module.py compute them)."""

HEAD_MIXES = ("concat", "talking", "moh", "coda")
LOGIT_MIXES = ("talking", "coda")  # the heads.mix values that change the logits inside the softmax: explicit path
