"""benchmarks/colours.py: the saved run's quality columns are what ``attnlab cluster-colors`` gives now (its own
sampling and recolouring, a separate code path), its ratios are its own medians, and the consensus page shows it."""

import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from helpers import script

ROOT = Path(__file__).resolve().parents[1]
colours = script("benchmarks/colours.py", "colours")

SAVED = ROOT / "results" / "benchmarks" / "colours.json"


def test_the_benchmark_alternates_the_fits_and_takes_medians(monkeypatch):
    clock = iter([0.0, 3.0, 3.0, 3.01, 10.0, 12.0, 12.0, 12.004])  # consensus 3 s then 2 s; k-means 10 ms then 4 ms
    monkeypatch.setattr(colours, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    out = colours.measure([300.0], repeats=2, samples=200)
    (row,) = out["rows"]
    assert row["consensus_fit_s"] == statistics.median([3.0, 2.0])
    assert row["kmeans_fit_s"] == pytest.approx(statistics.median([0.01, 0.004]))
    assert row["ratio"] == pytest.approx(2.5 / 0.007, abs=0.05)
    assert row["ratio_range"] == [300.0, 500.0]


@pytest.mark.slow
def test_saved_quality_is_what_cluster_colors_gives():
    from attnlab.analysis.colors import cluster_colors

    saved = json.loads(SAVED.read_text())
    for row in saved["rows"]:
        now = cluster_colors(scale=row["scale"], samples=saved["samples"], seed=saved["seed"])
        assert (now["consensus"].info["clusters"], now["consensus"].colors) == (row["clusters"], row["kept"])
        # MSE over the 600 x 512 image in float64: the saved values are rounded to 6 decimals
        assert now["consensus"].mse == pytest.approx(row["consensus_mse"], abs=5e-7)
        assert now["kmeans"].mse == pytest.approx(row["kmeans_mse"], abs=5e-7)
        assert now["kmeans"].psnr == pytest.approx(row["kmeans_psnr_db"], abs=0.005)
    assert now["mean"].mse == pytest.approx(saved["mean_colour_mse"], abs=5e-5)


def test_the_consensus_page_and_readme_quote_the_saved_ratios():
    """The README's and the page's "N-Mx faster" is the range of the saved medians, rounded to whole numbers."""
    saved = json.loads(SAVED.read_text())
    ratios = [r["ratio"] for r in saved["rows"]]
    phrase = f"{min(ratios):.0f}-{max(ratios):.0f}x faster"
    assert phrase in (ROOT / "docs" / "studies" / "consensus.md").read_text()
    assert phrase in (ROOT / "README.md").read_text()


@pytest.mark.parametrize("name", ["kernels", "magnitude"])
def test_loading_a_benchmark_leaves_the_import_path_as_it_was(name):
    """A benchmark's folder left on sys.path would shadow installed packages by its scripts' names (kernels.py hides
    the `kernels` package that transformers imports); magnitude.py loads a neighbour, kernels.py does not."""
    import sys

    before = list(sys.path)
    assert script(f"benchmarks/{name}.py", f"benchmark_{name}").__file__.endswith(f"{name}.py")
    assert sys.path == before
