"""Parameterless ("boneless") attention as a consensus algorithm (the Boneless write-up).

One step moves every point towards an attention-weighted mix of all points, with q = k = v = x (no weights)::

    x <- (1 - s) x + s A(x),   A(x) = softmax(g x^ x^') x        x^_i = x_i / ||x_i||  (QK-norm: cosine times g)

``normalizer="none"`` replaces softmax by the raw correlation (A(x) = g x^ x^' x, or g x x' x without QK-norm);
``kernel="rbf"`` uses softmax(-g ||x_i - x_j||^2 / 2) x, which is Gaussian *blurring mean shift* with bandwidth
sigma^2 = 1/g (Cheng 1995, "Mean shift, mode seeking, and clustering", with the data moved each step;
Carreira-Perpinan 2006, "Fast nonparametric clustering with Gaussian blurring mean-shift"). On unit vectors the
two kernels coincide (||x^_i - x^_j||^2 = 2 - 2 cos), so QK-norm consensus is blurring mean shift of the
directions. Points that attend mostly to each other merge; clusters then stay apart for a long time
(metastability: Geshkovski, Letrouit, Polyanskiy & Rigollet 2023, "A mathematical perspective on Transformers").

Cluster rule (:func:`count_clusters`): the connected components of the graph joining two points when their
Euclidean distance is at most ``radius`` (single linkage cut at ``radius``).

Without softmax the raw correlation x <- x x' x explodes (:func:`raw_correlation_growth`): with x = U S V',
x x' x = U S^3 V', so the singular vectors stay and each singular value follows sigma -> (1 - s) sigma + s sigma^3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.sparse import coo_matrix
from scipy.sparse.csgraph import connected_components
from scipy.spatial import cKDTree

from ..atomic import atomic_path
from ..functional.attention import attention

__all__ = ["ConsensusResult", "attention_step", "consensus", "count_clusters", "spread", "blobs",
           "raw_correlation_growth", "save_frames", "plot_cluster_counts"]


def spread(x: torch.Tensor) -> float:
    """RMS distance of the points to their mean, sqrt(mean_i ||x_i - mean(x)||^2): the scale radii are relative to."""
    return float((x - x.mean(0)).pow(2).sum(-1).mean().sqrt())


def count_clusters(x, radius: float) -> tuple[int, np.ndarray]:
    """(number of clusters, label per point): connected components of {(i, j): ||x_i - x_j|| <= radius}.

    Exact either way: a k-d tree lists the pairs in low dimension (d <= 8), a dense distance matrix otherwise.
    """
    x = torch.as_tensor(x).detach().double().cpu()
    n = x.shape[0]
    if x.shape[1] <= 8:
        pairs = cKDTree(x.numpy()).query_pairs(radius, output_type="ndarray")
        adjacency = coo_matrix((np.ones(len(pairs)), (pairs[:, 0], pairs[:, 1])), shape=(n, n))
    else:
        adjacency = (torch.cdist(x, x) <= radius).numpy()
    count, labels = connected_components(adjacency, directed=False)
    return int(count), labels


def attention_step(x: torch.Tensor, step_size: float = 1.0, scale: float = 1.0, *, qk_norm: bool = True,
                   normalizer: str = "softmax", kernel: str = "dot") -> torch.Tensor:
    """One consensus step on points x [N, d]: (1 - s) x + s attention(q, k, v = x) (module docstring)."""
    qk = F.normalize(x, dim=-1) if qk_norm else x  # x^_i = x_i / ||x_i||: dot logits become g cos(x_i, x_j)
    mixed = attention(qk[None, None], qk[None, None], x[None, None], scale=scale, normalizer=normalizer,
                      kernel=kernel)[0, 0]  # A(x)_i = sum_j p_ij x_j
    return (1.0 - step_size) * x + step_size * mixed  # x <- (1 - s) x + s A(x)


@dataclass
class ConsensusResult:
    """The iterates x_0 .. x_K ([K+1, N, d]), the cluster count of each, the final labels and the rule used."""

    trajectory: torch.Tensor
    clusters: list[int]
    labels: np.ndarray
    radius: float
    converged: bool  # stopped early because max_i ||x_i(t+1) - x_i(t)|| <= tol (times spread(x_0) if relative)
    settings: dict = field(default_factory=dict)

    @property
    def steps(self) -> int:
        return self.trajectory.shape[0] - 1

    @property
    def final(self) -> torch.Tensor:
        return self.trajectory[-1]


def consensus(x, steps: int = 50, step_size: float = 0.5, scale: float = 10.0, *, qk_norm: bool = True,
              normalizer: str = "softmax", kernel: str = "dot", tol: float = 1e-6, radius: float = 1e-2,
              relative: bool = True, count_every: int = 1) -> ConsensusResult:
    """Iterate :func:`attention_step` on points x [N, d] up to ``steps`` times.

    radius and tol are multiples of spread(x_0) when ``relative`` (the default), else absolute. Stops early
    when no point moves more than tol (converged). Cluster counts use :func:`count_clusters` at ``radius``,
    on every ``count_every``-th frame and the last (0: the last only; None elsewhere; -1 for a non-finite frame).
    """
    x = torch.as_tensor(x)
    if not x.is_floating_point():
        x = x.double()
    if x.dim() != 2 or x.shape[0] < 1:
        raise ValueError(f"consensus needs points of shape [N, d], got {tuple(x.shape)}")
    unit = spread(x) if relative else 1.0
    unit = unit if unit > 0 else 1.0  # all points equal: one cluster already
    radius_abs, tol_abs = radius * unit, tol * unit
    frames, converged = [x], False
    for _ in range(steps):
        nxt = attention_step(frames[-1], step_size, scale, qk_norm=qk_norm, normalizer=normalizer, kernel=kernel)
        frames.append(nxt)
        if not torch.isfinite(nxt).all():
            break  # raw correlation can overflow; the caller sees the non-finite frame
        if float((nxt - frames[-2]).norm(dim=-1).max()) <= tol_abs:
            converged = True
            break
    trajectory = torch.stack(frames)
    last = len(trajectory) - 1
    counted = [t == last or (count_every > 0 and t % count_every == 0) for t in range(last + 1)]
    clusters = [None if not c else count_clusters(f, radius_abs)[0] if torch.isfinite(f).all() else -1
                for c, f in zip(counted[:-1], trajectory[:-1])]
    if torch.isfinite(trajectory[-1]).all():
        count, labels = count_clusters(trajectory[-1], radius_abs)
    else:
        count, labels = -1, np.zeros(len(x), dtype=int)
    clusters.append(count)
    settings = dict(step_size=step_size, scale=scale, qk_norm=qk_norm, normalizer=normalizer, kernel=kernel,
                    tol=tol_abs, radius=radius_abs)
    return ConsensusResult(trajectory, clusters, labels, radius_abs, converged, settings)


def blobs(n: int, k: int, dim: int = 2, radius: float = 3.0, std: float = 0.3, seed: int = 0) -> tuple:
    """(points [n, dim] float64, true labels): k Gaussian blobs (std ``std``) with centres at distance ``radius``
    from the origin, k directions spread evenly on a circle (dim >= 2; extra coordinates 0) so that QK-norm
    (cosine) tells them apart."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % k
    angles = 2 * math.pi * labels.double() / k
    centres = torch.zeros(n, dim, dtype=torch.float64)
    centres[:, 0], centres[:, 1] = radius * angles.cos(), radius * angles.sin()
    return centres + std * torch.randn(n, dim, generator=g, dtype=torch.float64), labels.numpy()


def raw_correlation_growth(x, steps: int = 10, step_size: float = 1.0, max_norm: float = 1e30) -> dict:
    """Iterate x <- (1 - s) x + s x x' x (softmax-free, unscaled correlation, the Boneless write-up part 1) and record norms.

    With x_0 = U S V' (SVD) every iterate is U f^t(S) V', f(sigma) = (1 - s) sigma + s sigma^3 (f is increasing,
    so the order of the singular values is kept). Hence, exactly:
        spectral norm  ||x_t||_2 = f^t(sigma_1);   for s = 1: sigma_1^(3^t) = lambda_1^(3^t / 2), lambda_1 the top
        eigenvalue of the Gram matrix x x' (the log-norm grows geometrically, by x3 per step);
        row norms      ||x_t[i]||^2 = sum_j U_ij^2 f^t(sigma_j)^2.
    Stops before the iterate whose spectral norm would exceed ``max_norm`` (default 1e30, so that float32,
    max 3.4e38, never overflows), and says so in "stopped".
    Returns max_row_norm, spectral_norm, predicted_spectral_norm, predicted_max_row_norm (lists over t = 0..),
    gram_top_eigenvalue, stopped (None or a sentence).
    """
    x = torch.as_tensor(x)
    x = x if x.is_floating_point() else x.double()
    u, sig, _ = torch.linalg.svd(x.double(), full_matrices=False)

    def f(s):  # the singular-value map of one step
        return (1.0 - step_size) * s + step_size * s**3

    out = {"max_row_norm": [], "spectral_norm": [], "predicted_spectral_norm": [], "predicted_max_row_norm": [],
           "gram_top_eigenvalue": float(sig[0] ** 2), "step_size": step_size, "stopped": None}
    pred = sig.clone()
    for t in range(steps + 1):
        out["max_row_norm"].append(float(x.norm(dim=-1).max()))
        out["spectral_norm"].append(float(torch.linalg.matrix_norm(x.double(), ord=2)))
        out["predicted_spectral_norm"].append(float(pred[0]))
        out["predicted_max_row_norm"].append(float(((u**2) @ pred**2).sqrt().max()))
        if t == steps:
            break
        nxt = f(pred)
        if float(nxt[0]) > max_norm:
            out["stopped"] = (f"stopped after {t} iterations: the next would have spectral norm "
                              f"{float(nxt[0]):.3g} > {max_norm:.0e}")
            break
        x = (1.0 - step_size) * x + step_size * (x @ x.T @ x)  # x <- (1 - s) x + s x x' x
        pred = nxt
    return out


# ------------------------------------------------------------------------------------------------- plots


def _figure(size=(4.5, 4.5)):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, dpi=100)
    FigureCanvasAgg(fig)
    return fig


def save_frames(result: ConsensusResult, out_dir, every: int = 5) -> list[Path]:
    """frame_XXX.png every ``every`` iterations (and the last): the first two coordinates of the points, coloured
    by final cluster, with the iteration and the cluster count in the title; axes fixed by x_0."""
    out_dir = Path(out_dir)
    traj = result.trajectory.double()
    lo, hi = traj[0, :, :2].min(0).values, traj[0, :, :2].max(0).values
    pad = 0.05 * float((hi - lo).max()) + 1e-9
    ticks = sorted(set(range(0, result.steps + 1, max(1, every))) | {result.steps})
    paths = []
    for t in ticks:
        fig = _figure()
        ax = fig.add_subplot()
        pts = traj[t].numpy()
        ax.scatter(pts[:, 0], pts[:, 1] if pts.shape[1] > 1 else 0 * pts[:, 0], s=12, c=result.labels % 10,
                   cmap="tab10", vmin=0, vmax=9)
        ax.set_xlim(float(lo[0]) - pad, float(hi[0]) + pad)
        if pts.shape[1] > 1:
            ax.set_ylim(float(lo[1]) - pad, float(hi[1]) + pad)
        ax.set_aspect("equal")
        count = result.clusters[t]
        ax.set_title(f"iteration {t}" + (f": {count} clusters" if count is not None else ""))
        fig.tight_layout()
        path = out_dir / f"frame_{t:03d}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format="png")
        paths.append(path)
    return paths


def plot_cluster_counts(result: ConsensusResult, path, growth: dict | None = None) -> Path:
    """clusters against iteration (and, if given, the raw-correlation max row norm on a log axis beside it)."""
    fig = _figure((9, 3.8) if growth else (4.5, 3.8))
    ax = fig.add_subplot(1, 2 if growth else 1, 1)
    counted = [(t, c) for t, c in enumerate(result.clusters) if c is not None and c >= 0]
    ax.plot([t for t, _ in counted], [c for _, c in counted], "o-", markersize=3)
    ax.set_xlabel("iteration")
    ax.set_ylabel(f"clusters (radius {result.radius:.3g})")
    ax.grid(alpha=0.3)
    if growth:
        ax2 = fig.add_subplot(1, 2, 2)
        ax2.semilogy(growth["max_row_norm"], "o-", label="measured max ||x_i||")
        ax2.semilogy(growth["predicted_max_row_norm"], "x--", label="predicted from SVD")
        ax2.set_xlabel("iteration of x <- x x' x")
        ax2.legend()
        ax2.grid(alpha=0.3)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)
