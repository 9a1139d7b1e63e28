"""Selective attention written straight from its definition (Leviathan, Kalman and Matias 2024, arXiv:2410.02703,
section 3), in float64 loops. With z_hij the causal logits of head h (query i, key j <= i):

    S_kj = ReLU(z_0kj)   for 0 < j < k,   else 0      (head 0 selects; BOS, j = 0, and the token itself, j = k,
                                                        are never masked; a future key, j > k, has z = -inf)
    F_ij = sum_{k < i} S_kj                            (the selection of token k acts on queries after k only)
    p_hi = softmax_j(z_hij - F_ij)   over j <= i       (F subtracted from every head, head 0 included)

F_ij > 0 needs 0 < j < k < i, so queries 0, 1 and 2 are never affected, and the key just before a query
(j = i - 1) and the query's own key are never penalised.
"""

from __future__ import annotations

import torch

SELECTION_HEAD = 0
"""The head whose logits are the selection scores: head 0, as in the paper (section 3, "reusing" a head's logits)."""


def selection_penalty_reference(z: torch.Tensor) -> torch.Tensor:
    """F [B, T, T] (float64) of causal logits ``z`` [B, H, T, T], by the three sums of the definition."""
    z = z.double()
    b, _, t, s_len = z.shape
    if s_len != t:
        raise ValueError(f"selective attention needs the logits of every query of the prefix (T = S), got T={t}, "
                         f"S={s_len}")
    sel = torch.zeros(b, t, t, dtype=torch.float64)
    for k in range(t):
        for j in range(1, k):  # 0 < j < k: not BOS, not itself, not the future
            sel[:, k, j] = torch.relu(z[:, SELECTION_HEAD, k, j])  # S_kj = ReLU(z_0kj)
    penalty = torch.zeros(b, t, t, dtype=torch.float64)
    for i in range(t):
        for k in range(i):
            penalty[:, i] += sel[:, k]  # F_ij = sum_{k < i} S_kj
    return penalty


def selective_weights(z: torch.Tensor) -> torch.Tensor:
    """p [B, H, T, T] (float64): one softmax of z_hij - F_ij per row over the keys j <= i, zero after i."""
    z = z.double()
    penalty = selection_penalty_reference(z)
    out = torch.zeros_like(z)
    for i in range(z.shape[-2]):
        out[:, :, i, :i + 1] = torch.softmax(z[:, :, i, :i + 1] - penalty[:, None, i, :i + 1], dim=-1)
    return out
