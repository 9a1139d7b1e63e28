"""Differential attention (Ye et al. 2024, "Differential Transformer", arXiv:2410.05258): each head's weights are the
difference of two softmax maps, softmax(Q1 K1'/sqrt(d')) - lambda softmax(Q2 K2'/sqrt(d')), so that the mass both
maps give to the same keys (attention noise) cancels. Names load on first use (:mod:`attnlab.lazy`)."""

from ...lazy import lazy_exports

_HOMES = {"LAMBDA_STD": ".reference", "NORM_EPS": ".reference", "lambda_init": ".reference",
          "lambda_value": ".reference", "differential_weights": ".reference", "head_rms_norm": ".reference",
          "differential_attention": ".reference", "DifferentialHeads": ".module"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
