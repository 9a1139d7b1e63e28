"""Stick-breaking attention (Tan et al. 2024, arXiv:2410.17980): each earlier key, nearest first, takes a share
sigmoid(z_ij) of what the nearer keys left of the query's unit of attention. Causal only. Names load on first use
(:mod:`attnlab.lazy`)."""

from ...lazy import lazy_exports

_HOMES = {"own_position": ".functional", "stick_breaking": ".functional", "stick_breaking_weights": ".reference"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
