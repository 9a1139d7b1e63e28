"""Causal attention with an additive per-key log-prior, as fused Triton kernels (forward and backward).

    o_i = sum_{j <= i} a_ij v_j,   a_ij = softmax_j(s_ij),   s_ij = q_i . k_j * scale + p_j

q [B, H, T, D]; k, v [B, Hkv, T, D] with H a multiple of Hkv (GQA: query head h reads K/V head h // (H / Hkv));
p [B, Hp, T] (or with a batch of 1), where Hp is 1 (one prior for every head), Hkv (one per K/V head) or H (one per
query head). One kernel serves every per-key log-prior: the causal magnitude prior log max(w_j, floor), the
per-key form of the duplicate-count prior, a sink-like bias on chosen keys. The prior must be finite (a floor,
not -inf: key 0 is the only key of query 0).

Structure (flash attention; the shared pieces are in :mod:`.common`): the forward walks the key blocks of each query block with an online softmax and
saves the row log-sum-exp; the backward recomputes the score tiles from it. One kernel per key block accumulates
dK, dV and dp_j = sum_i dS_ij (the gradient of the prior is the column sum of dS) over the query blocks and over
the query heads that share the K/V head, so nothing is accumulated across programs (no atomics); dq has its own
kernel over the key blocks of each query block. Scores live in base 2 inside the kernels (exp2 is the hardware's
instruction): s2 = s * log2(e), lse2 = lse * log2(e).

Memory: O(B H T) besides the inputs and outputs (the log-sum-exp, the row sums delta_i and the per-query-head dp).

How it is called: :func:`attnlab.functional.attention.attention` takes this path with backend="triton", and with
backend="auto" on CUDA for a causal ``logit_prior`` of shape [B, H or Hkv, T] (per key) when
:func:`attnlab.functional.kernels.available` says Triton can run; it keeps SDPA with a float mask or the explicit
path otherwise.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import available
from .common import LOG2E, block_sizes, check_qkv, load_tile, load_tile_t, online_softmax_step, precision

__all__ = ["PriorAttention", "prior_attention"]


@triton.jit
def _forward_kernel(Q, K, V, P, O, LSE2,
                    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, spb, sph, spt, sob, soh, sot,
                    T, H, D, GROUP, P_DIV, qk_scale2,
                    HAS_PRIOR: tl.constexpr, PRECISION: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP  # the K/V head this query head reads
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < T
    d_ok = offs_d < D
    q = load_tile(Q + b * sqb + h * sqh, offs_m, sqt, offs_d, row_ok, d_ok)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    p_base = P + b * spb + (h // P_DIV) * sph
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)  # running row maximum of s2
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)  # running sum_j exp2(s2_ij - m_i)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)  # running sum_j exp2(s2_ij - m_i) v_j
    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)  # causal: no key after the block's last query
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < T
        k_t = load_tile_t(k_base, offs_n, skt, offs_d, col_ok, d_ok)  # [BLOCK_D, BLOCK_N]
        v = load_tile(v_base, offs_n, svt, offs_d, col_ok, d_ok)
        s2 = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale2  # s2_ij = q_i . k_j * scale * log2(e)
        if HAS_PRIOR:
            p = tl.load(p_base + offs_n * spt, mask=col_ok, other=0.0).to(tl.float32)
            s2 += p[None, :] * 1.4426950408889634  # + p_j * log2(e)
        keep = (offs_n[None, :] <= offs_m[:, None]) & col_ok[None, :]  # j <= i, j < T
        m_i, l_i, acc = online_softmax_step(tl.where(keep, s2, float("-inf")), m_i, l_i, acc, v, PRECISION)
    out = acc / l_i[:, None]  # o_i = sum_j exp2(s2_ij - m_i) v_j / sum_j exp2(s2_ij - m_i)
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE2 + pid_bh * T + offs_m, m_i + tl.log2(l_i), mask=row_ok)  # lse2_i = log2 sum_j exp2(s2_ij)


@triton.jit
def _dkdv_kernel(Q, K, V, P, DO, LSE2, DELTA, DK, DV, DP,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, spb, sph, spt, sdb, sdh, sdt,
                 T, HKV, D, GROUP, P_DIV, scale, qk_scale2,
                 HAS_PRIOR: tl.constexpr, PRECISION: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    # One program per (key block, batch, K/V head): the loop over query heads of the group and query blocks adds
    # every contribution to dk_j, dv_j (and dp_j per query head) in this program's registers.
    pid_n = tl.program_id(0)
    pid_bk = tl.program_id(1)
    b = pid_bk // HKV
    hk = pid_bk % HKV
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    col_ok = offs_n < T
    d_ok = offs_d < D
    kv_mask = col_ok[:, None] & d_ok[None, :]
    k = load_tile(K + b * skb + hk * skh, offs_n, skt, offs_d, col_ok, d_ok)
    v = load_tile(V + b * svb + hk * svh, offs_n, svt, offs_d, col_ok, d_ok)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M  # causal: no query block before the one holding key pid_n*BLOCK_N
    for g in range(0, GROUP):
        h = hk * GROUP + g
        bh = b * HKV * GROUP + h
        if HAS_PRIOR:
            p = tl.load(P + b * spb + (h // P_DIV) * sph + offs_n * spt, mask=col_ok, other=0.0).to(tl.float32)
        dp = tl.zeros([BLOCK_N], dtype=tl.float32)
        for start_m in range(lo, T, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < T
            q = load_tile(Q + b * sqb + h * sqh, offs_m, sqt, offs_d, row_ok, d_ok)  # [BLOCK_M, BLOCK_D], loaded once
            do = load_tile(DO + b * sdb + h * sdh, offs_m, sdt, offs_d, row_ok, d_ok)
            lse2 = tl.load(LSE2 + bh * T + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0)
            s2_t = tl.dot(k, tl.trans(q), input_precision=PRECISION) * qk_scale2  # transposed tile: [key j, query i]
            if HAS_PRIOR:
                s2_t += p[:, None] * 1.4426950408889634
            keep = (offs_n[:, None] <= offs_m[None, :]) & col_ok[:, None] & row_ok[None, :]
            a_t = tl.where(keep, tl.exp2(s2_t - lse2[None, :]), 0.0)  # a_ij = exp(s_ij - lse_i)
            dv += tl.dot(a_t.to(do.dtype), do, input_precision=PRECISION)  # dv_j = sum_i a_ij do_i
            da_t = tl.dot(v, tl.trans(do), input_precision=PRECISION)  # da_ij = do_i . v_j
            ds_t = a_t * (da_t - delta[None, :])  # dS_ij = a_ij (da_ij - delta_i), delta_i = do_i . o_i
            dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)  # dk_j = scale sum_i dS_ij q_i
            dp += tl.sum(ds_t, 1)  # dp_j = sum_i dS_ij
        if HAS_PRIOR:
            tl.store(DP + bh * T + offs_n, dp, mask=col_ok)
    tl.store(DK + pid_bk * T * D + offs_n[:, None] * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=kv_mask)
    tl.store(DV + pid_bk * T * D + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_kernel(Q, K, V, P, DO, LSE2, DELTA, DQ,
               sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, spb, sph, spt, sdb, sdh, sdt,
               T, H, D, GROUP, P_DIV, scale, qk_scale2,
               HAS_PRIOR: tl.constexpr, PRECISION: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    row_ok = offs_m < T
    d_ok = offs_d < D
    q_mask = row_ok[:, None] & d_ok[None, :]
    q = load_tile(Q + b * sqb + h * sqh, offs_m, sqt, offs_d, row_ok, d_ok)
    do = load_tile(DO + b * sdb + h * sdh, offs_m, sdt, offs_d, row_ok, d_ok)
    lse2 = tl.load(LSE2 + pid_bh * T + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh * T + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    p_base = P + b * spb + (h // P_DIV) * sph
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < T
        k = load_tile(k_base, offs_n, skt, offs_d, col_ok, d_ok)
        v = load_tile(v_base, offs_n, svt, offs_d, col_ok, d_ok)
        s2 = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale2
        if HAS_PRIOR:
            p = tl.load(p_base + offs_n * spt, mask=col_ok, other=0.0).to(tl.float32)
            s2 += p[None, :] * 1.4426950408889634
        keep = (offs_n[None, :] <= offs_m[:, None]) & col_ok[None, :] & row_ok[:, None]
        a = tl.where(keep, tl.exp2(s2 - lse2[:, None]), 0.0)  # a_ij = exp(s_ij - lse_i)
        da = tl.dot(do, tl.trans(v), input_precision=PRECISION)  # da_ij = do_i . v_j
        ds = a * (da - delta[:, None])  # dS_ij = a_ij (da_ij - delta_i)
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)  # dq_i = scale sum_j dS_ij k_j
    tl.store(DQ + pid_bh * T * D + offs_m[:, None] * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=q_mask)


def _fail(message: str):
    raise ValueError(f"prior_attention: {message}")


def _check(q, k, v, prior, scale):
    """One-line ValueErrors for shapes, dtypes and devices the kernels do not take."""
    check_qkv(_fail, q, k, v, scale)
    b, h, t, _ = q.shape
    if prior is not None:
        hkv = k.shape[1]
        if not isinstance(prior, torch.Tensor) or not prior.is_floating_point():
            _fail(f"prior must be a floating-point tensor [B, H, T], got "
                  f"{prior.dtype if isinstance(prior, torch.Tensor) else type(prior).__name__}")
        if prior.device != q.device:
            _fail(f"prior is on {prior.device} but q is on {q.device}; all inputs must share one device")
        heads = sorted({1, hkv, h})
        if prior.dim() != 3 or prior.shape[0] not in (1, b) or prior.shape[1] not in heads or prior.shape[2] != t:
            _fail(f"prior has shape {tuple(prior.shape)}; allowed: [{b} or 1, "
                  f"{' or '.join(map(str, heads))}, {t}] (one log-prior per key)")


def _prior_layout(prior, h, hkv):
    """(float32 prior, its strides with 0 on broadcast dims, P_DIV): the kernels read p[b, h // P_DIV, j]."""
    p = prior if prior.dtype == torch.float32 else prior.float()
    spb = p.stride(0) if p.shape[0] > 1 else 0
    if p.shape[1] == 1:
        sph, div = 0, 1
    elif p.shape[1] == h:  # one prior per query head (also the case h == hkv)
        sph, div = p.stride(1), 1
    else:  # one prior per K/V head, shared by the query heads of its group
        sph, div = p.stride(1), h // hkv
    return p, (spb, sph, p.stride(2)), div


class PriorAttention(torch.autograd.Function):
    """Autograd node of :func:`prior_attention`: the forward kernel, then the dK/dV/dp and dq kernels."""

    @staticmethod
    def forward(ctx, q, k, v, prior, scale, block_m, block_n):
        b, h, t, d = q.shape
        hkv = k.shape[1]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        block_m, block_n, block_d = block_sizes(_fail, q.device, block_m, block_n, d)
        has_prior = prior is not None
        if has_prior:
            p, p_strides, p_div = _prior_layout(prior, h, hkv)
        else:
            p, p_strides, p_div = q, (0, 0, 0), 1  # never read (HAS_PRIOR is off)
        o = torch.empty_like(q)
        lse2 = torch.empty((b, h, t), device=q.device, dtype=torch.float32)
        prec = precision(q.dtype)
        grid = (triton.cdiv(t, block_m), b * h)
        _forward_kernel[grid](q, k, v, p, o, lse2,
                              q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                              v.stride(0), v.stride(1), v.stride(2), *p_strides,
                              o.stride(0), o.stride(1), o.stride(2),
                              t, h, d, h // hkv, p_div, scale * LOG2E,
                              HAS_PRIOR=has_prior, PRECISION=prec,
                              BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, num_warps=4)
        ctx.save_for_backward(q, k, v, p if has_prior else None, o, lse2)
        ctx.meta = (scale, block_m, block_n, block_d, p_strides, p_div, prec,
                    tuple(prior.shape) if has_prior else None, prior.dtype if has_prior else None)
        return o

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, p, o, lse2 = ctx.saved_tensors
        scale, block_m, block_n, block_d, p_strides, p_div, prec, p_shape, p_dtype = ctx.meta
        b, h, t, d = q.shape
        hkv = k.shape[1]
        group = h // hkv
        do = grad_out.contiguous()
        delta = (o.float() * do.float()).sum(-1)  # delta_i = do_i . o_i = sum_j a_ij da_ij
        has_prior = p is not None
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dp_heads = torch.zeros((b, h, t), device=q.device, dtype=torch.float32) if has_prior else None
        p_arg = p if has_prior else q
        dp_arg = dp_heads if has_prior else lse2
        common = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                  v.stride(0), v.stride(1), v.stride(2), *p_strides, do.stride(0), do.stride(1), do.stride(2))
        constants = dict(HAS_PRIOR=has_prior, PRECISION=prec, BLOCK_M=block_m, BLOCK_N=block_n,
                         BLOCK_D=block_d, num_warps=4)
        _dkdv_kernel[(triton.cdiv(t, block_n), b * hkv)](q, k, v, p_arg, do, lse2, delta, dk, dv, dp_arg, *common,
                                                        t, hkv, d, group, p_div, scale, scale * LOG2E, **constants)
        _dq_kernel[(triton.cdiv(t, block_m), b * h)](q, k, v, p_arg, do, lse2, delta, dq, *common,
                                                    t, h, d, group, p_div, scale, scale * LOG2E, **constants)
        dp = None
        if has_prior and ctx.needs_input_grad[3]:
            if p_div > 1:  # one prior per K/V head: the query heads of a group share it
                dp_heads = dp_heads.view(b, hkv, group, t).sum(2)
            dp = dp_heads.sum_to_size(p_shape).to(p_dtype)
        return dq, dk, dv, dp, None, None, None


def prior_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, prior: torch.Tensor | None = None,
                    scale: float | None = None, *, block_m: int | None = None,
                    block_n: int | None = None) -> torch.Tensor:
    """Causal attention with a per-key log-prior: o_i = sum_{j <= i} softmax_j(q_i . k_j * scale + p_j) v_j.

    q [B, H, T, D]; k, v [B, Hkv, T, D] (Hkv divides H: GQA); prior [B or 1, 1 or Hkv or H, T] or None (plain causal
    attention); scale defaults to 1 / sqrt(D). Float16, bfloat16 or float32; the prior is read in float32 and its
    gradient returned in its own dtype. block_m / block_n: query / key rows per tile (powers of two, at least 16;
    64 on CUDA and 16 elsewhere by default). Runs on CUDA, or on the CPU under Triton's interpreter
    (TRITON_INTERPRET=1); :func:`attnlab.functional.kernels.available` says which. Differentiable in q, k, v and the prior.
    """
    _check(q, k, v, prior, scale)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if q.device.type != "cuda" and not available():
        _fail(f"inputs on {q.device} need a CUDA device or Triton's interpreter (TRITON_INTERPRET=1)")
    return PriorAttention.apply(q, k, v, prior, float(scale), block_m, block_n)
