"""Every shipped report is what today's code gives: regenerating a results directory (as the README advises,
`attnlab report results/NAME`) rewrites report.md, results.json, sweep.md and sweep.json byte for byte and leaves
every plot alone, so it never dirties a checkout; a missing or stale plot is redrawn."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from attnlab.experiments.figures import KEY_FIELD, inputs_key, is_current
from attnlab.experiments.grid_sweep import write_sweep_report
from attnlab.experiments.report import write_report
from attnlab.rundir import COMPARE_SPEC_FILE, CURVES_FILE

RESULTS = Path(__file__).resolve().parents[1] / "results"
COMPARISONS = sorted(p.parent for p in RESULTS.glob("*/compare.toml")) + sorted(
    p.parent for p in RESULTS.glob("*/*/compare.toml") if p.parent.parent.joinpath("sweep.json").exists())
SWEEPS = sorted(p.parent for p in RESULTS.glob("*/sweep.json") if any(p.parent.glob("*=*/compare.toml")))
REPORT_FILES = ("report.md", "results.json", "sweep.md", "sweep.json")


def _snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*"))
            if p.is_file() and (p.name in REPORT_FILES or p.suffix == ".png") and p.parent == directory}


def test_every_results_directory_is_covered():
    assert len(COMPARISONS) >= 25 and SWEEPS, (COMPARISONS, SWEEPS)


@pytest.mark.parametrize("shipped", COMPARISONS + SWEEPS, ids=lambda p: str(p.relative_to(RESULTS)))
def test_regenerating_a_shipped_report_changes_nothing(shipped, tmp_path):
    copy = tmp_path / shipped.name
    shutil.copytree(shipped, copy)
    before = _snapshot(copy)
    (write_sweep_report if shipped in SWEEPS else write_report)(copy)
    after = _snapshot(copy)
    assert sorted(after) == sorted(before), "files added or removed"
    changed = [name for name in before if after[name] != before[name]]
    assert not changed, f"{shipped.relative_to(RESULTS)}: `attnlab report` rewrites {changed}"


def test_a_missing_or_stale_plot_is_redrawn(tmp_path):
    shipped = RESULTS / "magnitude"
    copy = tmp_path / "magnitude"
    shutil.copytree(shipped, copy)
    (copy / CURVES_FILE).unlink()
    write_report(copy)
    assert (copy / CURVES_FILE).read_bytes() == (shipped / CURVES_FILE).read_bytes()  # redrawn as shipped

    from PIL import Image

    with Image.open(copy / CURVES_FILE) as image:  # a plot from other inputs carries another key: stale
        image.save(copy / CURVES_FILE, pnginfo=_pnginfo(KEY_FIELD, "another key"))
    assert not is_current(copy / CURVES_FILE, inputs_key("anything"))
    write_report(copy)
    assert (copy / CURVES_FILE).read_bytes() == (shipped / CURVES_FILE).read_bytes()


def _pnginfo(key: str, value: str):
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    info.add_text(key, value)
    return info


def test_the_key_changes_with_the_inputs():
    assert inputs_key([1.0, 2.0]) == inputs_key([1.0, 2.0]) != inputs_key([1.0, 2.5])
    assert not is_current(Path("/nonexistent.png"), inputs_key(1)) and not is_current(Path("x.png"), None)


def test_the_compare_spec_is_what_the_report_names():
    assert all((d / COMPARE_SPEC_FILE).exists() for d in COMPARISONS)
