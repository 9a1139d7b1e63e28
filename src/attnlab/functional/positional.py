"""Positional encodings as pure functions.

Sinusoidal (Vaswani et al. 2017; the masking write-up): p_{i,2k} = sin(i / phi_k), p_{i,2k+1} = cos(i / phi_k),
phi_k = 10000^(2k / d_model), for k = 0 .. d_model/2 - 1 and positions i = 0, 1, ...
(the masking write-up writes k = 1 .. d_model/2, which would index dimension d_model; we follow the paper's k from 0).

RoPE (Su et al. 2021, RoFormer eq. 34): rotate each pair (x_{2k}, x_{2k+1}) of a query/key at position m by the
angle m * theta_k, theta_k = base^(-2k / d). Then <R_m q, R_n k> depends on m - n only.
"""

from __future__ import annotations

import torch


def sinusoidal_table(n_positions: int, d_model: int, base: float = 10000.0, dtype=torch.float32) -> torch.Tensor:
    """[n_positions, d_model] table of the masking write-up's sinusoidal encodings (computed in float64, then cast)."""
    if d_model % 2:
        raise ValueError(f"sinusoidal encodings need an even d_model, got {d_model}")
    i = torch.arange(n_positions, dtype=torch.float64)[:, None]  # position i
    two_k = torch.arange(0, d_model, 2, dtype=torch.float64)[None, :]  # 2k
    phi = base ** (two_k / d_model)  # phi_k = 10000^(2k/d_model)
    table = torch.empty(n_positions, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(i / phi)  # p_{i,2k}
    table[:, 1::2] = torch.cos(i / phi)  # p_{i,2k+1}
    return table.to(dtype)


def rope_angles(n_positions: int, head_dim: int, base: float = 10000.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of m * theta_k, each [n_positions, head_dim / 2], float32 (computed in float64)."""
    theta = base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)  # theta_k = base^(-2k/d)
    angles = torch.arange(n_positions, dtype=torch.float64)[:, None] * theta[None, :]  # m theta_k
    return angles.cos().float(), angles.sin().float()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [..., T, d] pairwise: (a, b) -> (a cos - b sin, a sin + b cos) with cos/sin [T, d/2]."""
    pairs = x.unflatten(-1, (-1, 2))  # [..., T, d/2, 2] = (x_{2k}, x_{2k+1})
    a, b = pairs[..., 0], pairs[..., 1]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
