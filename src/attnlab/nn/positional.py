"""Positional encoding modules. The formulas live in attnlab.functional.positional.

Input encodings (learned, sinusoidal) return a [T, n_embd] table added to the token embeddings, i.e. p_i is
added to x_i before the Q/K/V projections (the masking write-up). RoPE instead rotates queries and keys inside every
attention layer.
"""

from __future__ import annotations

import torch
from torch import nn

from ..functional.positional import apply_rope, rope_angles, sinusoidal_table


class LearnedPositions(nn.Module):
    """GPT-2's learned absolute position embedding: one trained vector per position."""

    def __init__(self, block_size: int, n_embd: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(block_size, n_embd))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, t: int, offset: int = 0) -> torch.Tensor:
        """The vectors of positions offset .. offset + t - 1."""
        return self.weight[offset:offset + t]


class SinusoidalPositions(nn.Module):
    """Fixed sinusoidal encodings (Vaswani et al. 2017; the masking write-up); no parameters."""

    def __init__(self, block_size: int, n_embd: int):
        super().__init__()
        self.register_buffer("table", sinusoidal_table(block_size, n_embd), persistent=False)

    def forward(self, t: int, offset: int = 0) -> torch.Tensor:
        """The encodings of positions offset .. offset + t - 1."""
        return self.table[offset:offset + t]


class RotaryEmbedding(nn.Module):
    """RoPE (Su et al. 2021): rotates [B, H, T, head_dim] queries or keys by their position; no parameters."""

    def __init__(self, block_size: int, head_dim: int, base: float = 10000.0):
        super().__init__()
        cos, sin = rope_angles(block_size, head_dim, base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """x [..., T, d] at positions offset .. offset + T - 1 (offset: the tokens before, e.g. in a K/V cache)."""
        t = x.shape[-2]
        return apply_rope(x, self.cos[offset:offset + t], self.sin[offset:offset + t])
