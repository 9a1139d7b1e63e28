"""The output gate of one attention layer: W_theta (and b), applied to the attention output before W_o."""

from __future__ import annotations

import torch
import torch.nn as nn


class OutputGate(nn.Module):
    """sigmoid(x W_theta + b) [B, n_head, T, head_dim], head h's slice gating o_h (Qiu et al. 2025,
    arXiv:2505.06708, G1 elementwise). ``proj`` is a plain nn.Linear, so the model initialises it as it does the
    q/k/v projections: the authors' code makes the gate extra output rows of the query projection, with that
    projection's init and bias setting (``bias`` here is the layer's)."""

    def __init__(self, n_embd: int, n_head: int, head_dim: int, bias: bool):
        super().__init__()
        self.n_head, self.head_dim = n_head, head_dim
        self.proj = nn.Linear(n_embd, n_head * head_dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, n_embd] -> the gate [B, n_head, T, head_dim]."""
        return torch.sigmoid(self.proj(x)).unflatten(-1, (self.n_head, self.head_dim)).transpose(1, 2)
