"""The allowed values of the shared attention switches and the SDPA predicate: plain Python, no torch, so that a
config can check its fields without importing the math (attnlab.functional.attention computes them). It lives
outside attnlab.functional, whose package imports torch."""

from __future__ import annotations

KERNELS = ("dot", "rbf")  # attnlab.functional.scores: dot_logits, rbf_logits
BUILTIN_NORMALIZERS = ("softmax", "none")  # computed by attnlab.functional.attention itself
MECHANISM_NORMALIZERS = ("softpick", "stickbreaking")  # attnlab.mechanisms.normalizers: a function the layer passes
NORMALIZERS = BUILTIN_NORMALIZERS + MECHANISM_NORMALIZERS
CAUSAL_NORMALIZERS = ("stickbreaking",)  # the stick is broken over the keys before the query: causal attention only
MASK_FORMS = ("additive", "renormalize")  # the masking write-up's two forms (attnlab.functional.masks)
BACKENDS = ("auto", "sdpa", "explicit")


def uses_sdpa(*, normalizer="softmax", causal=False, mask_form="additive", return_weights=False, backend="auto",
              value_gate=False, head_mix=False):
    """Whether :func:`attention` will call SDPA for these options (value_gate, head_mix: whether one is given).

    The one predicate for "these options reduce to softmax(q k' s + mask) v": attnlab.attention_config.route
    asks it too (a per-(i, j) value gate, the prefix magnitude form, does not reduce; a per-key gate on v does).
    A logit prior, per key or per (i, j), is an additive float mask and never changes the answer. Talking heads,
    CODA's cascade and selective attention (head_mix: a head_mix or a logit_fn is given) change the logits of all
    heads at each (i, j) from other logits, which no fused kernel does.
    """
    reducible = (normalizer == "softmax" and not (causal and mask_form == "renormalize") and not return_weights
                 and not value_gate and not head_mix)
    if backend == "sdpa" and not reducible:
        raise ValueError(
            f"backend='sdpa' cannot compute a normalizer other than 'softmax' (got {normalizer!r}), "
            "mask_form='renormalize', a value_gate, heads mixed inside the softmax (talking heads, CODA, selective "
            "attention) or return weights; use backend='auto' or 'explicit'"
        )
    return reducible and backend != "explicit"
