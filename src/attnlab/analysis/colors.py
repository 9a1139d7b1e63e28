"""Clustering the colours of an image with parameterless attention (the Boneless write-up), against k-means.

Pixels are points in RGB space [0, 1]^3. A random subsample of them is iterated with consensus attention
(:func:`attnlab.analysis.consensus.consensus`) until it has merged into clusters; by default with the RBF kernel,
softmax(-g ||x_i - x_j||^2 / 2) x, which is Gaussian blurring mean shift with bandwidth sigma = 1/sqrt(g)
(Cheng 1995; see the consensus module). Then:

    palette_c   = mean of the *original* sampled colours in cluster c    (clusters under min_fraction dropped)
    recolour(p) = argmin_c ||p - palette_c||                                for every pixel of the full image
    MSE         = mean over pixels and channels of (recoloured - original)^2,  PSNR = 10 log10(1 / MSE)  (peak 1)

k-means (scipy.cluster.vq.kmeans2, k-means++ seeding; Lloyd 1982, Arthur & Vassilvitskii 2007) is given the same
subsample and the same number of colours; both recolour the full image by the nearest palette colour.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from scipy.cluster.vq import kmeans2

from ..atomic import atomic_path
from ..errors import ConfigError
from ..rundir import RESULTS_FILE
from .consensus import consensus

__all__ = ["DEFAULT_IMAGE", "ColorResult", "default_image_path", "load_image", "recolor", "mse", "psnr",
           "consensus_palette", "kmeans_palette", "cluster_colors", "save_color_outputs", "format_table"]

DEFAULT_IMAGE = "grace_hopper.jpg"  # ships with matplotlib (mpl-data/sample_data)


def default_image_path() -> Path:
    """matplotlib's sample photograph of Grace Hopper (600 x 512 JPEG)."""
    from matplotlib import cbook

    return Path(cbook.get_sample_data(DEFAULT_IMAGE, asfileobj=False))


def load_image(path=None) -> np.ndarray:
    """RGB image as float64 [H, W, 3] in [0, 1] (grey images are repeated, alpha is dropped); default: the
    matplotlib sample photograph. ConfigError (one line, naming the file) if it is missing or unreadable."""
    import matplotlib.image as mpimg

    path = default_image_path() if path is None else Path(path)
    if not path.is_file():
        raise ConfigError(f"image {path} not found")
    try:
        img = np.asarray(mpimg.imread(path))
    except Exception as e:  # Pillow's errors vary by format; the message is kept on one line
        raise ConfigError(f"cannot read image {path}: {' '.join(str(e).split())}") from None
    img = img.astype(np.float64) / 255.0 if np.issubdtype(img.dtype, np.integer) else img.astype(np.float64)
    if img.ndim == 2:
        img = np.repeat(img[..., None], 3, axis=-1)
    if img.ndim != 3 or img.shape[-1] not in (3, 4) or img.size == 0:
        raise ConfigError(f"image {path} has shape {img.shape}; expected an RGB(A) or grey image")
    return np.clip(img[..., :3], 0.0, 1.0)


def mse(a: np.ndarray, b: np.ndarray) -> float:
    """Mean squared error over every pixel and channel."""
    return float(np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2))


def psnr(err: float) -> float:
    """Peak signal-to-noise ratio in dB for peak value 1: 10 log10(1 / MSE)."""
    return float("inf") if err <= 0 else float(10.0 * np.log10(1.0 / err))


def recolor(image: np.ndarray, palette: np.ndarray, chunk: int = 1 << 16) -> tuple[np.ndarray, np.ndarray]:
    """(image with every pixel replaced by its nearest palette colour, label per pixel [H, W])."""
    pixels = torch.from_numpy(np.ascontiguousarray(image.reshape(-1, 3), dtype=np.float64))
    pal = torch.from_numpy(np.asarray(palette, np.float64))
    labels = torch.cat([torch.cdist(p, pal).argmin(1) for p in pixels.split(chunk)])  # argmin_c ||p - palette_c||
    return pal[labels].numpy().reshape(image.shape), labels.numpy().reshape(image.shape[:2])


@dataclass
class ColorResult:
    """One method's palette [k, 3] (by decreasing share of the sample), its image, errors and times."""

    method: str
    palette: np.ndarray
    recolored: np.ndarray
    mse: float
    psnr: float
    fit_s: float  # finding the palette on the subsample
    recolor_s: float  # assigning every pixel of the image
    info: dict = field(default_factory=dict)

    @property
    def colors(self) -> int:
        return len(self.palette)


def consensus_palette(pixels: np.ndarray, *, scale: float = 300.0, steps: int = 50, step_size: float = 1.0,
                      kernel: str = "rbf", qk_norm: bool = False, radius: float = 0.01, tol: float = 1e-5,
                      min_fraction: float = 0.005) -> tuple[np.ndarray, dict]:
    """Palette from consensus attention on sampled colours [n, 3]: cluster means (radius and tol in RGB units).

    Clusters holding less than ``min_fraction`` of the sample are dropped (their pixels go to the nearest kept
    colour); the largest cluster is always kept. Returns (palette sorted by size, info)."""
    x = torch.from_numpy(np.asarray(pixels, np.float64))
    res = consensus(x, steps=steps, step_size=step_size, scale=scale, kernel=kernel, qk_norm=qk_norm, tol=tol,
                    radius=radius, relative=False, count_every=0)
    counts = np.bincount(res.labels)
    order = np.argsort(-counts, kind="stable")
    keep = [c for c in order if counts[c] >= min_fraction * len(x)] or [order[0]]
    palette = np.stack([pixels[res.labels == c].mean(0) for c in keep])  # palette_c = mean of cluster c
    info = {"clusters": int(res.clusters[-1]), "kept": len(keep), "steps": res.steps, "converged": res.converged,
            "shares": (counts[keep] / len(x)).tolist()}
    return palette, info


def kmeans_palette(pixels: np.ndarray, k: int, seed: int = 0) -> np.ndarray:
    """k colours by k-means (scipy.cluster.vq.kmeans2, k-means++ init), sorted by decreasing cluster size."""
    centroids, labels = kmeans2(np.asarray(pixels, np.float64), k, minit="++", seed=np.random.default_rng(seed))
    counts = np.bincount(labels, minlength=k)
    return centroids[np.argsort(-counts, kind="stable")]


def cluster_colors(image: np.ndarray | None = None, *, samples: int = 2000, seed: int = 0,
                   **consensus_kw) -> dict:
    """Consensus-attention palette vs k-means with as many colours vs the 1-colour (mean) baseline.

    image: [H, W, 3] floats in [0, 1] (default: :func:`load_image`). ``samples`` pixels are drawn without
    replacement (seeded) for both methods; ``consensus_kw`` goes to :func:`consensus_palette`.
    Returns {"consensus": ColorResult, "kmeans": ColorResult, "mean": ColorResult, "samples": n, "settings"}.
    """
    image = load_image() if image is None else np.asarray(image, np.float64)
    flat = image.reshape(-1, 3)
    rng = np.random.default_rng(seed)
    n = min(samples, len(flat))
    pixels = flat[rng.choice(len(flat), n, replace=False)]
    out = {"samples": n, "image_shape": list(image.shape), "settings": dict(consensus_kw)}

    t0 = time.perf_counter()
    palette, info = consensus_palette(pixels, **consensus_kw)
    t1 = time.perf_counter()
    out["consensus"] = _result("consensus attention", image, palette, t1 - t0, info)

    t0 = time.perf_counter()
    palette = kmeans_palette(pixels, len(palette), seed)
    t1 = time.perf_counter()
    out["kmeans"] = _result("k-means", image, palette, t1 - t0)
    out["mean"] = _result("1 colour (mean)", image, pixels.mean(0, keepdims=True), 0.0)
    return out


def _result(method, image, palette, fit_s, info=None) -> ColorResult:
    t0 = time.perf_counter()
    recolored, _ = recolor(image, palette)
    recolor_s = time.perf_counter() - t0
    err = mse(recolored, image)
    return ColorResult(method, palette, recolored, err, psnr(err), fit_s, recolor_s, info or {})


def format_table(result: dict) -> str:
    """A markdown table: method, colours, MSE, PSNR, fit and recolour time."""
    lines = ["| method | colours | MSE | PSNR dB | fit s | recolour s |", "|---|---|---|---|---|---|"]
    for key in ("consensus", "kmeans", "mean"):
        r = result[key]
        lines.append(f"| {r.method} | {r.colors} | {r.mse:.5f} | {r.psnr:.2f} | {r.fit_s:.3f} | {r.recolor_s:.3f} |")
    return "\n".join(lines)


def save_color_outputs(result: dict, out_dir) -> list[Path]:
    """palette.png (both palettes as swatch rows), recolored.png, recolored_kmeans.png, results.json."""
    import json

    import matplotlib.image as mpimg
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out_dir = Path(out_dir)
    paths = []
    for key, name in (("consensus", "recolored.png"), ("kmeans", "recolored_kmeans.png")):
        with atomic_path(out_dir / name) as tmp:
            mpimg.imsave(tmp, np.clip(result[key].recolored, 0, 1), format="png")
        paths.append(out_dir / name)
    k = result["consensus"].colors
    fig = Figure(figsize=(max(4.0, 0.5 * k + 2), 2.2), dpi=100)
    FigureCanvasAgg(fig)
    for row, key in enumerate(("consensus", "kmeans")):
        ax = fig.add_subplot(2, 1, row + 1)
        ax.imshow(result[key].palette[None], aspect="auto")
        ax.set_yticks([])
        ax.set_xticks(range(k))
        ax.set_ylabel(key, rotation=0, ha="right", va="center")
    fig.tight_layout()
    with atomic_path(out_dir / "palette.png") as tmp:
        fig.savefig(tmp, format="png")
    paths.append(out_dir / "palette.png")
    summary = {key: {"colors": r.colors, "mse": r.mse, "psnr": r.psnr, "fit_s": r.fit_s, "recolor_s": r.recolor_s,
                     "palette": r.palette.tolist(), **r.info}
               for key, r in result.items() if isinstance(r, ColorResult)}
    summary.update(samples=result["samples"], image_shape=result["image_shape"], settings=result["settings"])
    from ..atomic import write_text

    paths.append(write_text(out_dir / RESULTS_FILE, json.dumps(summary, indent=2) + "\n"))
    return paths
