"""The fused magnitude path behind :class:`attnlab.mechanisms.magnitude.MagnitudeGate`: keys -> magnitude weights in one autograd
node with hand-derived gradients (Magnitude Attention write-up; Gaussian kernel only).

It computes the same numbers as the reference math in :mod:`attnlab.mechanisms.magnitude.reference` (similarity + tikhonov
+ solve_weights / prefix_factor / *_from_factor; tests/test_magnitude_attention.py compares them in float64,
gradients included), faster: see the notes below and the magnitude page of the docs (docs/magnitude.md, "the fast
kernel").
"""

from __future__ import annotations

import contextlib
import functools
import math

import torch

from .reference import CAUSAL_FORMS, FORMS, SOLVERS, SolveInfo, batched_dot, cg_trace, cholesky_jitter, eye_like
from .reference import lowrank_solve, relative_residual, vecmat
from .lowrank import CHUNK, prefix_weight_matrix_lowrank

__all__ = ["BLOCK", "CHUNK_BYTES", "DEVICE_CHUNK_BYTES", "full_precision_backward", "ieee_float32",
           "inverse_cholesky", "gaussian_key_weights", "lowrank_key_weights",
           "lowrank_prefix_factors"]

# ------------------------------------------------------------------- the gate's fast path (Gaussian kernel, fused)
#
# What MagnitudeGate needs, keys -> weights, as one autograd node with hand-derived gradients. The same math as
# similarity + tikhonov + solve_weights / prefix_factor / *_from_factor (tests/test_magnitude_attention.py compares
# them in float64, gradients included); what changes is how it is computed:
#   Z        one batched matmul of augmented keys, [s x_j, 1, s^2 |x_j|^2] . [2 s x_l, -s^2 |x_l|^2, -1]
#            = -t ||x_j - x_l||^2 / d with s = sqrt(t / d), the keys centred on key 1 (smaller norms, less
#            cancellation); clamped at 0 (rounding near duplicates) and exponentiated in place; diagonal 1 + eps.
#   L^-1     G = L^-1 by recursion on halves (Cholesky of the leading half, Schur complement, triangular inverses):
#            batched matmuls, LAPACK only on BLOCK x BLOCK diagonal blocks, cholesky_ex (no exception, no sync unless
#            a factorisation failed; then cholesky_jitter's causal retry). Row i of G depends on keys 1..i only.
#   weights  y = G 1;  global mu = G'y;  causal w_j = y_j G_jj (= y_j / L_jj);  prefix M = cumsum over rows of
#            diag(y) G (by blocks of rows: torch.cumsum over rows is slow on CPU).
#   backward implicit differentiation of Z_i mu^(i) = 1 on every prefix i (Z_i^-1 = G_i' G_i), not through the
#            factorisation: causal dA = -G' diag(gw o diag G) M; prefix dA = -(tril(gM G') G)' M; global (Cholesky)
#            dA = -(G'G gmu) mu'; CG: reverse mode through the k iterations by hand, dA = sum_k dL/d(A p_k) p_k'.
#            Then dL/dr2 = -t/d dA o Z (off the diagonal), dL/dx = 2 (diag(S 1) X - S X) with S = dL/dr2 + its
#            transpose, and dL/dt = sum_j <dL/dx_j, x_j> / (2t) (Z depends on t and X through t ||x_j - x_l||^2 only).
# Memory: A = Z + eps I, the augmented keys, and G (Cholesky forms) or the CG vectors are kept for the backward pass.
# On CPU the batch is cut into chunks of at most CHUNK_BYTES per N x N buffer: larger buffers are fresh mmaps whose
# page faults cost more than the arithmetic at N = 512, and a chunk's CG vectors stay below torch's parallel grain
# size (no thread wake-ups for the many small vector operations).

@contextlib.contextmanager
def ieee_float32(device_type: str):
    """Float32 matmuls at full precision inside the block on CUDA, whatever TF32 setting the run uses outside it:
    the gate's Gram matrices and solves lose ~3 digits to TF32's 10-bit mantissa, which eps = 1e-3 cannot absorb.
    gaussian_key_weights runs its forward and its hand-written backward inside it (autograd runs a backward
    outside any context its forward was called in); the autograd paths use full_precision_backward."""
    if device_type != "cuda":
        yield
        return
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


class _FullPrecisionBackward(torch.autograd.Function):
    """fn(*inputs) -> tensors, the forward and the backward both inside ieee_float32. Autograd runs a backward
    under whatever TF32 setting is in force when .backward() is called, so the graph of fn is recorded on detached
    copies of the inputs in the forward and differentiated here, inside the guard."""

    @staticmethod
    def forward(ctx, fn, *inputs):
        leaves = [x.detach().requires_grad_(x.requires_grad) for x in inputs]
        with torch.enable_grad(), ieee_float32(leaves[0].device.type):
            outs = fn(*leaves)
        ctx.leaves, ctx.outs = leaves, outs
        return tuple(o.detach() for o in outs)

    @staticmethod
    def backward(ctx, *grads):
        pairs = [(o, g) for o, g in zip(ctx.outs, grads) if o.requires_grad and g is not None]
        wanted = [x for x in ctx.leaves if x.requires_grad]
        got = [None] * len(wanted)
        if pairs and wanted:
            with ieee_float32(wanted[0].device.type):
                got = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
        got = iter(got)
        return (None, *(next(got) if x.requires_grad else None for x in ctx.leaves))


@torch.compiler.disable  # a graph recorded in the forward and differentiated in the backward: eager under compile
def _full_precision_apply(fn, *inputs):
    return _FullPrecisionBackward.apply(fn, *inputs)


def full_precision_backward(fn, *inputs, force: bool = False):
    """fn(*inputs) (a tuple of tensors) with IEEE float32 matmuls in its forward AND its backward on CUDA, where
    the caller runs TF32 (the trainer's float32 setting) and a gradient is wanted; otherwise fn(*inputs) inside
    ieee_float32. force: take the autograd wrapper on any device (for tests on CPU)."""
    wrap = force or (inputs[0].device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32)
    if wrap and torch.is_grad_enabled() and any(x.requires_grad for x in inputs):
        return _full_precision_apply(fn, *inputs)
    with ieee_float32(inputs[0].device.type):
        return fn(*inputs)


BLOCK = 32  # diagonal blocks factored by LAPACK in inverse_cholesky
CHUNK_BYTES = 2**24  # CPU: at most 16 MiB per [chunk, N, N] buffer
DEVICE_CHUNK_BYTES = 2**30  # other devices: at most 1 GiB per [chunk, N, N] buffer (memory, not speed)


def inverse_cholesky(a: torch.Tensor, block: int | None = None):
    """(G, info): G = L^-1 where a = L L' [..., N, N] (only the lower triangle of a is read); info as cholesky_ex's
    (order of the first leading minor that is not positive definite, 0 if none). G's upper triangle is exactly 0.
    block: the size LAPACK factors directly (default BLOCK)."""
    n, block = a.shape[-1], block or BLOCK
    if n <= block:
        L, info = torch.linalg.cholesky_ex(a)
        return torch.linalg.solve_triangular(L, eye_like(n, a).expand_as(a), upper=False, left=False), info  # G L = I
    h = block * math.ceil(n / (2 * block))  # split at a multiple of the block
    g1, info1 = inverse_cholesky(a[..., :h, :h], block)  # L11^-1
    l21 = a[..., h:, :h] @ g1.mT  # L21 = A21 L11'^-1
    schur = torch.baddbmm(a[..., h:, h:], l21, l21.mT, alpha=-1.0) if a.dim() == 3 else a[..., h:, h:] - l21 @ l21.mT
    g2, info2 = inverse_cholesky(schur, block)  # L22^-1, L22 L22' = A22 - L21 L21'
    g = torch.empty_like(a)
    g[..., :h, :h] = g1
    g[..., :h, h:] = 0.0
    g[..., h:, h:] = g2
    g[..., h:, :h] = (g2 @ l21.neg_()) @ g1  # (L^-1)21 = -L22^-1 L21 L11^-1
    return g, torch.where(info1 > 0, info1, torch.where(info2 > 0, info2 + h, 0))


def _chunk_size(n_mats: int, n: int, x: torch.Tensor) -> int:
    """Matrices per chunk: at most CHUNK_BYTES per [chunk, N, N] buffer on CPU, DEVICE_CHUNK_BYTES elsewhere (there
    only to bound memory at long context: [B H, N, N] at N = 4096 and B H = 64 would be 4 GiB per buffer)."""
    limit = CHUNK_BYTES if x.device.type == "cpu" else DEVICE_CHUNK_BYTES
    return max(1, min(n_mats, limit // (n * n * x.element_size())))


def _augmented(keys: torch.Tensor, t: torch.Tensor):
    """(left, right) [B, N, d + 2] with left_j . right_l = -t ||x_j - x_l||^2 / d, x = keys - key 1 (centred: a
    translation changes no distance but shrinks the norms, so less cancellation): left = [s x, 1, s^2 |x|^2],
    right = [2 s x, -s^2 |x|^2, -1], s = sqrt(t / d). Written in place: no temporaries of the keys' size.
    left[..., :d + 1] = [s x, 1] is what the backward pass multiplies dL/dr2 by."""
    b, n, d = keys.shape
    left, right = keys.new_empty(b, n, d + 2), keys.new_empty(b, n, d + 2)
    xs = torch.sub(keys, keys[:, :1], out=left[..., :d]).mul_((t / d).sqrt())
    left[..., d] = 1.0
    torch.linalg.vector_norm(xs, dim=-1, out=left[..., d + 1]).square_()
    torch.mul(xs, 2.0, out=right[..., :d])
    torch.neg(left[..., d + 1], out=right[..., d])
    right[..., d + 1] = -1.0
    return left, right


def _system(left: torch.Tensor, right: torch.Tensor, eps: float) -> torch.Tensor:
    """A = Z + eps I [c, N, N] from augmented keys (symmetric up to rounding: the Cholesky forms read the lower
    triangle only, CG multiplies by the whole matrix)."""
    a = left @ right.mT  # -t r2 / d
    a.clamp_max_(0.0).exp_()  # Z = exp(-t r2 / d), r2 >= 0
    a.diagonal(dim1=-2, dim2=-1).fill_(1.0 + eps)
    return a


def _prefix_rows(g: torch.Tensor, y: torch.Tensor, a: torch.Tensor | None = None, out: torch.Tensor | None = None,
                 block: int = 32) -> torch.Tensor:
    """diag(a) C diag(y) g [c, N, N], C = lower-triangular ones: row i = a_i sum_{m <= i} y_m g_m (a cumulative sum
    over rows). By blocks of `block` rows (one small triangular matmul inside each block, then the running totals
    of the earlier blocks): about as fast as two elementwise passes, where torch.cumsum over rows is several times
    slower on CPU."""
    c, n, m = g.shape
    if n % block:
        rows = torch.cumsum(g * y.unsqueeze(-1), dim=-2, out=out)
        return rows if a is None else rows.mul_(a.unsqueeze(-1))
    nb = n // block
    gb, yb = g.view(c, nb, block, m), y.view(c, nb, 1, block)
    tri = torch.ones(block, block, dtype=g.dtype, device=g.device).tril_() * yb  # C_b diag(y) of each block
    totals = (yb @ gb).squeeze(-2).cumsum(1)  # [c, nb, m]: sum_{m <= end of block k} y_m g_m
    if a is not None:
        tri.mul_(a.view(c, nb, block, 1))
    rows = torch.matmul(tri, gb, out=None if out is None else out.view(c, nb, block, m))
    carry = totals[:, :-1].unsqueeze(-2)
    if a is None:
        rows[:, 1:] += carry
    else:
        rows[:, 1:].addcmul_(a.view(c, nb, block, 1)[:, 1:], carry)
    return rows.view(c, n, m)


def _quarters(x: torch.Tensor, h: int):
    """The 2 x 2 blocks (11, 12, 21, 22) of x [c, N, N] split at h (views)."""
    return x[:, :h, :h], x[:, :h, h:], x[:, h:, :h], x[:, h:, h:]


def _lower_t_lower(t: tuple, l: tuple) -> tuple:
    """T' L in blocks (11, 12, 21, 22) for lower-triangular T and L given as blocks (T12 = L12 = 0 are not read):
    [T11' T21'; 0 T22'] [L11 0; L21 L22] in 5 half-size products instead of 8."""
    (t11, _, t21, t22), (l11, _, l21, l22) = t, l
    return torch.baddbmm(t11.mT @ l11, t21.mT, l21), t21.mT @ l22, t22.mT @ l21, t22.mT @ l22


def _lower_lower(l: tuple, m: tuple, m_upper: bool = False) -> tuple:
    """tril(L M) in blocks (11, None, 21, 22) for lower-triangular L (its upper triangle is not read) and M lower-
    triangular, or upper-triangular with m_upper: 4 half-size products instead of 8."""
    (l11, _, l21, l22), (m11, m12, m21, m22) = l, m
    if m_upper:  # [L11 0; L21 L22] [M11 M12; 0 M22]: lower part [L11 M11, -; L21 M11, L21 M12 + L22 M22]
        return (l11 @ m11).tril_(), None, l21 @ m11, torch.baddbmm(l21 @ m12, l22, m22).tril_()
    return (l11 @ m11).tril_(), None, torch.baddbmm(l21 @ m11, l22, m21), (l22 @ m22).tril_()


def _keys_grad_blocks(ga: tuple, a: torch.Tensor, x1: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """:func:`_keys_grad` for dL/dA given in 2 x 2 blocks (contiguous, overwritten): no N x N matrix is assembled."""
    h, d = ga[0].shape[-1], x1.shape[-2] - 1
    for g, z in zip(ga, _quarters(a, h)):
        g.mul_(z)
    for g in (ga[0], ga[3]):
        g.diagonal(dim1=-2, dim2=-1).zero_()  # Z_jj = 1 + eps is a constant
    x1s, g = (x1[..., :h], x1[..., h:]), ((ga[0], ga[1]), (ga[2], ga[3]))
    cols = []
    for j in (0, 1):  # columns j of x1 S = sum_i x1_i (G_ij + G_ji')
        terms = [(x1s[i], m) for i in (0, 1) for m in (g[i][j], g[j][i].mT)]
        col = terms[0][0] @ terms[0][1]
        for x, m in terms[1:]:
            col = torch.baddbmm(col, x, m)
        cols.append(col)
    s = torch.cat(cols, -1).mT  # [S X, S 1] / factor
    return (x1[:, :d].mT * s[..., d:] - s[..., :d]) * (2.0 * factor)


def _keys_grad(ga: torch.Tensor, a: torch.Tensor, x1: torch.Tensor, factor: torch.Tensor,
               symmetric: bool = False) -> torch.Tensor:
    """dL/dx [c, N, d] of centred keys x, x1 = [s x, 1]' [c, d + 1, N] (any s > 0), from dL/dA = ga / factor
    (any N x N; symmetric=True: ga is already dL/dA + its transpose), where factor carries -t/d, 1/s (and a sign);
    overwrites ga. dL/dr2 = -t/d dL/dA o Z off the diagonal; dL/dx = 2 (diag(S 1) X - S X), S = dL/dr2 + its
    transpose."""
    d = x1.shape[-2] - 1
    ga.mul_(a).diagonal(dim1=-2, dim2=-1).zero_()  # Z_jj = 1 + eps is a constant
    s = (x1 @ ga if symmetric else torch.baddbmm(x1 @ ga, x1, ga.mT)).mT  # [S X, S 1] / factor (S' X: S symmetric)
    return (x1[:, :d].mT * s[..., d:] - s[..., :d]) * (2.0 * factor)


class _GaussianKeyWeights(torch.autograd.Function):
    """keys [B, N, d], t -> (weights, |X| [B], jitter [B, N], residual [B] or empty): see the section comment."""

    @staticmethod
    def forward(ctx, keys, t, eps, form, solver, max_iter, with_residual):
        n_mats, n, d = keys.shape
        left, right = _augmented(keys, t)
        step = _chunk_size(n_mats, n, keys)
        chunks = [slice(lo, lo + step) for lo in range(0, n_mats, step)]
        a = [_system(left[sl], right[sl], eps) for sl in chunks]  # A = Z + eps I, kept for the backward pass
        jitter, saved = keys.new_zeros(n_mats, n), []
        if solver == "cg":  # chunk by chunk: vectors of a chunk stay below torch's grain size (no thread wake-ups)
            w = keys.new_empty(n_mats, n)
            for sl, a_sl in zip(chunks, a):
                w[sl], _, trace = cg_trace(lambda p: vecmat(p, a_sl.mT), keys.new_ones(w[sl].shape), max_iter=max_iter)
                saved += [torch.stack(v) for v in zip(*trace)]  # what the adjoint iteration needs
            mu, mag = w, w.sum(-1)
        else:
            w = keys.new_empty((n_mats, n, n) if form == "prefix" else (n_mats, n))
            mu = w if form == "global" else keys.new_empty(n_mats, n) if with_residual else None
            mag = keys.new_empty(n_mats)
            for sl, a_sl in zip(chunks, a):
                g, jitter[sl] = cholesky_jitter(a_sl, causal=form != "global", factor=inverse_cholesky)
                y = g.sum(-1)  # y = L^-1 1
                if mu is not None:
                    mu[sl] = vecmat(y, g)  # mu = L'^-1 y
                mag[sl] = mu[sl].sum(-1) if form == "global" else (y * y).sum(-1)  # |X| = 1'mu = ||L^-1 1||^2
                if form == "causal":
                    w[sl] = y * torch.diagonal(g, dim1=-2, dim2=-1)  # w_j = y_j / L_jj
                elif form == "prefix":
                    _prefix_rows(g, y, out=w[sl])  # M_ij = sum_{m<=i} y_m G_mj
                saved += [g, y]
        residual = keys.new_empty(n_mats if with_residual else 0)
        for sl, a_sl in zip(chunks, a) if with_residual else ():
            residual[sl] = relative_residual(a_sl + torch.diag_embed(jitter[sl]), mu[sl])
        ctx.chunks, ctx.form, ctx.solver, ctx.max_iter = chunks, form, solver, max_iter
        ctx.save_for_backward(t, left, w, *a, *saved)  # released by autograd after the backward pass
        ctx.mark_non_differentiable(mag, jitter, residual)
        return w, mag, jitter, residual

    @staticmethod
    def backward(ctx, gw, *_):
        with ieee_float32(gw.device.type):  # as the forward: no TF32 in the solves' products
            return _GaussianKeyWeights._backward(ctx, gw)

    @staticmethod
    def _backward(ctx, gw):
        t, left, w, *rest = ctx.saved_tensors
        a, saved = rest[: len(ctx.chunks)], rest[len(ctx.chunks):]
        n_mats, n, d = left.shape[0], left.shape[1], left.shape[2] - 2
        x1 = left[..., : d + 1].mT  # [s x, 1]' [B, d + 1, N], x = keys - key 1, s = sqrt(t / d)
        g_x = left.new_empty(n_mats, n, d)  # dL/dx
        s = (t.to(left.dtype) / d).sqrt()
        scale = -t.to(left.dtype) / d / s  # dZ/dr2 = -t/d Z; and 1/s: x1 carries s x
        work = left.new_empty(min(ctx.chunks[0].stop, n_mats), n, n)  # reused by every chunk
        q = functools.partial(_quarters, h=n // 2)
        for i, (sl, a) in enumerate(zip(ctx.chunks, a)):
            gws, w1 = gw[sl], work[: a.shape[0]]
            if ctx.solver == "cg":  # dL/dA + its transpose = E P' + P E'
                ep, pe = _cg_adjoint(a, saved[8 * i: 8 * i + 8], gws)
                g_x[sl] = _keys_grad(torch.matmul(ep, pe.mT, out=w1), a, x1[sl], scale, symmetric=True)
                continue
            g, y = saved[2 * i], saved[2 * i + 1]
            if ctx.form == "global":  # d mu = -A^-1 dA mu
                ga = torch.mul(vecmat(vecmat(gws, g.mT), g).unsqueeze(-1), w[sl].unsqueeze(-2), out=w1)
                g_x[sl] = _keys_grad(ga, a, x1[sl], -scale)
                continue
            # in 2 x 2 blocks, using the triangles (causal: 5 of 8 half-size products; prefix: 13 of 24)
            if ctx.form == "causal":  # d w_j = -(Z_j^-1 e_j)' dA_j mu^(j), Z_j^-1 e_j = G_j' e_j G_jj
                m = _prefix_rows(g, y, gws * torch.diagonal(g, dim1=-2, dim2=-1), out=w1)  # diag(gw G_jj) M
                ga = _lower_t_lower(q(g), q(m))  # G' diag(gw G_jj) M
            else:  # d M_i = -Z_i^-1 dA_i M_i for every prefix i; only gM_ij with j <= i reaches tril(gM G')
                u = _lower_lower(_lower_lower(q(gws), q(g.mT), m_upper=True), q(g))  # tril(gM G') G
                ga = _lower_t_lower(u, q(w[sl]))  # U' M
            g_x[sl] = _keys_grad_blocks(ga, a, x1[sl], -scale)
        g_t = torch.tensordot(g_x, left[..., :d], dims=3) / (2.0 * t.to(left.dtype) * s)  # homogeneity:
        g_keys = g_x  # Z(t, X) = Z(t / c^2, c X) gives dL/dt = sum_j <dL/dx_j, x_j> / (2t)
        g_keys[:, 0] -= g_x.sum(1)  # x = keys - key 1 (sum_j dL/dx_j = 0 up to rounding)
        return g_keys, g_t.to(t.dtype), None, None, None, None, None


def _cg_adjoint(a: torch.Tensor, trace: list, g_x: torch.Tensor):
    """([E P], [P E]) [c, N, 2k] with [E P] [P E]' = dL/dA + its transpose for the truncated CG iterate x(A)
    (from 0, b = 1): reverse-mode through the k iterations of :func:`cg_trace` by hand, E = dL/d(A p_k) stacked.

    trace: the stacked per-iteration tensors of cg_trace (p, A p, r'r, p'Ap, live, alpha, beta, r_new). The guards act
    as in the forward pass: where an iteration froze (live false), alpha and beta are constants 0. Each iteration
    costs one product with A' and a few vector operations (no autograd graph)."""
    p, ap, rr, pap, live, alpha, beta, r_new = trace
    col = lambda v: v.unsqueeze(-1)  # noqa: E731
    x_bar, r_bar, p_bar, rr_bar = g_x, torch.zeros_like(g_x), torch.zeros_like(g_x), torch.zeros_like(g_x[..., 0])
    e = []
    for k in reversed(range(p.shape[0])):  # adjoints arrive for x_{k+1}, r_{k+1}, p_{k+1}, r_{k+1}'r_{k+1}
        rr_next = rr[k + 1] if k + 1 < rr.shape[0] else batched_dot(r_new[k], r_new[k])
        r_bar = r_bar + p_bar  # p_{k+1} = r_{k+1} + beta_k p_k
        beta_bar = batched_dot(p_bar, p[k])
        p_bar_k = col(beta[k]) * p_bar
        rr_bar = rr_bar + torch.where(live[k], beta_bar / rr[k], 0.0)  # beta_k = r_{k+1}'r_{k+1} / r_k'r_k
        rr_bar_k = torch.where(live[k], -beta_bar * rr_next / rr[k] ** 2, 0.0)
        r_bar = r_bar + 2.0 * col(rr_bar) * r_new[k]  # r_{k+1}'r_{k+1}
        # x_{k+1} = x_k + alpha p_k, r_{k+1} = r_k - alpha A p_k
        alpha_bar = batched_dot(x_bar, p[k]) - batched_dot(r_bar, ap[k])
        ap_bar = -col(alpha[k]) * r_bar
        p_bar_k = p_bar_k + col(alpha[k]) * x_bar
        rr_bar_k = rr_bar_k + torch.where(live[k], alpha_bar / pap[k], 0.0)  # alpha_k = r_k'r_k / p_k'A p_k
        pap_bar = torch.where(live[k], -alpha_bar * rr[k] / pap[k] ** 2, 0.0)
        p_bar_k = p_bar_k + col(pap_bar) * ap[k]
        ap_bar = ap_bar + col(pap_bar) * p[k]
        e.append(ap_bar)  # dL/d(A p_k)
        if k > 0:  # p_0 = r_0 = 1 is a constant
            p_bar_k = p_bar_k + vecmat(ap_bar, a)  # A' dL/d(A p_k)
        r_bar, p_bar, rr_bar = r_bar, p_bar_k, rr_bar_k
    e = torch.stack(e[::-1], dim=-1)
    p = p.movedim(0, -1)
    return torch.cat([e, p], -1), torch.cat([p, e], -1)


@torch.compiler.disable  # in-place writes into slices and data-dependent retries: runs eagerly inside a compiled model
def gaussian_key_weights(keys: torch.Tensor, t, eps: float = 0.0, *, form: str = "causal", solver: str = "cholesky",
                         max_iter: int = 5, with_residual: bool = False):
    """(w, |X| [...], SolveInfo) of keys [..., N, d] with the Gaussian kernel, as MagnitudeGate needs them (fast).

    form "global": mu [..., N] ((Z + eps I) mu = 1; solver "cholesky" or "cg" truncated at max_iter);
    "causal": w_j = y_j / L_jj [..., N]; "prefix": M [..., N, N]. |X| is that of the whole key set (CG: 1'mu).
    SolveInfo.residual is empty unless with_residual (it costs one more product with Z per matrix).
    Differentiable in keys and t (a tensor or a number); numerically the same as the general functions. On CUDA
    its matmuls run in IEEE float32 (ieee_float32) in the forward and the backward, whatever the TF32 setting.
    """
    if form not in FORMS:
        raise ValueError(f"form={form!r} is not allowed; choose one of: {', '.join(map(repr, FORMS))}")
    if solver not in SOLVERS or (form != "global" and solver != "cholesky"):
        raise ValueError(f"solver={solver!r} is not allowed for form={form!r}")
    lead, (n, d) = keys.shape[:-2], keys.shape[-2:]
    t = torch.as_tensor(t, dtype=keys.dtype, device=keys.device)
    with ieee_float32(keys.device.type):  # the forward's products; the backward guards its own
        w, mag, jitter, residual = _GaussianKeyWeights.apply(keys.reshape(-1, n, d), t, float(eps), form, solver,
                                                             max_iter, with_residual)
    its = max_iter if solver == "cg" else 0
    info = SolveInfo(residual.reshape(lead) if with_residual else residual, its, jitter.reshape(*lead, n))
    return w.reshape(*lead, *w.shape[1:]), mag.reshape(lead), info


def lowrank_key_weights(keys: torch.Tensor, landmarks: torch.Tensor, t, eps: float, *, form: str = "causal",
                        chunk: int = CHUNK, with_residual: bool = True):
    """(w, |X| [...], SolveInfo): what MagnitudeGate needs from keys [..., N, d] with the low-rank solver, the
    counterpart of gaussian_key_weights. form "causal": w [..., N], key j's weight in its own
    prefix; "prefix": M [..., N, N]. |X| = sum_k y_k^2 is the magnitude of the whole (approximated) key set. The
    residual is that of the full approximated system, ||1 - A mu|| / sqrt(N) with mu = M_N (O(N r) by Woodbury);
    it measures rounding, not the approximation of Z. eps must be > 0 (D can be 0 on a landmark)."""
    if form not in CAUSAL_FORMS:
        raise ValueError(f"form={form!r}: the low-rank solver gives the causal forms 'causal' and 'prefix' only")
    phi, lam, w, y, c = lowrank_solve(keys, t, eps, "gaussian", landmarks, None, chunk, with_c=form == "prefix")
    residual = keys.new_zeros(keys.shape[:-2])
    if with_residual:
        with torch.no_grad():  # mu = (1 - Phi c_N) / lambda, c_N = S_N^-1 u_N;  A mu = lambda mu + Phi (Phi' mu)
            scaled = phi / lam[..., None]
            s_n = torch.eye(phi.shape[-1], dtype=phi.dtype, device=phi.device) + scaled.mT @ phi
            c_n = torch.linalg.solve(s_n, scaled.sum(-2))
            mu = (1.0 - (phi @ c_n[..., None])[..., 0]) / lam
            a_mu = lam * mu + (phi @ (phi.mT @ mu[..., None]))[..., 0]
            residual = (1.0 - a_mu).norm(dim=-1) / math.sqrt(keys.shape[-2])
    if form == "prefix":
        w = prefix_weight_matrix_lowrank(phi, lam, c)
    return w, y.square().sum(-1), SolveInfo(residual, 0, torch.zeros_like(lam))


def lowrank_prefix_factors(keys: torch.Tensor, landmarks: torch.Tensor, t, eps: float, *, chunk: int = CHUNK):
    """(phi [..., N, r], lambda [..., N], c [..., N, r]): the low-rank solver's factors of the prefix weights,
    M_ij = (1 - phi_j' c_i) / lambda_j for j <= i, for attnlab.mechanisms.magnitude.prefix_blocks, which never builds M."""
    phi, lam, _, _, c = lowrank_solve(keys, t, eps, "gaussian", landmarks, None, chunk)
    return phi, lam, c
