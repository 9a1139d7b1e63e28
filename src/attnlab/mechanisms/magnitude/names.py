"""The allowed values and the defaults of the magnitude switches: plain Python, no torch, so that MagnitudeConfig
and the variant registry check and name them without importing the math (reference.py, lowrank.py compute them)."""

KERNELS = ("gaussian", "laplacian")
SOLVERS = ("cholesky", "cg")  # the exact solvers (reference.py)
LOWRANK = "lowrank"  # the low-rank solver (lowrank.py), beside SOLVERS
from ...switches import MAGNITUDE_GATES as GATES  # noqa: E402  clamp, sigmoid, linear; default first
GATE_ALIASES = {"seed": "sigmoid"}  # earlier names of the gates, still accepted
FORMS = ("global", "causal", "prefix")  # which key set each weight is taken in (see reference.gaussian_key_weights)
CAUSAL_FORMS = FORMS[1:]  # the forms solved on every prefix (exact by one Cholesky factor, or the lowrank solver)
APPLY = ("values", "logits")  # where the weights act: a gate on the values (default), or a prior in the softmax
PRIOR_FLOOR = 1e-4  # log_prior clamps w here: below 1/N for every context attnlab trains (N <= 1024), so exact
#   clusters of up to 10^4 clones still count as one key; a key with w <= floor (magnitude weights can be 0 or
#   negative) keeps a finite prior log(1e-4) = -9.2 against 0 for an isolated key (no -inf, no empty row)
RANK = 32  # default number of landmarks r
CHUNK = 64  # default positions per block of the chunked solve
EPS = 0.1  # the eps of the registered low-rank variants: at 1e-3 the approximation misses the exact weights of
#   trained keys by as much as their size; at 0.1 it holds (docs/studies/magnitude-long.md#the-defaults)
