"""Positional encodings as pure functions.

Sinusoidal (Vaswani et al. 2017; the masking write-up): p_{i,2k} = sin(i / phi_k), p_{i,2k+1} = cos(i / phi_k),
phi_k = 10000^(2k / d_model), for k = 0 .. d_model/2 - 1 and positions i = 0, 1, ...
(the masking write-up writes k = 1 .. d_model/2, which would index dimension d_model; we follow the paper's k from 0).

RoPE (Su et al. 2021, RoFormer eq. 34): rotate each pair (x_{2k}, x_{2k+1}) of a query/key at position m by the
angle m * theta_k, theta_k = base^(-2k / d). Then <R_m q, R_n k> depends on m - n only.

ALiBi (Press, Smith and Lewis 2022, "Train Short, Test Long", arXiv:2108.12409, section 3): no position enters the
embeddings; each head h adds -m_h |i - j| to its logits z_ij, a penalty linear in the distance with a fixed slope
m_h per head, the geometric sequence m_h = 2^(-8h/n) for h = 1 .. n heads.
"""

from __future__ import annotations

import math

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


def alibi_slopes(n_head: int) -> torch.Tensor:
    """ALiBi's slope m_h of each head h = 1 .. n_head, float64 [n_head].

    For n a power of 2: m_h = 2^(-8h/n), a geometric sequence from 2^(-8/n) down to 2^-8 (arXiv:2108.12409, section
    3: 1/2, 1/4, ..., 1/256 for 8 heads). For other n, as the paper's released code does: the 2^k = n' below n get
    their own sequence 2^(-8h/n'), and the remaining n - n' heads take every other slope of the 2n'-head sequence,
    2^(-8h/(2n')) for odd h = 1, 3, 5, ..., which fall between the first ones."""
    if isinstance(n_head, bool) or not isinstance(n_head, int) or n_head < 1:
        raise ValueError(f"n_head={n_head!r} must be a positive integer")
    base = 2 ** int(math.floor(math.log2(n_head)))  # n': the largest power of 2 <= n
    h = torch.arange(1, base + 1, dtype=torch.float64)
    odd = 2 * torch.arange(n_head - base, dtype=torch.float64) + 1  # h = 1, 3, ... of the 2n'-head sequence
    return torch.cat([2.0 ** (-8.0 * h / base), 2.0 ** (-8.0 * odd / (2 * base))])


def alibi_bias(slopes: torch.Tensor, t: int, s: int | None = None) -> torch.Tensor:
    """ALiBi's additive logit bias b_hij = -m_h |pos_i - j|, [H, t, s], in slopes' dtype and device.

    Keys sit at positions j = 0 .. s - 1 and the t queries at the last t positions, pos_i = s - t + i (a K/V cache
    with s - t keys before them; s = t without one). In a causal model only j <= pos_i is seen, where the bias is
    the paper's -m_h (pos_i - j); beyond it (non-causal attention) the distance counts the same both ways.
    Computed in at least float32 (slopes of a model cast to bfloat16 would round positions above 256 and make
    neighbours 0 apart); the caller casts the result."""
    s = t if s is None else s
    dtype = torch.promote_types(slopes.dtype, torch.float32)
    pos_q = torch.arange(s - t, s, dtype=dtype, device=slopes.device)  # pos_i
    pos_k = torch.arange(s, dtype=dtype, device=slopes.device)  # j
    return -slopes.to(dtype).view(-1, 1, 1) * (pos_q.view(-1, 1) - pos_k.view(1, -1)).abs()
