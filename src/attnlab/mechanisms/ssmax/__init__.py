"""Scalable-Softmax (SSMax; Nakanishi 2025, arXiv:2501.19399): the logits of a query that sees n keys scaled by
s log n, s learned per head, so that a softmax over a longer context does not flatten. Names load on first use
(:mod:`attnlab.lazy`)."""

from ...lazy import lazy_exports

_HOMES = {"S_INIT": ".reference", "keys_seen": ".reference", "ssmax_weights": ".reference",
          "ScalableSoftmax": ".module"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
