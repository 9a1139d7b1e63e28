"""Selective attention (Leviathan, Kalman and Matias 2024, arXiv:2410.02703): head 0's logits say how much each
token wants earlier tokens masked for the queries after it; the accumulated amount is subtracted from the logits of
every head before the softmax. Parameter-free. Names load on first use (:mod:`attnlab.lazy`)."""

from ...lazy import lazy_exports

_HOMES = {"SELECTION_HEAD": ".reference", "selection_penalty_reference": ".reference",
          "selective_weights": ".reference", "selection_penalty": ".functional", "select_logits": ".functional"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
