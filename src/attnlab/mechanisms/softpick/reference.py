"""Softpick written straight from its definition (Zuhri et al. 2025, arXiv:2504.20966):

    Softpick(z)_j = ReLU(e^{z_j} - 1) / (sum_l |e^{z_l} - 1| + eps e^m),   m = max_l z_l,

over the keys the query sees (a hidden key is in neither sum). The paper computes it in the shifted form
ReLU(e^{z_j - m} - e^{-m}) / (sum_l |e^{z_l - m} - e^{-m}| + eps), which is the line above multiplied through by
e^{-m}: its eps, added after the shift, is eps e^m before it. A key with z <= 0 gets weight 0, and the row sums to
sum_{z_j > 0} (e^{z_j} - 1) / sum_l |e^{z_l} - 1| <= 1: a query whose logits are all <= 0 attends to nothing.
"""

from __future__ import annotations

import torch

from .functional import EPS


def softpick_weights(z: torch.Tensor, *, causal: bool, eps: float = EPS) -> torch.Tensor:
    """The softpick weights of logits ``z`` [B, H, T, S] in float64, one row at a time over the keys the query sees
    (a causal row i: keys 0..i + S - T), unshifted: e^z in float64 is exact enough for |z| < 700."""
    z = z.double()
    t, s_len = z.shape[-2:]
    out = torch.zeros_like(z)
    for i in range(t):
        seen = i + s_len - t + 1 if causal else s_len
        row = z[..., i, :seen]
        grown = row.exp() - 1  # e^{z_j} - 1
        m = row.amax(-1, keepdim=True)  # the paper's shift
        out[..., i, :seen] = grown.clamp(min=0) / (grown.abs().sum(-1, keepdim=True) + eps * m.exp())
    return out
