"""The learned attention sink written straight from its definition. Head h has one learned logit s_h, the logit
of an extra key whose value is zero (a sink token as in Xiao et al. 2023, arXiv:2309.17453, section 3.3, made a
per-head scalar as GPT-OSS does):

    p_ij = exp(z_ij) / (exp(s_h) + sum_k exp(z_ik)),    o_i = sum_j p_ij v_j,

the sums over the keys query i sees. The sink's own weight exp(s_h) / (...) multiplies a zero value, so the
row's weights on the real keys sum to less than 1: a query can attend to nothing. With s_h -> -inf this is
softmax; s_h = 0 is "softmax plus one" in the denominator.
"""

from __future__ import annotations

import torch


def sink_weights(z: torch.Tensor, s: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """The weights p of logits ``z`` [B, H, T, S] with sink logits ``s`` [H], in float64, row by row over the keys
    the query sees (a causal row i over keys 0..i + S - T); the sink's own weight is left out, so rows sum to < 1."""
    z, s = z.double(), s.double()
    b, h, t, s_len = z.shape
    out = torch.zeros_like(z)
    for i in range(t):
        seen = i + s_len - t + 1 if causal else s_len
        row = z[:, :, i, :seen]  # [B, H, n]
        top = torch.maximum(row.amax(-1), s.view(1, h))  # m: exp(. - m) <= 1, the ratio unchanged
        e = torch.exp(row - top.unsqueeze(-1))  # exp(z_ij - m)
        out[:, :, i, :seen] = e / (torch.exp(s.view(1, h) - top) + e.sum(-1)).unsqueeze(-1)  # exp(s_h - m) + sum_k
    return out
