"""Magnitude of a finite set of points and its weights: pure math, no parameters (Magnitude Attention write-up).

    Z_jl = exp(-t ||x_j - x_l||^2 / d)     kernel "gaussian" (the Magnitude Attention write-up's key geometry, d = the points' dimension)
    Z_jl = exp(-t ||x_j - x_l||)           kernel "laplacian" (classical metric-space magnitude)
    (Z + eps I) mu = 1,   |X| = 1' mu      (weights; magnitude = "effective number of points"; eps: Tikhonov)

Causal (prefix) forms, exact, from one Cholesky factor Z + eps I = L L', y = L^-1 1, G = L^-1
(derived on the docs' magnitude page, docs/magnitude.md, "prefix identities"):

    |X_1..i| = sum_{k <= i} y_k^2                  magnitude of every prefix (a cumulative sum, monotone in i)
    w_j      = y_j / L_jj                          weight of key j inside its own prefix {1..j}
    M_ij     = sum_{m = j..i} G_mj y_m             weight of key j inside query i's prefix {1..i}; row i sums to |X_1..i|

Gates (Magnitude Attention write-up, step 3) map a weight to a multiplier of value j: "sigmoid" is sigmoid(beta mu + gamma)
exactly as the write-up has it;
"clamp" (the default) and "linear" first confine mu to [0, 1] (mu is not sign-definite: down to -1e5 on rank-4
keys; docs/magnitude.md, numerics).

Where the weights act (APPLY): "values" is the Magnitude Attention write-up's gate on the values; "logits" is the control that the Magnitude Attention write-up's
argument against "methods that just shift attention scores" needs: the weight becomes a prior
inside the softmax, p_ij proportional to max(w, PRIOR_FLOOR)_j exp(z_ij), i.e. z_ij + log max(w_j, PRIOR_FLOOR)
(:func:`log_prior`; docs/magnitude.md, "magnitude as a logit prior").

Shapes: points x [..., N, d] (any leading batch dims) -> Z [..., N, N], mu / w [..., N], M [..., N, N].
The front-ends (:func:`magnitude_weights`, :func:`magnitude`, :func:`prefix_magnitude`, ...) also take numpy
arrays and then return numpy arrays. This module is the reference math, written as the formulas read; the gates
of a model compute the same numbers through the fused kernel in :mod:`attnlab.mechanisms.magnitude.fused`.
"""

from __future__ import annotations

import functools
import math
import warnings
from typing import NamedTuple

import numpy as np
import torch

from .lowrank import CHUNK, RANK, default_landmarks, lowrank_prefix, nystrom_features
from .lowrank import SOLVER as LOWRANK
from .lowrank import prefix_weight_matrix_lowrank
from ...functional.scores import squared_distances
from .names import (APPLY, CAUSAL_FORMS, FORMS, GATE_ALIASES, GATES, KERNELS, PRIOR_FLOOR,  # noqa: F401
                    SOLVERS)  # their home: .names

MAX_JITTER_TRIES = 8


class SolveInfo(NamedTuple):
    """How a solve went: the honest report that comes with the weights.

    residual: [...] relative residual ||1 - (Z + eps I + diag(jitter)) mu|| / ||1|| of the full system.
    iterations: CG iterations run (0 for Cholesky).
    jitter: [..., N] diagonal added on top of eps after failed factorisations (0 when none failed).
    """

    residual: torch.Tensor
    iterations: int
    jitter: torch.Tensor


# ----------------------------------------------------------------------------------------------------- kernels


def eye_like(n: int, like: torch.Tensor) -> torch.Tensor:
    return torch.eye(n, dtype=like.dtype, device=like.device)


def _t_like(t, z: torch.Tensor) -> torch.Tensor:
    """t as a tensor broadcasting against [..., N, N]: a number, or a tensor over the leading dims."""
    t = torch.as_tensor(t, dtype=z.dtype, device=z.device)
    return t[..., None, None] if t.dim() else t


def pairwise_distances(x: torch.Tensor) -> torch.Tensor:
    """||x_j - x_l|| from explicit differences (no cancellation near duplicates; gradient 0 at distance 0)."""
    flat = x.reshape(-1, *x.shape[-2:])
    r = torch.cdist(flat, flat, compute_mode="donot_use_mm_for_euclid_dist")
    return r.reshape(*x.shape[:-1], x.shape[-2])


def similarity(x: torch.Tensor, t=1.0, kernel: str = "gaussian") -> torch.Tensor:
    """Z [..., N, N] of points x [..., N, d]; symmetric, with Z_jj = 1 exactly."""
    n, d = x.shape[-2], x.shape[-1]
    diag = torch.eye(n, dtype=torch.bool, device=x.device)
    if kernel == "gaussian":
        x = x - x[..., :1, :]  # translation changes no distance but shrinks the norms below (causal: point 1 only)
        r2 = squared_distances(x, x)  # ||x_j - x_l||^2 = ||x_j||^2 + ||x_l||^2 - 2 <x_j, x_l>, clamped at 0
        r2 = (0.5 * (r2 + r2.transpose(-1, -2))).masked_fill(diag, 0.0)  # exactly symmetric, 0 on the diagonal
        return torch.exp(-_t_like(t, r2) * r2 / d)  # Z_jl = exp(-t ||k_j - k_l||^2 / d_k)       (Magnitude Attention write-up, step 1)
    if kernel == "laplacian":
        r = pairwise_distances(x).masked_fill(diag, 0.0)
        return torch.exp(-_t_like(t, r) * r)  # Z_jl = exp(-t ||x_j - x_l||)             (notes: classical magnitude)
    raise ValueError(f"kernel={kernel!r} is not allowed; choose one of: {', '.join(map(repr, KERNELS))}")


def tikhonov(z: torch.Tensor, eps: float = 0.0) -> torch.Tensor:
    """Z + eps I (Magnitude Attention write-up, step 2): every eigenvalue >= eps, so cond <= (lambda_max + eps) / eps."""
    return z if eps == 0 else z + eps * eye_like(z.shape[-1], z)


# ----------------------------------------------------------------------------------------------------- solvers


def cholesky_jitter(a: torch.Tensor, *, causal: bool = False, max_tries: int = MAX_JITTER_TRIES,
                    factor=torch.linalg.cholesky_ex):
    """(L, jitter): a + diag(jitter) = L L', jitter [..., N] = 0 unless the factorisation fails.

    A failed matrix is retried with jitter growing tenfold from N * machine epsilon (the rounding scale of a
    Cholesky with unit diagonal), and a RuntimeWarning says so. causal=False adds it to the whole diagonal
    (keeps permutation symmetry); causal=True only from the first failing pivot on, so rows 1..i of L still depend
    on keys 1..i only: cholesky_ex reports the first leading minor that is not positive definite, rows above it
    are unchanged, and the retries walk forward, so each entry's jitter is decided by its own prefix.
    factor: a -> (factor, info) with cholesky_ex's info (default cholesky_ex; :func:`inverse_cholesky` gives L^-1).
    No exception path and no device sync unless a factorisation failed (one check of info per call).
    """
    L, info = factor(a)
    jitter = a.new_zeros(a.shape[:-1])
    if not bool((info > 0).any()):
        return L, jitter
    n = a.shape[-1]
    pivots = torch.arange(n, device=a.device)
    level = torch.finfo(a.dtype).eps * n
    for _ in range(max_tries):
        failed = info > 0
        if not bool(failed.any()):
            break
        bump = failed[..., None] & ((pivots >= (info - 1)[..., None]) if causal else True)
        jitter = torch.where(bump, torch.clamp_min(jitter, level), jitter)
        L, info = factor(a + torch.diag_embed(jitter))
        level *= 10.0
    else:
        if bool((info > 0).any()):
            raise torch.linalg.LinAlgError(
                f"magnitude: Cholesky of Z + eps I failed even with jitter {level / 10:.1e}; "
                f"the points are (near-)duplicates or not finite: use eps > 0"
            )
    n_failed = int((jitter > 0).any(-1).sum())
    warnings.warn(
        f"magnitude: Cholesky failed for {n_failed} of {math.prod(a.shape[:-2])} matrices; retried with diagonal "
        f"jitter up to {float(jitter.max()):.1e} (set eps > 0 for a deterministic regularisation)",
        RuntimeWarning, stacklevel=3,
    )
    return L, jitter


def batched_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1)


def _matvec(a: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return (a @ v.unsqueeze(-1)).squeeze(-1)


def vecmat(v: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
    """v'a [..., N] (on CPU a batched row vector times a matrix streams the matrix about 2x faster than a @ v)."""
    return (v.unsqueeze(-2) @ a).squeeze(-2)


def cg_solve(a: torch.Tensor, b: torch.Tensor, *, max_iter: int, tol: float | None = None):
    """(x, iterations): conjugate gradient for a x = b from x = 0, batched over the leading dims.

    Truncated at max_iter (Magnitude Attention write-up: "3-5 iterations"); with tol, stops once every ||r|| <= tol ||b||.
    Differentiable by unrolling: autograd gives the exact gradient of the truncated iterate. A system that has
    converged (r = 0) or lost positive curvature (p'Ap <= 0) freezes (alpha = beta = 0); the divisions are guarded
    on both branches, so neither the forward nor the backward pass meets 0/0.
    """
    x, its, _ = cg_trace(lambda p: _matvec(a, p), b, max_iter=max_iter, tol=tol)
    return x, its


def cg_trace(matvec, b: torch.Tensor, *, max_iter: int, tol: float | None = None):
    """(x, iterations, trace): :func:`cg_solve` with the product A p given as matvec(p); trace: per iteration k
    (p_k, A p_k, r_k'r_k, p_k'A p_k, live_k, alpha_k, beta_k, r_{k+1}), what :func:`_cg_adjoint` needs."""
    x = torch.zeros_like(b)
    r = b.clone()  # r_0 = b - A x_0
    p = r
    rr = batched_dot(r, r)
    stop = 0.0 if tol is None else (tol ** 2) * batched_dot(b, b)
    its, trace = 0, []
    for _ in range(max_iter):
        if tol is not None and not bool((rr > stop).any()):
            break
        ap = matvec(p)
        pap = batched_dot(p, ap)
        live = (rr > stop) & (pap > 0)
        alpha = torch.where(live, rr / torch.where(live, pap, 1.0), 0.0)  # alpha_k = r'r / p'Ap
        x = x + alpha[..., None] * p  # x_{k+1} = x_k + alpha_k p_k
        r = r - alpha[..., None] * ap  # r_{k+1} = r_k - alpha_k A p_k
        rr_new = batched_dot(r, r)
        beta = torch.where(live, rr_new / torch.where(live, rr, 1.0), 0.0)  # beta_k = r'r (new) / r'r (old)
        trace.append((p, ap, rr, pap, live, alpha, beta, r))
        p = r + beta[..., None] * p  # p_{k+1} = r_{k+1} + beta_k p_k
        rr = rr_new
        its += 1
    return x, its, trace


def relative_residual(a: torch.Tensor, mu: torch.Tensor) -> torch.Tensor:
    """||1 - a mu|| / ||1||, recomputed from scratch (not CG's recursive residual)."""
    return (1.0 - _matvec(a, mu)).norm(dim=-1) / math.sqrt(mu.shape[-1])


def _cholesky_weights(a: torch.Tensor):
    """(mu, y, jitter) of a [..., N, N]: a (+ jitter) = L L', y = L^-1 1, mu = L'^-1 y."""
    L, jitter = cholesky_jitter(a)
    y = _forward_sub(L, torch.ones(a.shape[:-1], dtype=a.dtype, device=a.device))  # y = L^-1 1
    mu = torch.linalg.solve_triangular(L.mT, y.unsqueeze(-1), upper=True).squeeze(-1)  # mu = L'^-1 y
    return mu, y, jitter


def solve_weights(z: torch.Tensor, eps: float = 0.0, *, solver: str = "cholesky", max_iter: int | None = None,
                  tol: float | None = None, _return_y: bool = False):
    """(mu, SolveInfo): the weights (Z + eps I) mu = 1 of a similarity matrix z [..., N, N]."""
    a = tikhonov(z, eps)
    y = None
    if solver == "cholesky":
        mu, y, jitter = _cholesky_weights(a)
        a, its = a + torch.diag_embed(jitter), 0
    elif solver == "cg":
        ones = torch.ones(z.shape[:-1], dtype=z.dtype, device=z.device)
        mu, its = cg_solve(a, ones, max_iter=z.shape[-1] if max_iter is None else max_iter, tol=tol)
        jitter = torch.zeros_like(ones)
    elif solver == LOWRANK:
        raise ValueError("solver='lowrank' gives the causal forms only: use prefix_magnitude, prefix_weights or "
                         "prefix_weight_matrix")
    else:
        raise ValueError(f"solver={solver!r} is not allowed; choose one of: {', '.join(map(repr, SOLVERS))}")
    with torch.no_grad():
        residual = relative_residual(a, mu)
    info = SolveInfo(residual, its, jitter)
    return (mu, info, y) if _return_y else (mu, info)


# ----------------------------------------------------------------------------------------- causal (prefix) forms


def _forward_sub(L: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """L^-1 b for lower-triangular L and vectors b [..., N]."""
    return torch.linalg.solve_triangular(L, b.unsqueeze(-1), upper=False).squeeze(-1)


def prefix_factor(z: torch.Tensor, eps: float = 0.0):
    """(L, y, jitter): Z + eps I (+ causal jitter) = L L', y = L^-1 1. Row i of both depends on points 1..i only."""
    L, jitter = cholesky_jitter(tikhonov(z, eps), causal=True)
    y = _forward_sub(L, torch.ones(z.shape[:-1], dtype=z.dtype, device=z.device))  # y = L^-1 1
    return L, y, jitter


def prefix_magnitude_from_factor(y: torch.Tensor) -> torch.Tensor:
    """|X_1..i| = sum_{k<=i} y_k^2 for every i   (notes: 1' Z_i^-1 1 = ||L_i^-1 1||^2, L_i the leading block)."""
    return torch.cumsum(y * y, dim=-1)


def own_prefix_weights_from_factor(L: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """w_j = y_j / L_jj: the last entry of Z_j^-1 1 = L_j'^-1 y_1..j, i.e. key j's weight inside {1..j}."""
    return y / torch.diagonal(L, dim1=-2, dim2=-1)


def prefix_weight_matrix_from_factor(L: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """M_ij = sum_{m=j..i} G_mj y_m, G = L^-1: entry j of Z_i^-1 1 = (L_i'^-1 y_1..i)_j; zero above the diagonal."""
    g = torch.linalg.solve_triangular(L, eye_like(L.shape[-1], L).expand_as(L), upper=False)  # G = L^-1 (lower)
    return torch.cumsum(y.unsqueeze(-1) * g, dim=-2).tril()  # M = cumsum over rows m of diag(y) G


# ------------------------------------------------------------------------------------------------------- gates


def gate(w: torch.Tensor, beta, gamma, form: str = "clamp") -> torch.Tensor:
    """The value gate g(w) of a magnitude weight w (mu_j, w_j or M_ij), elementwise.

    "sigmoid": sigmoid(beta w + gamma)                the write-up's step 3 exactly (w unbounded: saturates or flips)
    "clamp":  sigmoid(beta clamp(w, 0, 1) + gamma)    the write-up's gate on w confined to [0, 1], "the fraction of a
              unit that key j contributes" (1 isolated, 1/m in a cluster of m clones, <= 0 inside a cluster)
    "linear": clamp(beta w + gamma, 0, 1)             the write-up's arithmetic "the gate passes the weight through":
              at beta = 1, gamma = 0 a cluster of m clones contributes m * (1/m) = 1 unit
    """
    form = GATE_ALIASES.get(form, form)
    if form == "sigmoid":
        return torch.sigmoid(beta * w + gamma)
    if form == "clamp":
        return torch.sigmoid(beta * w.clamp(0.0, 1.0) + gamma)
    if form == "linear":
        return (beta * w + gamma).clamp(0.0, 1.0)
    raise ValueError(f"gate={form!r} is not allowed; choose one of: {', '.join(map(repr, GATES))}")


def log_prior(w: torch.Tensor, floor: float = PRIOR_FLOOR) -> torch.Tensor:
    """log max(w, floor), elementwise: the additive logit prior of a magnitude weight w (mu_j, w_j or M_ij).

    Added to the logits, softmax(z_ij + log max(w_j, floor)) gives p_ij proportional to max(w_j, floor) exp(z_ij):
    the weights shift attention scores instead of gating the values (the control for the Magnitude Attention write-up's argument). m exact
    clones with the prefix weights 1/(m + eps) then count as one key together; with the causal form's 1, 1/2, ...,
    1/m as a harmonic number H_m ~ ln m of keys. Gradient 0 below the floor (the clamp).
    """
    return torch.log(w.clamp_min(floor))


# -------------------------------------------------------------------------------------------------- front-ends


def _check(x: torch.Tensor, t, eps: float, kernel: str) -> None:
    if x.dim() < 2:
        raise ValueError(f"points must have shape [..., N, d], got {tuple(x.shape)}")
    if not torch.is_tensor(t) and not (isinstance(t, (int, float, np.number)) and t > 0):
        raise ValueError(f"t={t!r} must be a number > 0")
    if not eps >= 0:
        raise ValueError(f"eps={eps!r} must be >= 0")
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not allowed; choose one of: {', '.join(map(repr, KERNELS))}")


def _to_numpy(out):
    if torch.is_tensor(out):
        return out.detach().cpu().numpy()
    if isinstance(out, SolveInfo):
        return SolveInfo(_to_numpy(out.residual), out.iterations, _to_numpy(out.jitter))
    if isinstance(out, tuple):
        return tuple(_to_numpy(o) for o in out)
    return out


def _array_api(fn):
    """Torch in, torch out; numpy (or any array-like) in, numpy out. Integer points become float64."""

    @functools.wraps(fn)
    def wrapper(x, *args, **kwargs):
        if torch.is_tensor(x):
            return fn(x if x.is_floating_point() else x.double(), *args, **kwargs)
        arr = np.asarray(x)
        arr = arr if np.issubdtype(arr.dtype, np.floating) else arr.astype(np.float64)
        return _to_numpy(fn(torch.from_numpy(np.ascontiguousarray(arr)), *args, **kwargs))

    return wrapper


@_array_api
def magnitude_weights(x, t=1.0, *, eps: float = 0.0, kernel: str = "gaussian", solver: str = "cholesky",
                      max_iter: int | None = None, tol: float | None = None, return_info: bool = False):
    """Magnitude weights mu [..., N] of points x [..., N, d]: (Z + eps I) mu = 1 (Magnitude Attention write-up).

    solver "cholesky": exact (a failed factorisation is retried with growing jitter, with a warning);
    "cg": conjugate gradient truncated at max_iter (default N) or at relative residual tol.
    return_info: also return a :class:`SolveInfo` (the residual, CG iterations, jitter).
    """
    _check(x, t, eps, kernel)
    mu, info = solve_weights(similarity(x, t, kernel), eps, solver=solver, max_iter=max_iter, tol=tol)
    return (mu, info) if return_info else mu


@_array_api
def magnitude(x, t=1.0, *, eps: float = 0.0, kernel: str = "gaussian", solver: str = "cholesky",
              max_iter: int | None = None, tol: float | None = None, return_info: bool = False):
    """Magnitude |X| = 1' mu [...] of points x [..., N, d]; Cholesky computes it as ||L^-1 1||^2 (> 0 always)."""
    _check(x, t, eps, kernel)
    mu, info, y = solve_weights(similarity(x, t, kernel), eps, solver=solver, max_iter=max_iter, tol=tol,
                                _return_y=True)
    out = mu.sum(-1) if y is None else y.square().sum(-1)  # |X| = sum_j mu_j = 1' Z^-1 1 = ||L^-1 1||^2
    return (out, info) if return_info else out


def _prefix(x, t, eps, kernel, solver):
    _check(x, t, eps, kernel)
    if solver != "cholesky":
        raise ValueError(f"solver={solver!r}: prefix forms need the Cholesky factor or solver='lowrank' (CG solves "
                         f"one system, and every prefix is a different one)")
    return prefix_factor(similarity(x, t, kernel), eps)


def lowrank_solve(x, t, eps, kernel, landmarks, rank, chunk, with_c=True):
    """(phi, lambda, w, y, c) of the low-rank solver (attnlab.mechanisms.magnitude.lowrank) on points x; c is None
    unless with_c (only the weight matrix M needs it)."""
    _check(x, t, eps, kernel)
    if kernel != "gaussian" or not eps > 0:
        raise ValueError(f"solver='lowrank' needs kernel='gaussian' and eps > 0, got kernel={kernel!r}, eps={eps!r}")
    if landmarks is None:
        if not (isinstance(rank, int) and 1 <= rank <= x.shape[-2]):
            raise ValueError(f"rank={rank!r} is out of range; allowed 1..{x.shape[-2]} (the number of points)")
        landmarks = default_landmarks(rank, x.shape[-1], x)
    phi, d = nystrom_features(x, torch.as_tensor(landmarks, dtype=x.dtype, device=x.device), t)
    lam = d + eps  # Lambda = D + eps I
    return (phi, lam, *lowrank_prefix(phi, lam, chunk, with_c))


@_array_api
def prefix_magnitude(x, t=1.0, *, eps: float = 0.0, kernel: str = "gaussian", solver: str = "cholesky",
                     landmarks=None, rank: int = RANK, chunk: int = CHUNK):
    """|X_1..i| [..., N] for every prefix i of points x [..., N, d]: cumsum of y^2, y = L^-1 1 (exact, causal).

    solver="lowrank": the same for Z ~ Phi Phi' + D with Nystrom features against ``landmarks`` [..., r, d] (default:
    ``rank`` points drawn as a model's landmarks are at initialisation, N(0, 0.5^2), seed 0), chunks of ``chunk``."""
    if solver == LOWRANK:
        return lowrank_solve(x, t, eps, kernel, landmarks, rank, chunk, with_c=False)[3].square().cumsum(-1)
    L, y, _ = _prefix(x, t, eps, kernel, solver)
    return prefix_magnitude_from_factor(y)


@_array_api
def prefix_weights(x, t=1.0, *, eps: float = 0.0, kernel: str = "gaussian", solver: str = "cholesky",
                   landmarks=None, rank: int = RANK, chunk: int = CHUNK):
    """w [..., N]: the weight of point j inside its own prefix {1..j}, y_j / L_jj (exact, causal; solver="lowrank"
    as in :func:`prefix_magnitude`)."""
    if solver == LOWRANK:
        return lowrank_solve(x, t, eps, kernel, landmarks, rank, chunk, with_c=False)[2]
    L, y, _ = _prefix(x, t, eps, kernel, solver)
    return own_prefix_weights_from_factor(L, y)


@_array_api
def prefix_weight_matrix(x, t=1.0, *, eps: float = 0.0, kernel: str = "gaussian", solver: str = "cholesky",
                         landmarks=None, rank: int = RANK, chunk: int = CHUNK):
    """M [..., N, N]: M_ij = weight of point j inside the prefix {1..i} (j <= i; 0 above the diagonal; solver="lowrank"
    as in :func:`prefix_magnitude`)."""
    if solver == LOWRANK:
        phi, lam, _, _, c = lowrank_solve(x, t, eps, kernel, landmarks, rank, chunk)
        return prefix_weight_matrix_lowrank(phi, lam, c)
    L, y, _ = _prefix(x, t, eps, kernel, solver)
    return prefix_weight_matrix_from_factor(L, y)


__all__ = [
    "APPLY", "CAUSAL_FORMS", "FORMS", "GATES", "KERNELS", "PRIOR_FLOOR", "SOLVERS", "SolveInfo",
    "similarity", "pairwise_distances", "tikhonov", "cholesky_jitter", "cg_solve", "relative_residual",
    "solve_weights", "prefix_factor", "prefix_magnitude_from_factor", "own_prefix_weights_from_factor",
    "prefix_weight_matrix_from_factor", "gate", "log_prior",
    "magnitude_weights", "magnitude", "prefix_magnitude", "prefix_weights", "prefix_weight_matrix",
]
