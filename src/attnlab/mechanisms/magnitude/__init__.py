"""Magnitude attention: the key weights of the Magnitude Attention write-up (docs/magnitude.md).

reference: the formulas in float64-friendly torch (similarity, solves, prefix forms, the gate and the logit prior);
lowrank: the low-rank-plus-diagonal solver; fused: the same weights as one autograd node with hand-derived
gradients; prefix_blocks: causal attention with the low-rank prefix weights, block by block; module: MagnitudeGate.
"""

from .module import MagnitudeGate, magnitude_gates, magnitude_log, magnitude_stats, record_magnitude_stats
from .reference import (PRIOR_FLOOR, gate, log_prior, magnitude, magnitude_weights, prefix_magnitude,
                        prefix_weight_matrix, prefix_weights)

__all__ = ["MagnitudeGate", "magnitude_gates", "magnitude_log", "magnitude_stats", "record_magnitude_stats",
           "PRIOR_FLOOR", "gate", "log_prior", "magnitude", "magnitude_weights", "prefix_magnitude",
           "prefix_weight_matrix", "prefix_weights"]
