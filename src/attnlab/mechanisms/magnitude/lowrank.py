"""Causal magnitude weights of a low-rank-plus-diagonal similarity, chunk by chunk (the Magnitude Attention
write-up's weights).

The exact causal forms factor Z + eps I [T, T] (O(T^3)). Here Z is replaced by

    Z ~ Phi Phi' + D,   D_jj = 1 - ||phi_j||^2     so that Z_jj = 1 holds exactly,
    A = Lambda + Phi Phi',   Lambda = D + eps I    (diagonal, > 0 for eps > 0)

with features phi_j [r] that depend on key j alone (:func:`nystrom_features`: Nystrom features against r
landmark points, so that Phi Phi' <= Z in the PSD order and D >= 0). For every prefix {1..i}, A_i mu^(i) = 1.
By Woodbury, with S_i = I + sum_{m<=i} phi_m phi_m' / lambda_m, u_i = sum_{m<=i} phi_m / lambda_m, c_i = S_i^-1 u_i:

    M_ij = mu^(i)_j = (1 - phi_j' c_i) / lambda_j          key j's weight inside query i's prefix (j <= i)
    w_j  = M_jj                                            key j's weight inside its own prefix
    |X_1..i| = sum_{j<=i} M_ij = sum_{k<=i} y_k^2          y = L^-1 1, A = L L'

Chunks of C positions make it parallel, in O(T r^2 + T C (r + C)) time. For the chunk c after the positions p
before it, block Cholesky of A gives

    B_c   = Lambda_c + Phi_c S_p^-1 Phi_c' = L_c L_c'     the Schur complement of the past (Woodbury), C x C
    y_c   = L_c^-1 (1 - Phi_c c_p)                       since L_cp y_p = A_cp A_pp^-1 1 = Phi_c c_p
    w_c   = y_c / diag(L_c)
    c_i   = c_p + S_p^-1 sum_{m<=i in c} y_m (L_c^-1 Phi_c)_m   (the Kalman update of c_p by the chunk's rows)

S_p and u_p are exclusive prefix sums over chunks, so every chunk is solved at once (batched), and row i of every
output depends on keys 1..i only (causal by construction; trailing padding cannot reach back). Autograd
differentiates the whole computation (Cholesky and triangular solves).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ...functional.scores import squared_distances
from .names import CHUNK, EPS, RANK  # noqa: F401  (their home: .names)
from .names import LOWRANK as SOLVER  # the name of this solver beside the exact ones (.names)

__all__ = ["CHUNK", "EPS", "LANDMARK_INIT_STD", "RANK", "SOLVER", "default_landmarks", "lowrank_prefix", "nystrom_features",
           "prefix_weight_matrix_lowrank"]

LANDMARK_INIT_STD = 0.5  # landmarks start as N(0, 0.5^2) points: the spread of a GPT's keys at init (weights of std
#   0.02 on unit-variance inputs give key coordinates of std 0.02 sqrt(n_embd): 0.23 at n_embd 128, 0.55 at 768)

LANDMARK_JITTER = 1e-6  # added to K_LL's diagonal: landmarks that (nearly) coincide keep a factorable K_LL; any
#   jitter >= 0 keeps Phi Phi' = K_nL (K_LL + jitter I)^-1 K_Ln <= K_nL K_LL^+ K_Ln <= Z, hence D >= 0


def nystrom_features(x: torch.Tensor, landmarks: torch.Tensor, t=1.0, *, jitter: float = LANDMARK_JITTER):
    """(phi [..., T, r], d [..., T]): Nystrom features of points x [..., T, dim] against landmarks [..., r, dim] for
    the Gaussian kernel k(a, b) = exp(-t ||a - b||^2 / dim) of the Magnitude Attention write-up, and the diagonal d_j = 1 - ||phi_j||^2.

        phi_j = R^-1 k_L(x_j),   K_LL + jitter I = R R'     (Williams and Seeger 2001, "the Nystrom method")

    so phi_j' phi_l = k_L(x_j)' (K_LL + jitter I)^-1 k_L(x_l) is the kernel's projection onto the landmarks' span.
    d_j lies in [0, 1] (clamped against rounding): 0 for a point on a landmark, 1 for one far from all of them.
    t: a number or a tensor over the leading dims."""
    dim, r = x.shape[-1], landmarks.shape[-2]
    jitter = max(jitter, 10 * r * torch.finfo(x.dtype).eps)  # float32: above the rounding of K_LL's entries
    t = torch.as_tensor(t, dtype=x.dtype, device=x.device)
    t = t[..., None, None] if t.dim() else t
    k_xl = torch.exp(-t * squared_distances(x, landmarks) / dim)  # [..., T, r]
    k_ll = torch.exp(-t * squared_distances(landmarks, landmarks) / dim)
    eye = torch.eye(k_ll.shape[-1], dtype=x.dtype, device=x.device)
    r_factor = torch.linalg.cholesky(k_ll + jitter * eye)
    phi = torch.linalg.solve_triangular(r_factor, k_xl.mT, upper=False).mT  # phi' = R^-1 k_L(x)'
    return phi, (1.0 - phi.square().sum(-1)).clamp_min(0.0)


def _exclusive_cumsum(x: torch.Tensor, dim: int) -> torch.Tensor:
    return torch.cumsum(x, dim) - x


def lowrank_prefix(phi: torch.Tensor, lam: torch.Tensor, chunk: int = 64, with_c: bool = True):
    """(w [..., T], y [..., T], c [..., T, r]) for A = diag(lam) + Phi Phi' (see the module docstring): w_j = key j's
    weight inside its own prefix, y = L^-1 1 (so |X_1..i| = cumsum(y^2)), c_i = S_i^-1 u_i (so M_ij =
    (1 - phi_j' c_i) / lam_j: :func:`prefix_weight_matrix_lowrank`). phi [..., T, r], lam [..., T] > 0.
    chunk: positions per block (the same numbers for every chunk size, up to rounding). with_c=False skips c
    (None), which only M needs: the causal gate reads w alone."""
    *lead, n, r = phi.shape
    pad = -n % chunk
    if pad:  # padding after the last position changes nothing before it
        phi, lam = F.pad(phi, (0, 0, 0, pad)), F.pad(lam, (0, pad), value=1.0)
    k = (n + pad) // chunk
    phi_c = phi.reshape(*lead, k, chunk, r)
    lam_c = lam.reshape(*lead, k, chunk)
    scaled = phi_c / lam_c[..., None]  # phi_m / lambda_m
    eye = torch.eye(r, dtype=phi.dtype, device=phi.device)
    s_p = eye + _exclusive_cumsum(scaled.mT @ phi_c, dim=-3)  # S_p = I + sum over earlier chunks of phi phi'/lambda
    u_p = _exclusive_cumsum(scaled.sum(-2), dim=-2)  # u_p = sum over earlier chunks of phi / lambda
    l_p = torch.linalg.cholesky_ex(s_p)[0]  # S_p = L_p L_p'  (S_p >= I: always factorable; _ex: no device sync)
    c_p = torch.cholesky_solve(u_p[..., None], l_p)[..., 0]  # c_p = S_p^-1 u_p
    v = torch.linalg.solve_triangular(l_p, phi_c.mT, upper=False)  # L_p^-1 Phi_c'  [.., k, r, C]
    b = torch.diag_embed(lam_c) + v.mT @ v  # B_c = Lambda_c + Phi_c S_p^-1 Phi_c'
    l_c = torch.linalg.cholesky_ex(b)[0]  # B_c = L_c L_c'  (B_c >= Lambda_c >= eps I: always factorable)
    rhs = 1.0 - (phi_c @ c_p[..., None])[..., 0]  # 1 - Phi_c c_p
    y = torch.linalg.solve_triangular(l_c, rhs[..., None], upper=False)[..., 0]  # y_c = L_c^-1 (1 - Phi_c c_p)
    w = y / torch.diagonal(l_c, dim1=-2, dim2=-1)  # w_j = y_j / L_jj
    w_out, y_out = w.reshape(*lead, -1)[..., :n], y.reshape(*lead, -1)[..., :n]
    if not with_c:
        return w_out, y_out, None
    g_phi = torch.linalg.solve_triangular(l_c, phi_c, upper=False)  # L_c^-1 Phi_c  [.., k, C, r]
    acc = torch.cumsum(y[..., None] * g_phi, dim=-2)  # sum_{m <= i in chunk} y_m (L_c^-1 Phi_c)_m
    c = c_p[..., None, :] + torch.cholesky_solve(acc.mT, l_p).mT  # c_i = c_p + S_p^-1 acc_i
    return w_out, y_out, c.reshape(*lead, -1, r)[..., :n, :]


def prefix_weight_matrix_lowrank(phi: torch.Tensor, lam: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """M [..., T, T]: M_ij = (1 - phi_j' c_i) / lambda_j for j <= i, 0 above the diagonal."""
    return ((1.0 - c @ phi.mT) / lam[..., None, :]).tril()


def default_landmarks(rank: int, dim: int, like: torch.Tensor, seed: int = 0) -> torch.Tensor:
    """r landmarks [rank, dim] drawn as a model's are at initialisation, N(0, LANDMARK_INIT_STD^2), from a fixed seed
    (the front-ends' choice when no landmarks are given: they depend on no key, so the forms stay causal)."""
    g = torch.Generator().manual_seed(seed)
    return (LANDMARK_INIT_STD * torch.randn(rank, dim, generator=g, dtype=torch.float64)).to(like.dtype).to(like.device)
