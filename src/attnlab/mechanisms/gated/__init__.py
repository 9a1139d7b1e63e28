"""Gated attention (Qiu et al. 2025, arXiv:2505.06708): each head's attention output times an elementwise sigmoid
gate of the layer's input token, before the output projection. Names load on first use (:mod:`attnlab.lazy`)."""

from ...lazy import lazy_exports

_HOMES = {"gated_output": ".reference", "OutputGate": ".module"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
