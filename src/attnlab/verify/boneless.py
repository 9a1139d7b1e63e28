"""The Boneless write-up (Boneless attention): raw-correlation mixing, its explosion and its "consensus", self-interaction,
sharpening by scaled logits, and the rank of Gaussian weights.

Measured with attnlab's code (attnlab.functional.attention for the parameterless layer q = k = v = x,
attnlab.analysis.consensus.raw_correlation_growth, attnlab.analysis.rank.pseudo_rank) against independent
closed forms: the SVD of x (x <- x x' x maps U S V' to U S^3 V'), entropy written out in float64, numpy's
matrix_rank, and the Marchenko-Pastur law integrated by scipy's quad. The training claims (the six steps'
loss curves) are measured by `attnlab compare --experiment boneless`; see the README.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import integrate, optimize

from ..analysis.consensus import attention_step, raw_correlation_growth
from ..analysis.rank import pseudo_rank
from ..functional import attention
from .ledger import check

F64 = torch.float64


def _points(n: int = 64, dim: int = 2, seed: int = 0, half_plane: bool = False) -> torch.Tensor:
    """n points ~ N(0, I_dim) (float64); half_plane: |x|, so every pair is less than 90 degrees apart."""
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=F64)
    return x.abs() if half_plane else x


def _pair_angles(x: torch.Tensor) -> torch.Tensor:
    """Angles (radians) of the pairs i < j of the rows of x."""
    u = x / x.norm(dim=-1, keepdim=True)
    i, j = torch.triu_indices(len(x), len(x), 1)
    return torch.arccos((u[i] * u[j]).sum(-1).clamp(-1.0, 1.0))


def _raw_mix(x: torch.Tensor, steps: int) -> torch.Tensor:
    """``steps`` layers of y = (x x') x: the consensus step with s = 1, no QK-norm, normalizer "none", scale 1.
    Each iterate is divided by its spectral norm (angles do not change; without it 10 steps overflow float64)."""
    for _ in range(steps):
        x = attention_step(x, step_size=1.0, scale=1.0, qk_norm=False, normalizer="none")
        x = x / torch.linalg.matrix_norm(x, ord=2)
    return x


@check("corr-explodes", writeup="boneless", claimed=0.0, label="26 log10 sigma_1", relation="=", tolerance=1e-9,
       basis="float64 rounding of 3 matrix products, in log10",
       claim="Mixing tokens by raw correlation, x <- (x x') x, explodes their length: log10 of the growth of the "
             "spectral norm over 3 steps (64 points ~ N(0, I_2)), against U S V' -> U S^3 V', i.e. sigma_1^(3^t)")
def corr_explodes(steps: int = 3) -> dict:
    x = _points()
    growth = raw_correlation_growth(x, steps=steps)
    sigma1 = float(np.linalg.svd(x.numpy(), compute_uv=False)[0])
    measured = math.log10(growth["spectral_norm"][steps] / growth["spectral_norm"][0])
    return {"measured": measured, "claimed": (3**steps - 1) * math.log10(sigma1),
            "note": f"sigma_1 = {sigma1:.4f}; ||x_t||_2 for t = 0..{steps}: "
                    + ", ".join(f"{v:.3g}" for v in growth["spectral_norm"]),
            "details": {"sigma_1": sigma1, "spectral_norm": growth["spectral_norm"]}}


@check("double-sharpens", writeup="boneless", claimed=0.0, relation="<=", tolerance=1e-12,
       basis="float64 rounding of entropy sums of 64 terms",
       claim="Doubling the correlations before the softmax sharpens ('sparsifies') the weights: max over rows of "
             "H(softmax(2 x x' / sqrt(d))) - H(softmax(x x' / sqrt(d))), entropy H in nats (64 tokens, d = 16)")
def double_sharpens(factor: float = 2.0) -> dict:
    """factor: the multiplier of the logits (0.5 halves them, which flattens the weights)."""
    x = _points(64, 16, seed=1)[None, None]
    scale = 1.0 / math.sqrt(16)

    def entropy(s: float) -> torch.Tensor:
        _, w = attention(x, x, x, scale=s, return_weights=True)
        return -(w * torch.log(w.clamp_min(1e-300))).sum(-1)

    h, h_scaled = entropy(scale), entropy(factor * scale)
    return {"measured": float((h_scaled - h).max()),
            "note": f"mean entropy {float(h.mean()):.3f} -> {float(h_scaled.mean()):.3f} nats (uniform: "
                    f"{math.log(64):.3f}); d/dbeta H(softmax(beta z)) = -beta Var_w(z) <= 0"}


def _self_max_fraction(dim: int) -> float:
    x = _points(64, dim, seed=2)
    gram = x @ x.T
    return float((gram.argmax(-1) == torch.arange(64)).double().mean())


@check("self-interaction", writeup="boneless", claimed=1.0, relation="=", tolerance=0.0, basis="a count: exact",
       claim="A token's correlation with itself is always very high: fraction of rows of x x' whose diagonal "
             "x_i.x_i is the row's largest entry (64 tokens ~ N(0, I_64))")
def self_interaction(dim: int = 64) -> dict:
    return {"measured": _self_max_fraction(dim),
            "note": f"d = {dim}: x_i.x_i ~ d, x_i.x_j ~ +-sqrt(d) for j != i"}


@check("self-interaction-2d", writeup="boneless", kind="obs", claimed=0.5, relation="<=", tolerance=0.0,
       basis="a count: exact", claim="[obs] A dimension effect: in 2-D (the write-up's pictures) the diagonal is the "
       "row maximum of x x' for few points, since x_i.x_j = |x_i||x_j| cos > |x_i|^2 for a longer x_j at a "
       "small angle; with QK-norm it always is (cos <= 1): the same fraction for 64 points ~ N(0, I_2)")
def self_interaction_2d() -> dict:
    return {"measured": _self_max_fraction(2)}


@check("corr-consensus", writeup="boneless", claimed=1.0, relation="=", tolerance=0.0, basis="a count: exact",
       expect="refuted", because="x_t = U S^(3^t) V' sends every row to +-v_1 and the sign of its u_1 component picks "
       "the side: a fifth of the pairs under 90 degrees move apart, towards 180 degrees (row corr-consensus-sign)",
       claim="Repeated raw-correlation mixing moves vectors less than 90 degrees apart closer together: fraction "
             "of such pairs (64 points ~ N(0, I_2)) whose angle has shrunk after 10 steps")
def corr_consensus(steps: int = 10, half_plane: bool = False) -> dict:
    """half_plane: points with positive coordinates (the Gram matrix is positive, so by Perron-Frobenius u_1 has
    one sign and every pair converges)."""
    x = _points(half_plane=half_plane)
    before, after = _pair_angles(x), _pair_angles(_raw_mix(x, steps))
    close = before < math.pi / 2
    shrank = (after < before)[close].double().mean()
    return {"measured": float(shrank), "details": {"pairs_under_90": int(close.sum())},
            "note": f"{int(close.sum())} pairs under 90 degrees; the others end at 0 or 180 degrees too"}


@check("corr-consensus-sign", writeup="boneless", kind="obs", claimed=1.0, relation="=", tolerance=0.0,
       basis="a count: exact", claim="[obs] What decides it: x_t = U S^(3^t) V' aligns every row with +-v_1, so "
       "rows i, j end together iff u_i1 u_j1 > 0 (u_1: top left-singular vector of x), whatever their angle: "
       "fraction of all pairs for which (angle after 10 steps < 90 degrees) == (u_i1 u_j1 > 0)")
def corr_consensus_sign(steps: int = 10) -> dict:
    x = _points()
    u = torch.linalg.svd(x, full_matrices=False)[0][:, 0]
    i, j = torch.triu_indices(len(x), len(x), 1)
    together = _pair_angles(_raw_mix(x, steps)) < math.pi / 2
    return {"measured": float((together == (u[i] * u[j] > 0)).double().mean())}


@check("gaussian-full-rank", writeup="boneless", claimed=1.0, relation="=", tolerance=0.0, basis="a count: exact",
       claim="Weights sampled from a normal distribution begin 100% full rank: numerical rank / n of a 128 x 128 "
             "N(0, 0.02^2) matrix (numpy.linalg.matrix_rank)")
def gaussian_full_rank(n: int = 128) -> dict:
    w = np.random.default_rng(0).normal(0.0, 0.02, (n, n))
    return {"measured": np.linalg.matrix_rank(w) / n}


def marchenko_pastur_pseudo_rank(mass: float = 0.95) -> float:
    """Limit n -> inf of the pseudo-rank of an n x n i.i.d. Gaussian matrix: with the eigenvalues of W'W / n
    distributed as p(l) = sqrt(l (4 - l)) / (2 pi l) on [0, 4] (Marchenko & Pastur 1967, aspect ratio 1), find
    tau with int_tau^4 l p(l) dl = mass (the mean of l is 1) and return int_tau^4 p(l) dl."""
    def p(lam):
        return math.sqrt(lam * (4.0 - lam)) / (2.0 * math.pi * lam)

    def energy_above(tau):
        return integrate.quad(lambda lam: lam * p(lam), tau, 4.0)[0]

    tau = optimize.brentq(lambda t: energy_above(t) - mass, 1e-12, 4.0)
    return integrate.quad(p, tau, 4.0)[0]


@check("gaussian-pseudo-rank", writeup="boneless", kind="obs", claimed=0.0, label="{v} (M-P)", relation="=",
       tolerance=0.005, basis="5x the seed-to-seed sd (0.0009) at n = 512",
       claim="[obs] ... yet by the 95% pseudo-rank they start at about 0.61, not 1: attnlab's pseudo_rank of a "
             "512 x 512 N(0, 0.02^2) matrix against the Marchenko-Pastur limit (quadrature)")
def gaussian_pseudo_rank(n: int = 512) -> dict:
    w = torch.from_numpy(np.random.default_rng(0).normal(0.0, 0.02, (n, n)))
    return {"measured": pseudo_rank(torch.linalg.svdvals(w)), "claimed": marchenko_pastur_pseudo_rank()}
