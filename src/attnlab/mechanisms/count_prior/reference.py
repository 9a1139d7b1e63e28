"""The duplicate-count prior: the control for magnitude's logit prior on exact duplicates.

For the tokens x_1..x_T of a sequence, query i and key j <= i:

    c_ij = #{ l <= i : x_l = x_j }                  (copies of token x_j in query i's prefix, x_j itself included)
    p_ij = softmax_j(z_ij - log c_ij)               (p_ij proportional to exp(z_ij) / c_ij)

so m identical tokens in a prefix share the mass one token would get, whatever m is. On exact duplicates this is
what the prefix magnitude prior does at no cost: m identical keys have magnitude weights 1/m each (the closed form
N / (1 + (N - 1) q) at q = 1; docs/magnitude.md), so log max(M_ij, floor) = -log m. Unlike magnitude it sees only
identical token ids, in every layer alike: near-duplicates (different tokens with similar keys) count once each.
The prior depends on the prefix 1..i only, so it is causal.
"""

from __future__ import annotations

import torch

__all__ = ["count_log_prior"]


def count_log_prior(idx: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """-log c_ij as a [B, 1, T, T] float tensor for token ids ``idx`` [B, T] (0 where j > i: the causal mask hides
    those keys anyway). One head dimension, so it broadcasts over every head of a layer."""
    if idx.dim() != 2:
        raise ValueError(f"idx must have shape [B, T], got {tuple(idx.shape)}")
    same = (idx.unsqueeze(-1) == idx.unsqueeze(-2)).to(dtype)  # same[b, l, j] = [x_l == x_j]
    count = same.cumsum(dim=1)  # count[b, i, j] = sum_{l <= i} [x_l == x_j] = c_ij, >= 1 for j <= i
    return -torch.log(count.clamp(min=1)).unsqueeze(1)
