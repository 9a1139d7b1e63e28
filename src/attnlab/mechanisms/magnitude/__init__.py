"""Magnitude attention: the key weights of the Magnitude Attention write-up (docs/magnitude.md).

reference: the formulas in float64-friendly torch (similarity, solves, prefix forms, the gate and the logit prior);
lowrank: the low-rank-plus-diagonal solver; fused: the same weights as one autograd node with hand-derived
gradients; prefix_blocks: causal attention with the low-rank prefix weights, block by block; module: MagnitudeGate;
names: the allowed values of the switches, without torch. Names load on first use (:mod:`attnlab.lazy`).
"""

from ...lazy import lazy_exports

_HOMES = {**dict.fromkeys(("MagnitudeGate", "magnitude_gates", "magnitude_log", "magnitude_stats",
                           "record_magnitude_stats"), ".module"),
          **dict.fromkeys(("PRIOR_FLOOR", "gate", "log_prior", "magnitude", "magnitude_weights", "prefix_magnitude",
                           "prefix_weight_matrix", "prefix_weights"), ".reference")}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
