"""Softpick (Zuhri et al. 2025, arXiv:2504.20966): a rectified softmax, ReLU(e^z - 1) / sum |e^z - 1|, whose rows
may sum to less than 1, so a query can put its mass on no key at all. Names load on first use (:mod:`attnlab.lazy`)."""

from ...lazy import lazy_exports

_HOMES = {"EPS": ".functional", "softpick": ".functional", "softpick_weights": ".reference"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
