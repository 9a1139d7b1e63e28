"""Causal attention with the low-rank prefix magnitude prior, as fused Triton kernels (forward and backward).

    o_i  = sum_{j <= i} a_ij v_j,   a_ij = softmax_j(s_ij)
    s_ij = q_i . k_j * scale + log max(M_ij, floor)
    M_ij = (1 - phi_j . c_i) / lambda_j

M_ij is key j's magnitude weight inside query i's prefix as the low-rank solver writes it
(:func:`attnlab.mechanisms.magnitude.lowrank.lowrank_prefix`: features phi [T, r], diagonal lambda [T] > 0, prefix
states c [T, r]); this is the logits form of :func:`attnlab.mechanisms.magnitude.prefix_blocks.lowrank_prefix_attention`
(its ``prior_floor``), with the same arguments in the same order. M is never stored: each [query block, key block]
tile builds it from one [block, r] x [r, block] product of c and phi beside the q k' product.

q [B, H, T, D]; k, v [B, Hkv, T, D] with H a multiple of Hkv (GQA: query head h reads K/V head h // (H / Hkv));
phi, c [Bf, Hf, T, r] and lambda [Bf, Hf, T] with Bf = B or 1 and Hf = 1, Hkv (one set of factors per K/V head, as
the layer computes them) or H; r from 1 to 64. The factors are read in float32 whatever the dtype of q, k, v, and
their product w = 1 - phi . c keeps float32's accuracy (IEEE, or TF32x3 for 16-bit inputs: common.factor_precision;
it can cancel, and TF32 would lose three digits of it).

No logarithm per score. With w_ij = 1 - phi_j . c_i = lambda_j M_ij and z_ij = q_i . k_j * scale,

    exp(z_ij + log max(M_ij, floor)) = exp(z_ij - log lambda_j) max(w_ij, floor lambda_j)

so each tile takes one exp per score, as flash attention does: the log is per key (log lambda_j), the floor a
per-key threshold on w, and the online softmax carries the weight max(w, floor lambda) on its exponentials
(common.online_softmax_weighted_step). Its running maximum is over z - log lambda alone; since every weight is at
least floor lambda_j, the row's sum is too, and each backward exp(z_ij - log lambda_j - lse_i) at most
1 / (floor lambda_j): float32 holds both while floor lambda_j stays above about 1e-30 (the layers: floor 1e-4,
lambda >= eps). The row's log-sum-exp lse_i is the same number as with the log prior.

Gradients (base e; Triton's tiles use base 2 inside, s2 = s * log2(e)). With delta_i = do_i . o_i,
e_ij = exp(z_ij - lse_i) / lambda_j and a_ij = e_ij max(w_ij, floor lambda_j) (the attention weights):

    dv_j = sum_i a_ij do_i,   dS_ij = a_ij (do_i . v_j - delta_i)
    dq_i = scale sum_j dS_ij k_j,   dk_j = scale sum_i dS_ij q_i
    dM_ij = dS_ij / M_ij where M_ij >= floor, 0 below it (log max(M, floor) is flat there)
    G_ij = dM_ij / lambda_j = dS_ij / w_ij = e_ij (do_i . v_j - delta_i)  (where w_ij >= floor lambda_j; no division)
    dc_i = -sum_j G_ij phi_j,   dphi_j = -sum_i G_ij c_i
    dlambda_j = -sum_i dM_ij M_ij / lambda_j = -(1 / lambda_j) sum_{i: M_ij >= floor} dS_ij

The products of the factor gradients (G c, G phi) take the input precision of q, k, v's products: IEEE for float32,
TF32 for 16-bit inputs, whose rounding (2^-11) is no coarser than the 16-bit rounding of dS that dq and dk carry.

Structure: as :mod:`.perkey` (the shared pieces are in :mod:`.common`). The forward walks the key blocks of each query
block with an online softmax and saves the row log-sum-exp. One backward kernel per key block accumulates dk, dv,
dphi and dlambda over the query blocks and the query heads sharing its K/V head (no atomics); one per query block
accumulates dq and dc over the key blocks. Where a backward kernel needs a tile both ways it loads it twice (the
sm_90 compiler spills more registers with tl.trans of one load: the speed page). Memory
besides inputs and outputs: O(B H T r) (the log-sum-exp, delta_i, and the factor gradients per query head before
they are summed to the factors' shapes).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from . import available
from ...switches import MAGNITUDE_GATES as GATES  # the value gates of attnlab.mechanisms.magnitude.reference.gate
from .common import (LOG2E, backward_tiles, block_sizes, check_qkv, factor_precision, load_tile, load_tile_t,
                     online_softmax_gated_step, online_softmax_weighted_step, precision)

__all__ = ["BACKWARD_WARPS", "CUDA_BACKWARD_BLOCKS", "GATES", "LowrankPrefixAttention", "MAX_RANK",
           "lowrank_gate_attention", "lowrank_prior_attention"]

MAX_RANK = 64
_GATE_CODE = {"clamp": 1, "sigmoid": 2, "linear": 3}  # the kernels' GATE; 0 is the logit prior
CUDA_BACKWARD_BLOCKS = (64, 32)
"""The backward kernels' (outer, inner) tiles on CUDA when backward_blocks is None: the fastest of the tiles that
``benchmarks/kernels.py --lowrank-backward-blocks`` timed on an H100 at every length (the speed page), where the
forward's 64 x 64 left both backward kernels spilling registers."""
BACKWARD_WARPS = 4
"""Warps per program of the two backward kernels: with 8 the (64, 32) tiles stop spilling registers, yet they ran
slower on an H100 (the speed page)."""


@triton.jit
def _weight_tile(c, phi_t, FACTORS: tl.constexpr):
    """w_ij = 1 - c_i . phi_j of one tile (c [rows, r], phi_t [r, cols]) in FACTORS, the products' input precision
    (common.factor_precision): M_ij = w_ij / lambda_j."""
    return 1.0 - tl.dot(c, phi_t, input_precision=FACTORS)


@triton.jit
def _gate_tile(m, beta, gamma, GATE: tl.constexpr):
    """(g, x, dg/du, dx/dM) of one tile for the value gate GATE (1 clamp, 2 sigmoid, 3 linear): u = beta x + gamma
    with x = clamp(M, 0, 1) (clamp) or M; g = sigmoid(u) (clamp, sigmoid) or clamp(u, 0, 1) (linear)."""
    if GATE == 1:
        x = tl.minimum(tl.maximum(m, 0.0), 1.0)
        passes = tl.where((m >= 0.0) & (m <= 1.0), 1.0, 0.0)  # where the clamp passes dM
    else:
        x = m
        passes = tl.full(m.shape, 1.0, tl.float32)
    u = beta * x + gamma
    if GATE == 3:
        g = tl.minimum(tl.maximum(u, 0.0), 1.0)
        slope = tl.where((u >= 0.0) & (u <= 1.0), 1.0, 0.0)  # clamp(u, 0, 1)' (flat outside [0, 1])
    else:
        g = tl.sigmoid(u)
        slope = g * (1.0 - g)  # sigmoid' = g (1 - g)
    return g, x, slope, passes


@triton.jit
def _forward_kernel(Q, K, V, C, PHI, LAM, BG, O, LSE2,
                    sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sfb, sfh, slb, slh, sob, soh, sot,
                    T, H, D, R, GROUP, F_DIV, qk_scale2, floor,
                    GATE: tl.constexpr, PRECISION: tl.constexpr, FACTORS: tl.constexpr, BLOCK_M: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP  # the K/V head this query head reads
    hf = h // F_DIV  # the factors' head (stride 0 when one set serves every head)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R)
    row_ok = offs_m < T
    d_ok = offs_d < D
    r_ok = offs_r < R
    q = load_tile(Q + b * sqb + h * sqh, offs_m, sqt, offs_d, row_ok, d_ok)
    f_base = b * sfb + hf * sfh
    # [BLOCK_M, BLOCK_R], zero beyond r: the padding adds nothing to c_i . phi_j
    c = load_tile(C + f_base, offs_m, R, offs_r, row_ok, r_ok)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    lam_base = LAM + b * slb + hf * slh
    beta = tl.load(BG)  # the value gate's beta and gamma (unused by the prior, GATE = 0)
    gamma = tl.load(BG + 1)
    # x_ij = s2_ij - log2 lambda_j (the prior) or s2_ij (a gate); m_i their running row maximum, l_i the running
    # sum_j exp2(x_ij - m_i) max(w_ij, f lambda_j) (the prior) or sum_j exp2(x_ij - m_i) (a gate), acc the running
    # sum of the prior's terms times v_j, or of the gate's times g_ij v_j
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)  # causal: no key after the block's last query
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < T
        k_t = load_tile_t(k_base, offs_n, skt, offs_d, col_ok, d_ok)  # [BLOCK_D, BLOCK_N]
        v = load_tile(v_base, offs_n, svt, offs_d, col_ok, d_ok)
        phi_t = load_tile_t(PHI + f_base, offs_n, R, offs_r, col_ok, r_ok)  # [BLOCK_R, BLOCK_N]
        lam = tl.load(lam_base + offs_n, mask=col_ok, other=1.0)
        w = _weight_tile(c, phi_t, FACTORS)  # w_ij = 1 - c_i . phi_j = lambda_j M_ij
        s2 = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale2  # z_ij log2 e, z_ij = scale q_i . k_j
        keep = (offs_n[None, :] <= offs_m[:, None]) & col_ok[None, :]  # j <= i, j < T
        if GATE == 0:  # exp(z_ij + log max(M_ij, f)) = exp(z_ij - log lambda_j) max(w_ij, f lambda_j)
            m_i, l_i, acc = online_softmax_weighted_step(
                tl.where(keep, s2 - tl.log2(lam)[None, :], float("-inf")),
                tl.maximum(w, (floor * lam)[None, :]), m_i, l_i, acc, v, PRECISION)
        else:  # softmax_j(s q_i . k_j) g(M_ij) v_j
            g, _, _, _ = _gate_tile(w * (1.0 / lam)[None, :], beta, gamma, GATE)
            m_i, l_i, acc = online_softmax_gated_step(tl.where(keep, s2, float("-inf")), g, m_i, l_i, acc, v,
                                                      PRECISION)
    out = acc / l_i[:, None]  # o_i = sum_j a_ij (g_ij) v_j
    tl.store(O + b * sob + h * soh + offs_m[:, None] * sot + offs_d[None, :], out.to(O.dtype.element_ty),
             mask=row_ok[:, None] & d_ok[None, :])
    tl.store(LSE2 + pid_bh * T + offs_m, m_i + tl.log2(l_i), mask=row_ok)  # lse2_i = log2 of the row's normaliser


@triton.jit
def _dkdv_kernel(Q, K, V, C, PHI, LAM, BG, DO, LSE2, DELTA, DK, DV, DPHI, DLAM,
                 sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sfb, sfh, slb, slh, sdb, sdh, sdt,
                 T, HKV, D, R, GROUP, F_DIV, scale, qk_scale2, floor,
                 GATE: tl.constexpr, PRECISION: tl.constexpr, FACTORS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    # One program per (key block, batch, K/V head). Tiles are transposed, [key j, query i]. dk_j and dv_j sum over
    # the group's query heads in registers; dphi_j and dlambda_j are stored per query head (summed outside).
    pid_n = tl.program_id(0)
    pid_bk = tl.program_id(1)
    b = pid_bk // HKV
    hk = pid_bk % HKV
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R)
    col_ok = offs_n < T
    d_ok = offs_d < D
    r_ok = offs_r < R
    kv_mask = col_ok[:, None] & d_ok[None, :]
    k = load_tile(K + b * skb + hk * skh, offs_n, skt, offs_d, col_ok, d_ok)
    v = load_tile(V + b * svb + hk * svh, offs_n, svt, offs_d, col_ok, d_ok)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    beta = tl.load(BG)
    gamma = tl.load(BG + 1)
    lo = (pid_n * BLOCK_N // BLOCK_M) * BLOCK_M  # causal: no query block before the one holding key pid_n*BLOCK_N
    for member in range(0, GROUP):
        h = hk * GROUP + member
        bh = b * HKV * GROUP + h
        f_base = b * sfb + (h // F_DIV) * sfh
        phi = load_tile(PHI + f_base, offs_n, R, offs_r, col_ok, r_ok)  # [BLOCK_N, BLOCK_R]
        lam = tl.load(LAM + b * slb + (h // F_DIV) * slh + offs_n, mask=col_ok, other=1.0)
        shift2 = tl.log2(lam)  # the prior's log2 lambda_j (GATE = 0)
        floor_lam = floor * lam  # M_ij >= f  <=>  w_ij >= f lambda_j
        dphi = tl.zeros([BLOCK_N, BLOCK_R], dtype=tl.float32)  # -sum_i G_ij c_i (the gate: times lambda_j)
        dlam = tl.zeros([BLOCK_N], dtype=tl.float32)  # sum_i dM_ij M_ij
        for start_m in range(lo, T, BLOCK_M):
            offs_m = start_m + tl.arange(0, BLOCK_M)
            row_ok = offs_m < T
            q = load_tile(Q + b * sqb + h * sqh, offs_m, sqt, offs_d, row_ok, d_ok)
            do = load_tile(DO + b * sdb + h * sdh, offs_m, sdt, offs_d, row_ok, d_ok)
            c = load_tile(C + f_base, offs_m, R, offs_r, row_ok, r_ok)  # [BLOCK_M, BLOCK_R]
            lse2 = tl.load(LSE2 + bh * T + offs_m, mask=row_ok, other=0.0)
            delta = tl.load(DELTA + bh * T + offs_m, mask=row_ok, other=0.0)
            c_t = load_tile_t(C + f_base, offs_m, R, offs_r, row_ok, r_ok)  # [BLOCK_R, BLOCK_M]
            q_t = load_tile_t(Q + b * sqb + h * sqh, offs_m, sqt, offs_d, row_ok, d_ok)  # [BLOCK_D, BLOCK_M]
            do_t = load_tile_t(DO + b * sdb + h * sdh, offs_m, sdt, offs_d, row_ok, d_ok)
            w_t = _weight_tile(phi, c_t, FACTORS)  # w_ij at [j, i]
            s2_t = tl.dot(k, q_t, input_precision=PRECISION) * qk_scale2
            keep = (offs_n[:, None] <= offs_m[None, :]) & col_ok[:, None] & row_ok[None, :]
            if GATE == 0:
                # e_ij = exp(z_ij - lse_i) / lambda_j, z_ij = scale q_i . k_j; a_ij = e_ij max(w_ij, f lambda_j)
                e_t = tl.where(keep, tl.exp2(s2_t - shift2[:, None] - lse2[None, :]), 0.0)
                above = w_t >= floor_lam[:, None]  # where the prior is log M_ij (it is flat below the floor)
                wf_t = tl.maximum(w_t, floor_lam[:, None])
                dv += tl.dot((e_t * wf_t).to(do.dtype), do, input_precision=PRECISION)  # dv_j = sum_i a_ij do_i
                da_t = tl.dot(v, do_t, input_precision=PRECISION)  # da_ij = do_i . v_j
                ed_t = e_t * (da_t - delta[None, :])  # e_ij (da_ij - delta_i), delta_i = do_i . o_i
                ds_t = ed_t * wf_t  # dS_ij = a_ij (da_ij - delta_i)
                big_g_t = tl.where(above, ed_t, 0.0)  # G_ij = dS_ij / w_ij = e_ij (da_ij - delta_i)
                dmm_t = tl.where(above, ds_t, 0.0)  # dM_ij M_ij
            else:
                da_t = tl.dot(v, do_t, input_precision=PRECISION)  # da_ij = do_i . v_j
                m_t = w_t * (1.0 / lam)[:, None]  # M_ij = w_ij / lambda_j (one reciprocal per key)
                a_t = tl.where(keep, tl.exp2(s2_t - lse2[None, :]), 0.0)  # p_ij = exp(s_ij - lse_i)
                g_t, _, slope_t, passes_t = _gate_tile(m_t, beta, gamma, GATE)
                dv += tl.dot((a_t * g_t).to(do.dtype), do, input_precision=PRECISION)  # dv_j = sum_i p_ij g_ij do_i
                ds_t = a_t * (g_t * da_t - delta[None, :])  # dS_ij = p_ij (g_ij da_ij - delta_i)
                dm_t = a_t * da_t * slope_t * beta * passes_t  # dM_ij = p_ij da_ij g'(u_ij) beta [x passes M]
                big_g_t = dm_t  # lambda_j G_ij = dM_ij (divided by lambda_j once, at the store)
                dmm_t = dm_t * m_t
            dk += tl.dot(ds_t.to(q.dtype), q, input_precision=PRECISION)  # dk_j = scale sum_i dS_ij q_i
            dphi -= tl.dot(big_g_t, c, input_precision=PRECISION)  # dphi_j = -sum_i G_ij c_i
            dlam += tl.sum(dmm_t, 1)
        fh = bh * T  # per-query-head gradient buffers [B, H, T(, R)], contiguous
        if GATE != 0:
            dphi = dphi / lam[:, None]
        tl.store(DPHI + (fh + offs_n[:, None]) * R + offs_r[None, :], dphi, mask=col_ok[:, None] & r_ok[None, :])
        tl.store(DLAM + fh + offs_n, -dlam / lam, mask=col_ok)  # dlambda_j = -(1/lambda_j) sum_i dM_ij M_ij
    tl.store(DK + pid_bk * T * D + offs_n[:, None] * D + offs_d[None, :], (dk * scale).to(DK.dtype.element_ty),
             mask=kv_mask)
    tl.store(DV + pid_bk * T * D + offs_n[:, None] * D + offs_d[None, :], dv.to(DV.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_kernel(Q, K, V, C, PHI, LAM, BG, DO, LSE2, DELTA, DQ, DC, DBETA, DGAMMA,
               sqb, sqh, sqt, skb, skh, skt, svb, svh, svt, sfb, sfh, slb, slh, sdb, sdh, sdt,
               T, H, D, R, GROUP, F_DIV, scale, qk_scale2, floor,
               GATE: tl.constexpr, PRECISION: tl.constexpr, FACTORS: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_bh = tl.program_id(1)
    b = pid_bh // H
    h = pid_bh % H
    hk = h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    offs_r = tl.arange(0, BLOCK_R)
    row_ok = offs_m < T
    d_ok = offs_d < D
    r_ok = offs_r < R
    q_mask = row_ok[:, None] & d_ok[None, :]
    c_mask = row_ok[:, None] & r_ok[None, :]
    f_base = b * sfb + (h // F_DIV) * sfh
    q = load_tile(Q + b * sqb + h * sqh, offs_m, sqt, offs_d, row_ok, d_ok)
    do = load_tile(DO + b * sdb + h * sdh, offs_m, sdt, offs_d, row_ok, d_ok)
    c = load_tile(C + f_base, offs_m, R, offs_r, row_ok, r_ok)
    lse2 = tl.load(LSE2 + pid_bh * T + offs_m, mask=row_ok, other=0.0)
    delta = tl.load(DELTA + pid_bh * T + offs_m, mask=row_ok, other=0.0)
    k_base = K + b * skb + hk * skh
    v_base = V + b * svb + hk * svh
    lam_base = LAM + b * slb + (h // F_DIV) * slh
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    dc = tl.zeros([BLOCK_M, BLOCK_R], dtype=tl.float32)
    beta = tl.load(BG)
    gamma = tl.load(BG + 1)
    dbeta = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum_j dL/du_ij x_ij of query i (the value gate only)
    dgamma = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum_j dL/du_ij
    hi = tl.minimum((pid_m + 1) * BLOCK_M, T)
    for start_n in range(0, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < T
        k = load_tile(k_base, offs_n, skt, offs_d, col_ok, d_ok)
        phi = load_tile(PHI + f_base, offs_n, R, offs_r, col_ok, r_ok)  # [BLOCK_N, BLOCK_R]
        lam = tl.load(lam_base + offs_n, mask=col_ok, other=1.0)
        phi_t = load_tile_t(PHI + f_base, offs_n, R, offs_r, col_ok, r_ok)  # [BLOCK_R, BLOCK_N]
        k_t = load_tile_t(k_base, offs_n, skt, offs_d, col_ok, d_ok)  # [BLOCK_D, BLOCK_N]
        v_t = load_tile_t(v_base, offs_n, svt, offs_d, col_ok, d_ok)
        w = _weight_tile(c, phi_t, FACTORS)  # w_ij = 1 - c_i . phi_j
        s2 = tl.dot(q, k_t, input_precision=PRECISION) * qk_scale2
        keep = (offs_n[None, :] <= offs_m[:, None]) & col_ok[None, :] & row_ok[:, None]
        da = tl.dot(do, v_t, input_precision=PRECISION)  # da_ij = do_i . v_j
        if GATE == 0:
            floor_lam = (floor * lam)[None, :]
            # e_ij = exp(z_ij - lse_i) / lambda_j, z_ij = scale q_i . k_j; a_ij = e_ij max(w_ij, f lambda_j)
            e = tl.where(keep, tl.exp2(s2 - tl.log2(lam)[None, :] - lse2[:, None]), 0.0)
            ed = e * (da - delta[:, None])  # e_ij (da_ij - delta_i)
            ds = ed * tl.maximum(w, floor_lam)  # dS_ij = a_ij (da_ij - delta_i)
            big_g = tl.where(w >= floor_lam, ed, 0.0)  # G_ij = dS_ij / w_ij = e_ij (da_ij - delta_i)
            g_phi = phi
        else:
            a = tl.where(keep, tl.exp2(s2 - lse2[:, None]), 0.0)  # p_ij = exp(s_ij - lse_i)
            g, x, slope, passes = _gate_tile(w * (1.0 / lam)[None, :], beta, gamma, GATE)
            ds = a * (g * da - delta[:, None])  # dS_ij = p_ij (g_ij da_ij - delta_i)
            du = a * da * slope  # dL/du_ij = p_ij da_ij g'(u_ij)
            dbeta += tl.sum(du * x, 1)
            dgamma += tl.sum(du, 1)
            big_g = du * beta * passes  # lambda_j G_ij = dM_ij
            g_phi = phi / lam[:, None]  # (lambda_j G_ij) (phi_j / lambda_j) = G_ij phi_j
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PRECISION)  # dq_i = scale sum_j dS_ij k_j
        dc -= tl.dot(big_g, g_phi, input_precision=PRECISION)  # dc_i = -sum_j G_ij phi_j
    tl.store(DQ + pid_bh * T * D + offs_m[:, None] * D + offs_d[None, :], (dq * scale).to(DQ.dtype.element_ty),
             mask=q_mask)
    tl.store(DC + (pid_bh * T + offs_m[:, None]) * R + offs_r[None, :], dc, mask=c_mask)
    if GATE != 0:  # per (b, h, i) [B, H, T], summed outside
        tl.store(DBETA + pid_bh * T + offs_m, dbeta, mask=row_ok)
        tl.store(DGAMMA + pid_bh * T + offs_m, dgamma, mask=row_ok)


def _failing(name: str):
    """A function that raises a one-line ValueError prefixed with the public function's name."""
    def fail(message: str):
        raise ValueError(f"{name}: {message}")
    return fail


_fail = _failing("lowrank_prior_attention")


def _shape(x):
    return tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


def _check(q, k, v, phi, lam, c, scale, prior_floor, block_m, block_n, backward_blocks, fail=_fail):
    """One-line ValueErrors (through ``fail``) for shapes, dtypes, devices, floors and blocks the kernels do not
    take."""
    check_qkv(fail, q, k, v, scale)
    for name, x, dims in (("phi", phi, "[B, H, T, r]"), ("lam", lam, "[B, H, T]"), ("c", c, "[B, H, T, r]")):
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            fail(f"{name} must be a floating-point tensor {dims}, got "
                  f"{x.dtype if isinstance(x, torch.Tensor) else type(x).__name__}")
    for name, x in (("phi", phi), ("lam", lam), ("c", c)):
        if x.device != q.device:
            fail(f"{name} is on {x.device} but q is on {q.device}; all inputs must share one device")
    for name, x in (("phi", phi), ("c", c)):
        if x.numel() >= 2**31:
            fail(f"{name} has {x.numel()} elements; allowed: fewer than 2**31 (the kernels index in 32 bits)")
    b, h, t, _ = q.shape
    hkv = k.shape[1]
    heads = " or ".join(map(str, sorted({1, hkv, h})))
    if phi.dim() != 4 or phi.shape[0] not in (1, b) or phi.shape[1] not in (1, hkv, h) or phi.shape[2] != t:
        fail(f"phi has shape {tuple(phi.shape)}; allowed: [{b} or 1, {heads}, {t}, r]")
    r = phi.shape[3]
    if not 1 <= r <= MAX_RANK:
        fail(f"rank {r} (phi's last dimension); allowed: 1 to {MAX_RANK}")
    if tuple(c.shape) != tuple(phi.shape):
        fail(f"c has shape {tuple(c.shape)}; allowed: the shape of phi, {tuple(phi.shape)}")
    if tuple(lam.shape) != tuple(phi.shape[:3]):
        fail(f"lam has shape {tuple(lam.shape)}; allowed: phi's shape without its rank, {tuple(phi.shape[:3])}")
    if not (isinstance(prior_floor, (int, float)) and math.isfinite(prior_floor) and prior_floor > 0):
        fail(f"prior_floor={prior_floor!r}; allowed: a finite number > 0 (the prior is log max(M, prior_floor))")
    backward_tiles(fail, backward_blocks, *block_sizes(fail, q.device, block_m, block_n))


def _factor_layout(phi, lam, c, h, hkv):
    """(phi, lam, c as contiguous float32, (sfb, sfh, slb, slh) with 0 on broadcast dims, F_DIV): the kernels read
    phi[b, h // F_DIV, j], c[b, h // F_DIV, i], lam[b, h // F_DIV, j]."""
    phi, lam, c = (x.to(torch.float32).contiguous() for x in (phi, lam, c))
    bf, hf, t, r = phi.shape
    sfb, slb = (hf * t * r, hf * t) if bf > 1 else (0, 0)
    sfh, slh = (t * r, t) if hf > 1 else (0, 0)
    div = h // hkv if 1 < hf < h else 1  # one set per K/V head, shared by the query heads of its group
    return phi, lam, c, (sfb, sfh, slb, slh), div


def _per_head_to(grad, shape, dtype, hkv, group, div):
    """A factor gradient per query head [B, H, T(, r)] summed to the factor's shape."""
    if div > 1:  # one set per K/V head: the query heads of a group share it
        grad = grad.view(grad.shape[0], hkv, group, *grad.shape[2:]).sum(2)
    return grad.sum_to_size(shape).to(dtype)


class LowrankPrefixAttention(torch.autograd.Function):
    """Autograd node of :func:`lowrank_prior_attention` (gate 0) and :func:`lowrank_gate_attention` (gate 1, 2, 3:
    clamp, sigmoid, linear): the forward kernel, then the dK/dV/dphi/dlambda and dq/dc(/dbeta/dgamma) kernels.
    beta, gamma: 0-d tensors (unused by the prior)."""

    @staticmethod
    def forward(ctx, q, k, v, phi, lam, c, beta, gamma, scale, floor, gate, block_m, block_n, backward_blocks):
        b, h, t, d = q.shape
        hkv = k.shape[1]
        r = phi.shape[-1]
        shapes = [(tuple(x.shape), x.dtype) for x in (phi, lam, c, beta, gamma)]
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        block_m, block_n, block_d, block_r = block_sizes(_fail, q.device, block_m, block_n, d, r)
        phi, lam, c, f_strides, f_div = _factor_layout(phi, lam, c, h, hkv)
        bg = torch.stack([beta.reshape(()), gamma.reshape(())]).to(q.device, torch.float32).contiguous()
        o = torch.empty_like(q)
        lse2 = torch.empty((b, h, t), device=q.device, dtype=torch.float32)
        prec = (precision(q.dtype), factor_precision(q.dtype))  # (q/k/v products, the factors' products)
        grid = (triton.cdiv(t, block_m), b * h)
        _forward_kernel[grid](q, k, v, c, phi, lam, bg, o, lse2,
                              q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                              v.stride(0), v.stride(1), v.stride(2), *f_strides,
                              o.stride(0), o.stride(1), o.stride(2),
                              t, h, d, r, h // hkv, f_div, scale * LOG2E, floor,
                              GATE=gate, PRECISION=prec[0], FACTORS=prec[1], BLOCK_M=block_m, BLOCK_N=block_n,
                              BLOCK_D=block_d, BLOCK_R=block_r, num_warps=4)
        ctx.save_for_backward(q, k, v, phi, lam, c, bg, o, lse2)
        if backward_blocks is None and q.is_cuda:
            backward_blocks = CUDA_BACKWARD_BLOCKS
        tiles = backward_tiles(_fail, backward_blocks, block_m, block_n)  # (dK/dV, dq) kernels' (BLOCK_M, BLOCK_N)
        ctx.meta = (scale, floor, gate, tiles, block_d, block_r, f_strides, f_div, prec, shapes)
        return o

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, phi, lam, c, bg, o, lse2 = ctx.saved_tensors
        scale, floor, gate, tiles, block_d, block_r, f_strides, f_div, prec, shapes = ctx.meta
        (dkdv_m, dkdv_n), (dq_m, dq_n) = tiles
        b, h, t, d = q.shape
        hkv = k.shape[1]
        r = phi.shape[-1]
        group = h // hkv
        do = grad_out.contiguous()
        delta = (o.float() * do.float()).sum(-1)  # delta_i = do_i . o_i = sum_j p_ij (g_ij) da_ij
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dphi = torch.empty((b, h, t, r), device=q.device, dtype=torch.float32)  # per query head
        dlam = torch.empty((b, h, t), device=q.device, dtype=torch.float32)
        dc = torch.empty((b, h, t, r), device=q.device, dtype=torch.float32)
        dbeta, dgamma = (torch.zeros((b, h, t), device=q.device, dtype=torch.float32) for _ in range(2))
        common = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                  v.stride(0), v.stride(1), v.stride(2), *f_strides, do.stride(0), do.stride(1), do.stride(2))
        constants = dict(GATE=gate, PRECISION=prec[0], FACTORS=prec[1], BLOCK_D=block_d, BLOCK_R=block_r,
                         num_warps=BACKWARD_WARPS)
        _dkdv_kernel[(triton.cdiv(t, dkdv_n), b * hkv)](q, k, v, c, phi, lam, bg, do, lse2, delta, dk, dv, dphi,
                                                       dlam, *common, t, hkv, d, r, group, f_div, scale,
                                                       scale * LOG2E, floor, BLOCK_M=dkdv_m, BLOCK_N=dkdv_n,
                                                       **constants)
        _dq_kernel[(triton.cdiv(t, dq_m), b * h)](q, k, v, c, phi, lam, bg, do, lse2, delta, dq, dc, dbeta, dgamma,
                                                 *common, t, h, d, r, group, f_div, scale, scale * LOG2E, floor,
                                                 BLOCK_M=dq_m, BLOCK_N=dq_n, **constants)
        grads = [_per_head_to(g, shape, dtype, hkv, group, f_div) if need else None
                 for g, (shape, dtype), need in zip((dphi, dlam, dc), shapes, ctx.needs_input_grad[3:6])]
        gate_grads = [g.sum().reshape(shape).to(dtype) if need and gate else None
                      for g, (shape, dtype), need in zip((dbeta, dgamma), shapes[3:], ctx.needs_input_grad[6:8])]
        return dq, dk, dv, *grads, *gate_grads, None, None, None, None, None, None


def _run(fail, q, k, v, phi, lam, c, beta, gamma, scale, floor, gate, block_m, block_n, backward_blocks):
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    if q.device.type != "cuda" and not available():
        fail(f"inputs on {q.device} need a CUDA device or Triton's interpreter (TRITON_INTERPRET=1)")
    beta, gamma = (x if isinstance(x, torch.Tensor) else torch.tensor(float(x), device=q.device) for x in (beta, gamma))
    return LowrankPrefixAttention.apply(q, k, v, phi, lam, c, beta, gamma, float(scale), float(floor), gate, block_m,
                                        block_n, backward_blocks)


def lowrank_prior_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, phi: torch.Tensor,
                            lam: torch.Tensor, c: torch.Tensor, *, prior_floor: float, scale: float | None = None,
                            block_m: int | None = None, block_n: int | None = None,
                            backward_blocks: tuple[int, int] | None = None) -> torch.Tensor:
    """Causal attention with the low-rank prefix prior: o_i = sum_{j <= i} softmax_j(q_i . k_j * scale +
    log max(M_ij, prior_floor)) v_j with M_ij = (1 - phi_j . c_i) / lam_j.

    The same function as ``lowrank_prefix_attention(q, k, v, phi, lam, c, scale=scale, prior_floor=prior_floor)``
    (:mod:`attnlab.mechanisms.magnitude.prefix_blocks`), without repeating K/V or the factors to H heads.
    q [B, H, T, D]; k, v [B, Hkv, T, D] (Hkv divides H: GQA); phi, c [B or 1, 1 or Hkv or H, T, r] and lam [the
    same, T] > 0 (one set of factors per K/V head when they have Hkv heads), r from 1 to 64; prior_floor > 0;
    scale defaults to 1 / sqrt(D). q, k, v in float16, bfloat16 or float32; the factors are read in float32 and
    their gradients returned in their own dtypes. block_m / block_n: query / key rows per tile (powers of two, at
    least 16; 64 on CUDA and 16 elsewhere by default). backward_blocks: (outer, inner) tiles of the backward kernels
    (the dK/dV kernel owns `outer` keys and steps over `inner` queries, the dq kernel the reverse;
    :func:`.common.backward_tiles`), or None: :data:`CUDA_BACKWARD_BLOCKS` on CUDA, block_m x block_n elsewhere. Runs on CUDA, or on the CPU under Triton's
    interpreter (TRITON_INTERPRET=1); :func:`attnlab.functional.kernels.available` says which. Differentiable in q,
    k, v, phi, lam and c.
    """
    _check(q, k, v, phi, lam, c, scale, prior_floor, block_m, block_n, backward_blocks)
    zero = torch.zeros((), device=q.device)
    return _run(_fail, q, k, v, phi, lam, c, zero, zero, scale, prior_floor, 0, block_m, block_n, backward_blocks)


def lowrank_gate_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, phi: torch.Tensor, lam: torch.Tensor,
                           c: torch.Tensor, beta: float | torch.Tensor = 1.0, gamma: float | torch.Tensor = 0.0, *,
                           gate: str = "clamp", scale: float | None = None, block_m: int | None = None,
                           block_n: int | None = None,
                           backward_blocks: tuple[int, int] | None = None) -> torch.Tensor:
    """Causal attention with the low-rank prefix value gate: o_i = sum_{j <= i} softmax_j(q_i . k_j * scale)
    g(M_ij) v_j with M_ij = (1 - phi_j . c_i) / lam_j and g one of :data:`GATES`:

        clamp:   sigmoid(beta clamp(M, 0, 1) + gamma)
        sigmoid: sigmoid(beta M + gamma)
        linear:  clamp(beta M + gamma, 0, 1)

    (:func:`attnlab.mechanisms.magnitude.reference.gate`). The same function as ``lowrank_prefix_attention(q, k, v,
    phi, lam, c, beta, gamma, gate=gate, scale=scale)`` (:mod:`attnlab.mechanisms.magnitude.prefix_blocks`), with
    the same arguments in the same order, without repeating K/V or the factors to H heads. The gate multiplies the
    values inside the online softmax (the normaliser sums the ungated exponentials), so the flash structure holds:
    one more [block, block] elementwise product per tile. beta, gamma: numbers or 0-d tensors (differentiable,
    gradients returned in their dtypes). Shapes, dtypes, blocks and devices as :func:`lowrank_prior_attention`.
    Differentiable in q, k, v, phi, lam, c, beta and gamma.
    """
    fail = _failing("lowrank_gate_attention")
    _check(q, k, v, phi, lam, c, scale, 1.0, block_m, block_n, backward_blocks, fail)
    if gate not in GATES:
        fail(f"gate={gate!r}; allowed: {', '.join(map(repr, GATES))}")
    for name, x in (("beta", beta), ("gamma", gamma)):
        value = x.detach() if isinstance(x, torch.Tensor) else x
        if isinstance(value, torch.Tensor) and (value.numel() != 1 or not value.is_floating_point()):
            fail(f"{name} has shape {tuple(value.shape)} and dtype {value.dtype}; allowed: a number or a "
                  f"one-element float tensor")
        if not isinstance(value, torch.Tensor) and not (isinstance(value, (int, float)) and math.isfinite(value)):
            fail(f"{name}={value!r}; allowed: a finite number")  # (a tensor is not read here: no device sync)
    return _run(fail, q, k, v, phi, lam, c, beta, gamma, scale, 1.0, _GATE_CODE[gate], block_m, block_n,
                backward_blocks)
