"""Softpick as attnlab.functional.attention computes it (Zuhri et al. 2025, arXiv:2504.20966): the shifted form

    p_ij = ReLU(e^{z_ij - m_i} - e^{-m_i}) / (sum_k |e^{z_ik - m_i} - e^{-m_i}| + eps),

sums over the keys query i sees. The paper shifts by the row max; this shifts by m_i = max(0, max_k z_ik). Where the
row max is positive the two are the same; where it is not, every numerator is 0 either way (all z <= 0), and the
clamp keeps e^{-m} <= 1, so a row of very negative logits cannot overflow (e^{80} and beyond in float32).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

EPS = 1e-6
"""eps in the denominator, after the shift: the value the authors' released attention kernel adds
(zaydzuhri/softpick-attention); it matters only when every |e^z - 1| is 0, i.e. every logit is exactly 0."""


def softpick(z: torch.Tensor, keep: torch.Tensor | None = None, eps: float = EPS) -> torch.Tensor:
    """Softpick weights of logits ``z`` [B, H, T, S] along the last axis; ``keep`` (broadcastable boolean, True where
    query i sees key j) hides keys from both sums. Same dtype as z."""
    if keep is not None:
        z = z.masked_fill(~keep, float("-inf"))  # e^{-inf - m} = 0: a hidden key's term is -e^{-m}, zeroed below
    m = z.amax(-1, keepdim=True).clamp(min=0)  # m_i = max(0, max_k z_ik)
    shifted = torch.exp(z - m) - torch.exp(-m)  # e^{z - m} - e^{-m} = e^{-m} (e^z - 1)
    if keep is not None:
        shifted = shifted.masked_fill(~keep, 0.0)  # hidden keys: in neither sum
    return F.relu(shifted) / (shifted.abs().sum(-1, keepdim=True) + eps)  # ReLU(.) / (sum_k |.| + eps)
