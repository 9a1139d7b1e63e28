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
BACKENDS = ("auto", "sdpa", "explicit", "triton", "flex")
TRITON_DTYPES = ("float16", "bfloat16", "float32")  # what attnlab.functional.kernels.prior_attention takes
TRITON_INSTALL = "pip install 'attnlab[kernels]'"
MAGNITUDE_GATES = ("clamp", "sigmoid", "linear")  # the magnitude value gates, default first: here, below both the
#   magnitude package (attnlab.mechanisms.magnitude.names.GATES) and the Triton kernel that computes them


def uses_sdpa(*, normalizer="softmax", causal=False, mask_form="additive", return_weights=False, backend="auto",
              value_gate=False, head_mix=False, softcap=False):
    """Whether :func:`attention` will call SDPA for these options (value_gate, head_mix: whether one is given).

    The one predicate for "these options reduce to softmax(q k' s + mask) v": attnlab.attention_config.route
    asks it too (a per-(i, j) value gate, the prefix magnitude form, does not reduce; a per-key gate on v does).
    A logit prior, per key or per (i, j), is an additive float mask and never changes the answer. Talking heads,
    CODA's cascade and selective attention (head_mix: a head_mix or a logit_fn is given) change the logits of all
    heads at each (i, j) from other logits, which no fused kernel does. A softcap (softcap: whether one is set)
    bends every logit, c tanh(z / c), which SDPA has no hook for.
    """
    reducible = (normalizer == "softmax" and not (causal and mask_form == "renormalize") and not return_weights
                 and not value_gate and not head_mix and not softcap)
    if backend == "sdpa" and not reducible:
        raise ValueError(
            f"backend='sdpa' cannot compute a normalizer other than 'softmax' (got {normalizer!r}), "
            "mask_form='renormalize', a value_gate, heads mixed inside the softmax (talking heads, CODA, selective "
            "attention), a softcap or return weights; use backend='auto' or 'explicit'"
        )
    return reducible and backend != "explicit"


def triton_misfits(*, causal=True, kernel="dot", normalizer="softmax", mask_form="additive", return_weights=False,
                   dropout=False, value_gate=False, head_mix=False, sink=False, pair_prior=False,
                   softcap=False) -> list[str]:
    """What keeps these options off the Triton kernel (attnlab.functional.kernels.prior_attention), as short
    labels for a one-line error ("kernel='rbf'", "a sink"); empty when they fit. The kernel computes causal softmax(q k' s + p_j) v with a per-key log-prior p_j
    (or none) and the additive mask, nothing else: no weights returned, no dropout, no per-(i, j) gate or prior
    (pair_prior), no logits mixed across heads, no sink column, no softcap. attnlab.attention_config.route and
    attnlab.functional.attention.attention ask it, each adding what only it knows (keys vs queries, dtype)."""
    name = normalizer if isinstance(normalizer, str) else getattr(normalizer, "__name__", "a function")
    checks = ((f"causal={causal}", causal), (f"kernel={kernel!r}", kernel == "dot"),
              (f"normalizer={name!r}", normalizer == "softmax"), (f"mask_form={mask_form!r}", mask_form == "additive"),
              ("return_weights=True", not return_weights), ("dropout > 0", not dropout),
              ("a value_gate", not value_gate), ("heads mixed inside the softmax", not head_mix),
              ("a sink", not sink), ("a per-(i, j) logit_prior", not pair_prior), ("a softcap", not softcap))
    return [label for label, ok in checks if not ok]


TRITON_ALLOWED = ("causal, kernel='dot', normalizer='softmax', mask_form='additive', a per-key logit prior or none, no "
                  "weights returned, no dropout, no value gate, head mixing, sink or softcap")


def flex_misfits(*, kernel="dot", normalizer="softmax", mask_form="additive", return_weights=False, dropout=False,
                 value_gate=False, head_mix=False) -> list[str]:
    """What keeps these options off the FlexAttention backend (attnlab.functional.flex), as short labels; empty when
    they fit. It computes softmax(q k' s + prior) v, causal or not, with a logit prior per key or per (i, j), a sink
    and grouped K/V heads: no other normalizer or kernel, no renormalized mask, no weights returned, no dropout, no
    per-(i, j) value gate, no logits mixed across heads."""
    name = normalizer if isinstance(normalizer, str) else getattr(normalizer, "__name__", "a function")
    checks = ((f"kernel={kernel!r}", kernel == "dot"), (f"normalizer={name!r}", normalizer == "softmax"),
              (f"mask_form={mask_form!r}", mask_form == "additive"), ("return_weights=True", not return_weights),
              ("dropout > 0", not dropout), ("a value_gate", not value_gate),
              ("heads mixed inside the softmax", not head_mix))
    return [label for label, ok in checks if not ok]


FLEX_ALLOWED = ("kernel='dot', normalizer='softmax', mask_form='additive', causal or not, a logit prior per key or per "
                "(i, j) or none, a sink, ALiBi, a softcap, no weights returned, no dropout, no value gate or head mixing")
