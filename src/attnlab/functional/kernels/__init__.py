"""Fused attention kernels written in Triton, each beside a float64 reference of the formula it computes.

prior_attention: causal attention with an additive per-key log-prior, softmax_j(q_i . k_j * scale + p_j), forward
and backward (:mod:`.perkey`); reference: the same formula written directly, for the tests (:mod:`.reference`).
lowrank_prior_attention: the same with the low-rank prefix magnitude prior log max(M_ij, floor), M_ij = (1 - phi_j .
c_i) / lambda_j, built per tile from the factors (:mod:`.lowrank`); its float64 formula is in :mod:`.reference` too.
lowrank_gate_attention: the same kernel with the prefix value gate g(M_ij) on v_j instead of the prior.
What the kernels share (dtypes, checks, tile sizes, the online-softmax step) is in :mod:`.common`. Triton is optional (the ``kernels`` extra): this package imports without it, and
:func:`available` tells a caller whether the kernels can run here, so that it can fall back to SDPA or the explicit
path. The kernels live under ``functional`` because they are pure attention math on [B, H, T, D] tensors and the
attention routing in :mod:`attnlab.functional.attention` is where they will be called from.
"""

from __future__ import annotations

import os

from ...lazy import lazy_exports

_HOMES = {"prior_attention": ".perkey", "PriorAttention": ".perkey", "prior_attention_reference": ".reference",
          "lowrank_prior_attention": ".lowrank", "lowrank_gate_attention": ".lowrank",
          "LowrankPrefixAttention": ".lowrank", "lowrank_prior_attention_reference": ".reference",
          "lowrank_gate_attention_reference": ".reference"}
__all__ = ["available", *_HOMES]
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)


def available() -> bool:
    """Whether the Triton kernels can run here: triton imports, and either torch sees a CUDA device or Triton's
    CPU interpreter is switched on (TRITON_INTERPRET=1, set before triton is first imported)."""
    try:
        import triton  # noqa: F401
    except Exception:  # an ImportError, or a broken install that fails on import
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True
    import torch
    return torch.cuda.is_available()
