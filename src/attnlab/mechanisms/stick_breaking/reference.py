"""Stick-breaking attention written straight from its definition (Tan et al. 2024, arXiv:2410.17980):
query i, at position p, breaks its stick of length 1 over the keys before it, nearest first,

    beta_ij = sigmoid(z_ij),   A_ij = beta_ij prod_{j < k < p} (1 - beta_ik)   for j < p,

and what is left, prod_{k < p} (1 - beta_ik) = 1 - sum_{j < p} A_ij, goes to the query's own value v_p, as the
authors' released code does (shawntan/stickbreaking-attention: o = A v + (1 - sum A) v_p). So the query's own
logit z_ip is never used, rows sum to 1, and the first query, with no key before it, keeps its own value.
"""

from __future__ import annotations

import torch


def stick_breaking_weights(z: torch.Tensor) -> torch.Tensor:
    """The stick-breaking weights of causal logits ``z`` [B, H, T, S] in float64, the stick broken key by key: query
    i sits at position p = S - T + i (after S - T cached keys) and the remainder is its weight on key p."""
    z = z.double()
    t, s_len = z.shape[-2:]
    out = torch.zeros_like(z)
    for i in range(t):
        p = s_len - t + i
        left = torch.ones_like(z[..., i, 0])  # the stick still unallocated
        for j in range(p - 1, -1, -1):  # nearest key first
            out[..., i, j] = torch.sigmoid(z[..., i, j]) * left  # beta_ij times what the nearer keys left
            left = left * torch.sigmoid(-z[..., i, j])  # 1 - beta_ij = sigmoid(-z_ij)
        out[..., i, p] = left
    return out
