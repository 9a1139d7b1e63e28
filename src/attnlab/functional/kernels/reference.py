"""The formula of :mod:`.perkey` and :mod:`.lowrank`, written directly in float64: the tests' independent reference.

    s_ij = q_i . k_j * scale + p_j
    a_ij = exp(s_ij) / sum_{l <= i} exp(s_il) for j <= i, 0 for j > i
    o_i  = sum_j a_ij v_j

The whole [T, T] score matrix is built, masked and normalised with torch.softmax; gradients come from autograd.
:func:`lowrank_prior_attention_reference` does the same for :mod:`.lowrank`, with the prior log max(M_ij, floor) of
the low-rank factors built as a whole [T, T] matrix, and :func:`lowrank_gate_attention_reference` with the value gate
g(M_ij) on v_j.
"""

from __future__ import annotations

import math

import torch

__all__ = ["lowrank_prior_attention_reference", "prior_attention_reference"]


def prior_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prior: torch.Tensor | None = None,
                              scale: float | None = None) -> torch.Tensor:
    """Causal attention with a per-key log-prior, in float64 (the result is float64, differentiable).

    Shapes as :func:`attnlab.functional.kernels.prior_attention`: q [B, H, T, D]; k, v [B, Hkv, T, D]; prior
    [B or 1, 1 or Hkv or H, T] or None (one prior per K/V head when it has Hkv heads and Hkv < H).
    """
    b, h, t, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v = q.double(), k.double(), v.double()
    k = k.repeat_interleave(group, dim=1)  # query head h reads K/V head h // group
    v = v.repeat_interleave(group, dim=1)
    s = q @ k.transpose(-1, -2) * scale  # s_ij = q_i . k_j * scale
    if prior is not None:
        p = prior.double()
        if p.shape[1] == hkv and hkv != h:
            p = p.repeat_interleave(group, dim=1)
        s = s + p.unsqueeze(-2)  # + p_j, the same for every query i
    later = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)  # j > i
    a = torch.softmax(s.masked_fill(later, float("-inf")), dim=-1)
    return a @ v  # o_i = sum_{j <= i} a_ij v_j


def lowrank_prior_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, phi: torch.Tensor,
                                      lam: torch.Tensor, c: torch.Tensor, prior_floor: float,
                                      scale: float | None = None) -> torch.Tensor:
    """Causal attention with the low-rank prefix prior, in float64 (the result is float64, differentiable):

        M_ij = (1 - phi_j . c_i) / lam_j
        s_ij = q_i . k_j * scale + log max(M_ij, prior_floor)
        o_i  = sum_{j <= i} softmax_j(s_ij) v_j

    the formula of :func:`attnlab.functional.kernels.lowrank_prior_attention`, with the [T, T] matrices built whole. Shapes as
    :func:`attnlab.functional.kernels.lowrank_prior_attention`: q [B, H, T, D]; k, v [B, Hkv, T, D]; phi, c
    [B or 1, 1 or Hkv or H, T, r], lam [B or 1, 1 or Hkv or H, T] (one set per K/V head when they have Hkv heads and
    Hkv < H).
    """
    b, h, t, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v, phi, lam, c = (x.double() for x in (q, k, v, phi, lam, c))
    k = k.repeat_interleave(group, dim=1)  # query head h reads K/V head h // group
    v = v.repeat_interleave(group, dim=1)
    if phi.shape[1] == hkv and hkv != h:
        phi, lam, c = (x.repeat_interleave(group, dim=1) for x in (phi, lam, c))
    m = (1.0 - c @ phi.transpose(-1, -2)) / lam.unsqueeze(-2)  # M_ij = (1 - phi_j . c_i) / lam_j
    s = q @ k.transpose(-1, -2) * scale + torch.log(m.clamp_min(prior_floor))  # + log max(M_ij, floor)
    later = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)  # j > i
    a = torch.softmax(s.masked_fill(later, float("-inf")), dim=-1)
    return a @ v  # o_i = sum_{j <= i} a_ij v_j


def lowrank_gate_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, phi: torch.Tensor,
                                     lam: torch.Tensor, c: torch.Tensor, beta, gamma, gate: str = "clamp",
                                     scale: float | None = None) -> torch.Tensor:
    """Causal attention with the low-rank prefix value gate, in float64 (the result is float64, differentiable in
    every tensor argument, beta and gamma included when they are tensors):

        M_ij = (1 - phi_j . c_i) / lam_j
        g_ij = sigmoid(beta clamp(M_ij, 0, 1) + gamma)  (clamp) | sigmoid(beta M_ij + gamma)  (sigmoid)
               | clamp(beta M_ij + gamma, 0, 1)  (linear)
        o_i  = sum_{j <= i} softmax_j(q_i . k_j * scale) g_ij v_j

    the formula of :func:`attnlab.functional.kernels.lowrank_gate_attention` (the Magnitude Attention write-up's step
    3 with the prefix weights), with the [T, T] matrices built whole. Shapes as
    :func:`lowrank_prior_attention_reference`."""
    b, h, t, d = q.shape
    hkv = k.shape[1]
    group = h // hkv
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q, k, v, phi, lam, c = (x.double() for x in (q, k, v, phi, lam, c))
    beta, gamma = (x.double() if isinstance(x, torch.Tensor) else float(x) for x in (beta, gamma))
    k = k.repeat_interleave(group, dim=1)
    v = v.repeat_interleave(group, dim=1)
    if phi.shape[1] == hkv and hkv != h:
        phi, lam, c = (x.repeat_interleave(group, dim=1) for x in (phi, lam, c))
    m = (1.0 - c @ phi.transpose(-1, -2)) / lam.unsqueeze(-2)  # M_ij = (1 - phi_j . c_i) / lam_j
    if gate == "clamp":
        g = torch.sigmoid(beta * m.clamp(0.0, 1.0) + gamma)
    elif gate == "sigmoid":
        g = torch.sigmoid(beta * m + gamma)
    elif gate == "linear":
        g = (beta * m + gamma).clamp(0.0, 1.0)
    else:
        raise ValueError(f"gate={gate!r}; allowed: 'clamp', 'sigmoid', 'linear'")
    later = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)  # j > i
    p = torch.softmax((q @ k.transpose(-1, -2) * scale).masked_fill(later, float("-inf")), dim=-1)
    return (p * g) @ v  # o_i = sum_{j <= i} p_ij g_ij v_j
