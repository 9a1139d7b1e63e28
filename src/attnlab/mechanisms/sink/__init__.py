"""A learned attention-sink logit per head (GPT-OSS; the sink token of Xiao et al. 2023, arXiv:2309.17453): one
extra key with logit s_h and a zero value, so a query can put mass on nothing. Names load on first use
(:mod:`attnlab.lazy`)."""

from ...lazy import lazy_exports

_HOMES = {"sink_weights": ".reference", "AttentionSink": ".module", "S_INIT": ".module"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
