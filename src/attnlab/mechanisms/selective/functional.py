"""Selective attention as the layer computes it: one masked cumulative sum, differentiable, in the logits' dtype
(the sum in at least float32). attnlab.nn.Attention passes :func:`select_logits` to attnlab.functional.attention as
its ``logit_fn``, which applies it to the raw logits before the causal mask (explicit path)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .reference import SELECTION_HEAD


def selection_penalty(z: torch.Tensor) -> torch.Tensor:
    """F [B, 1, T, T] of logits ``z`` [B, H, T, T] (before or after the causal mask) (arXiv:2410.02703, section 3)."""
    t, s_len = z.shape[-2:]
    if s_len != t:
        raise ValueError(f"selective attention needs the logits of every query of the prefix (T = S), got T={t}, "
                         f"S={s_len}; it has no K/V cache")
    selectable = torch.ones(t, t, dtype=torch.bool, device=z.device).tril(diagonal=-1)  # j < k: past, not itself
    selectable[:, 0] = False  # BOS is never masked
    sel = torch.relu(z[:, SELECTION_HEAD]).masked_fill(~selectable, 0.0)  # S_kj = ReLU(z_0kj), 0 < j < k
    acc = torch.promote_types(z.dtype, torch.float32)
    total = sel.to(acc).cumsum(dim=-2)  # sum_{k <= i} S_kj
    penalty = F.pad(total, (0, 0, 1, -1))  # shifted one query down: F_ij = sum_{k < i} S_kj
    return penalty.to(z.dtype).unsqueeze(1)


def select_logits(z: torch.Tensor) -> torch.Tensor:
    """z - F: the logits of every head (head 0 included) minus the accumulated selection."""
    return z - selection_penalty(z)
