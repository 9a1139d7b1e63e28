"""Benchmark: consensus attention as a colour quantiser against k-means with as many colours, measured in the same run.

For each scale g, the same seeded sample of pixels from the default image goes to
``attnlab.analysis.colors.consensus_palette`` and to ``kmeans_palette`` (with the consensus palette's number of
colours); the two fits alternate over --repeats runs and the medians are compared. The quality columns (clusters,
colours kept, MSE and PSNR of the recoloured image) are deterministic for a seed and do not depend on the timing.

    python benchmarks/colours.py                          # g = 100, 300, 1000; 5 repeats; one CPU thread
    python benchmarks/colours.py --out results/benchmarks/colours.json
Prints one JSON object: per g, the quality of both palettes, the median fit times and their ratio
(consensus / k-means).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import numpy as np
import torch

from attnlab.analysis.colors import consensus_palette, kmeans_palette, load_image, mse, psnr, recolor


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def measure(scales, repeats: int, samples: int = 2000, seed: int = 0) -> dict:
    image = load_image()
    flat = image.reshape(-1, 3)
    pixels = flat[np.random.default_rng(seed).choice(len(flat), min(samples, len(flat)), replace=False)]
    baseline = mse(recolor(image, pixels.mean(0, keepdims=True))[0], image)
    rows = []
    for g in scales:
        times = {"consensus": [], "kmeans": []}
        for _ in range(repeats):
            t, (palette, info) = _timed(lambda: consensus_palette(pixels, scale=g))
            times["consensus"].append(t)
            t, means = _timed(lambda: kmeans_palette(pixels, len(palette), seed))
            times["kmeans"].append(t)
        err_c, err_k = (mse(recolor(image, p)[0], image) for p in (palette, means))
        fit = {k: statistics.median(v) for k, v in times.items()}
        rows.append({"scale": g, "clusters": info["clusters"], "kept": info["kept"],
                     "consensus_mse": round(err_c, 6), "consensus_psnr_db": round(psnr(err_c), 2),
                     "kmeans_mse": round(err_k, 6), "kmeans_psnr_db": round(psnr(err_k), 2),
                     "consensus_fit_s": round(fit["consensus"], 4), "kmeans_fit_s": round(fit["kmeans"], 5),
                     "ratio": round(fit["consensus"] / fit["kmeans"], 1),
                     "ratio_range": [round(min(c / k for c, k in zip(times["consensus"], times["kmeans"])), 1),
                                     round(max(c / k for c, k in zip(times["consensus"], times["kmeans"])), 1)]})
    return {"machine": f"{platform.machine()} {platform.processor() or ''}".strip(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "image_shape": list(image.shape), "samples": len(pixels), "seed": seed,
            "repeats": repeats, "mean_colour_mse": round(baseline, 4), "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", type=float, nargs="+", default=[100.0, 300.0, 1000.0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads for consensus (default 1: k-means runs on one, so the ratio compares "
                             "the algorithms, not thread counts)")
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    result = measure(args.scales, args.repeats)
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
