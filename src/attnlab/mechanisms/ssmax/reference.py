"""Scalable-Softmax written straight from its definition (Nakanishi 2025, arXiv:2501.19399, section 2):

    SSMax(z)_j = n^(s z_j) / sum_l n^(s z_l) = exp((s log n) z_j) / sum_l exp((s log n) z_l),

where n is the number of inputs of the softmax: the number of keys the query sees (its prefix length i + 1 in a
causal model, all S keys otherwise), and s a learned scalar per head (and layer). At n = 1 every logit is scaled
by 0, and the one key a first query sees takes all of its mass, as in softmax.
"""

from __future__ import annotations

import math

import torch

S_INIT = 0.43
"""The initial s of every head: the value the paper's Figure 1 illustrates SSMax with (with a logit gap of 5, the top
key keeps a weight near 1 at every n there)."""


def keys_seen(t: int, s_len: int, *, causal: bool, offset: int = 0, device=None) -> torch.Tensor:
    """n_i, the number of keys query i sees ([t], float64): offset + i + 1 in a causal layer whose queries follow
    ``offset`` cached positions, else every one of the ``s_len`` keys."""
    if causal:
        return torch.arange(offset + 1, offset + t + 1, dtype=torch.float64, device=device)
    return torch.full((t,), float(s_len), dtype=torch.float64, device=device)


def ssmax_weights(z: torch.Tensor, s: torch.Tensor, *, causal: bool) -> torch.Tensor:
    """The SSMax weights of logits ``z`` [B, H, T, S] with per-head ``s`` [H], in float64, one softmax per row over
    the keys the query sees (a causal row i over keys 0..i + S - T): a loop over rows, the formula as written."""
    z, s = z.double(), s.double()
    b, h, t, s_len = z.shape
    out = torch.zeros_like(z)
    for i in range(t):
        seen = i + s_len - t + 1 if causal else s_len
        scale = s.view(1, h, 1) * math.log(seen)  # s log n
        out[:, :, i, :seen] = torch.softmax(scale * z[:, :, i, :seen], dim=-1)
    return out
