"""What the Triton kernels of this package share: dtypes and limits, the checks of q, k, v and the scale, the tile
sizes, and the online-softmax step of the forward kernels (Milakov and Gimelshein 2018, arXiv:1805.02867; the
flash structure of Dao et al. 2022, arXiv:2205.14135)."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # log2(e): exp(x) = exp2(x * LOG2E)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
MAX_HEAD_DIM = 256


@triton.jit
def online_softmax_step(s2, m_i, l_i, acc, v, PRECISION: tl.constexpr):
    """One key block of the online softmax: s2 [BLOCK_M, BLOCK_N] holds the block's base-2 scores (-inf where
    masked), m_i the running row maximum, l_i the running sum_j exp2(s2_ij - m_i), acc the running
    sum_j exp2(s2_ij - m_i) v_j. Returns (m_i, l_i, acc) after the block."""
    m_new = tl.maximum(m_i, tl.max(s2, 1))
    alpha = tl.exp2(m_i - m_new)  # rescales what was summed under the old maximum
    e = tl.exp2(s2 - m_new[:, None])
    l_i = l_i * alpha + tl.sum(e, 1)
    acc = acc * alpha[:, None] + tl.dot(e.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def load_tile(ptr, rows, stride, cols, rows_ok, cols_ok):
    """The tile x[rows, cols] [len(rows), len(cols)] of a row-major array at ptr (row r at ptr + r * stride, its
    elements consecutive), zero outside rows_ok x cols_ok (the padding of a partial block adds nothing to a dot)."""
    return tl.load(ptr + rows[:, None] * stride + cols[None, :], mask=rows_ok[:, None] & cols_ok[None, :], other=0.0)


@triton.jit
def load_tile_t(ptr, rows, stride, cols, rows_ok, cols_ok):
    """:func:`load_tile` transposed as it loads: x[rows, cols]' [len(cols), len(rows)]."""
    return tl.load(ptr + rows[None, :] * stride + cols[:, None], mask=rows_ok[None, :] & cols_ok[:, None], other=0.0)


def check_qkv(fail: Callable[[str], None], q, k, v, scale) -> None:
    """One-line errors (through ``fail``) for q [B, H, T, D], k, v [B, Hkv, T, D] and a scale the kernels do not
    take: 4-D tensors of one float dtype on one device, Hkv dividing H, 1 <= D <= MAX_HEAD_DIM, T >= 1, fewer than
    2**31 elements (32-bit indexing), scale finite or None."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor) or x.dim() != 4:
            fail(f"{name} must be a 4-D tensor [B, H, T, D], got "
                 f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        if x.dtype not in DTYPES:
            fail(f"{name} has dtype {x.dtype}; allowed: float16, bfloat16, float32")
        if x.device != q.device:
            fail(f"{name} is on {x.device} but q is on {q.device}; all inputs must share one device")
        if x.numel() >= 2**31:
            fail(f"{name} has {x.numel()} elements; allowed: fewer than 2**31 (the kernels index in 32 bits)")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        fail(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    b, h, t, d = q.shape
    if k.shape[0] != b or k.shape[2] != t or k.shape[3] != d:
        fail(f"k has shape {tuple(k.shape)}; allowed: [{b}, Hkv, {t}, {d}] for q of shape {tuple(q.shape)}")
    if v.shape != k.shape:
        fail(f"v has shape {tuple(v.shape)}; allowed: the shape of k, {tuple(k.shape)}")
    if k.shape[1] < 1 or h % k.shape[1]:
        fail(f"k and v have {k.shape[1]} heads; allowed: a divisor of q's {h} heads")
    if not 1 <= d <= MAX_HEAD_DIM:
        fail(f"head dimension {d}; allowed: 1 to {MAX_HEAD_DIM}")
    if t < 1:
        fail(f"sequence length {t}; allowed: at least 1")
    if scale is not None and not (isinstance(scale, (int, float)) and math.isfinite(scale)):
        fail(f"scale {scale!r}; allowed: a finite number or None (1 / sqrt(D))")


def block_sizes(fail: Callable[[str], None], device, block_m, block_n, *dims) -> tuple[int, ...]:
    """(block_m, block_n, then each of ``dims`` padded to a power of two of at least 16, tl.dot's smallest): query
    and key rows per tile, 64 on CUDA and 16 elsewhere unless given (powers of two, at least 16)."""
    default = 64 if device.type == "cuda" else 16
    block_m, block_n = block_m or default, block_n or default
    for name, value in (("block_m", block_m), ("block_n", block_n)):
        if value < 16 or value & (value - 1):
            fail(f"{name}={value}; allowed: a power of two, at least 16")
    return (block_m, block_n, *(max(16, triton.next_power_of_2(x)) for x in dims))


def backward_tiles(fail: Callable[[str], None], backward_blocks, block_m: int,
                   block_n: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """((BLOCK_M, BLOCK_N) of the dK/dV kernel, (BLOCK_M, BLOCK_N) of the dq kernel). Each backward kernel owns the
    rows of one tile (keys for dK/dV, queries for dq) and loops over the other axis; backward_blocks = (outer,
    inner) gives the owned rows and the rows per loop step (the layout of the FlashAttention-2 backward in Triton's
    tutorial: a short inner step keeps the [outer, inner] score tiles and their gradients in registers). None: the
    forward's block_m x block_n for both."""
    if backward_blocks is None:
        return (block_m, block_n), (block_m, block_n)
    if (not isinstance(backward_blocks, (tuple, list)) or len(backward_blocks) != 2
            or not all(isinstance(x, int) and x >= 16 and not x & (x - 1) for x in backward_blocks)):
        fail(f"backward_blocks={backward_blocks!r}; allowed: None or (outer, inner), two powers of two, at least 16")
    outer, inner = backward_blocks
    return (inner, outer), (outer, inner)


def precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision: IEEE for float32 (no TF32 rounding), TF32 (the native path) for 16-bit inputs."""
    return "ieee" if dtype == torch.float32 else "tf32"


def factor_precision(dtype: torch.dtype) -> str:
    """tl.dot's input precision for the float32 products of the low-rank factors (c_i . phi_j and the factors'
    gradients), by the dtype of q: IEEE for float32 inputs; for 16-bit inputs TF32x3, three TF32 tensor-core
    products whose sum keeps about float32's accuracy (the split a = a_hi + a_lo, a b ~ a_hi b_hi + a_hi b_lo +
    a_lo b_hi), far faster than IEEE's CUDA-core loop. Plain TF32 (10-bit mantissa) is not enough: M_ij = (1 - c_i
    . phi_j) / lambda_j cancels where the prior is small, and its log would carry the rounding."""
    return "ieee" if dtype == torch.float32 else "tf32x3"


@triton.jit
def online_softmax_gated_step(s2, g, m_i, l_i, acc, v, PRECISION: tl.constexpr):
    """:func:`online_softmax_step` with a gate g [BLOCK_M, BLOCK_N] on the values and not on the normaliser:
    l_i sums exp2(s2_ij - m_i), acc sums exp2(s2_ij - m_i) g_ij v_j, so that acc / l_i = sum_j p_ij g_ij v_j."""
    m_new = tl.maximum(m_i, tl.max(s2, 1))
    alpha = tl.exp2(m_i - m_new)
    e = tl.exp2(s2 - m_new[:, None])
    l_i = l_i * alpha + tl.sum(e, 1)
    acc = acc * alpha[:, None] + tl.dot((e * g).to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc


@triton.jit
def online_softmax_weighted_step(s2, weight, m_i, l_i, acc, v, PRECISION: tl.constexpr):
    """:func:`online_softmax_step` for the scores s2 + log2(weight) without their logarithm: weight [BLOCK_M,
    BLOCK_N] > 0 multiplies each exponential in the normaliser and on the values, l_i sums exp2(s2_ij - m_i)
    weight_ij and acc the same times v_j, since exp2(s2 + log2 w) = exp2(s2) w. The running maximum m_i is taken
    over s2 alone: the shift cancels in acc / l_i, and l_i >= weight_ij at the row's largest s2 keeps it from 0."""
    m_new = tl.maximum(m_i, tl.max(s2, 1))
    alpha = tl.exp2(m_i - m_new)
    e = tl.exp2(s2 - m_new[:, None]) * weight
    l_i = l_i * alpha + tl.sum(e, 1)
    acc = acc * alpha[:, None] + tl.dot(e.to(v.dtype), v, input_precision=PRECISION)
    return m_new, l_i, acc
