"""The leaderboard (docs/leaderboard.md, results/leaderboard.png) against independent computations from the
per-run numbers in results/, and complete: every shipped comparison is on it or listed as left off with a reason."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import docs_generate, last_logged
from scipy import stats

from attnlab.experiments.figures import is_current
from attnlab.experiments.leaderboard import Entry, family, leaderboard

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
generate = docs_generate()


def _finals(name: str, variant: str, key: str) -> list[float]:
    results = json.loads((RESULTS / name / "results.json").read_text())
    row = next(r for r in results["variants"] if r["variant"] == variant)
    return [run[key] for run in row["runs"] if run.get("status") == "finished"]


def _entry(name: str, variant: str) -> Entry:
    return next(e for e in leaderboard(RESULTS, [name]) if e.variant == variant)


@pytest.mark.parametrize("name, variant", [("magnitude-long", "magnitude-causal"),
                                           ("magnitude-long", "magnitude-causal-lowrank")])
def test_a_corpus_cell_is_welchs_interval_of_the_final_losses(name, variant):
    """A language-model comparison without a declared primary metric: Welch's interval of the final losses."""
    a, b = _finals(name, variant, "final_val_loss"), _finals(name, "standard", "final_val_loss")
    ci = stats.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    e = _entry(name, variant)
    assert e.n == len(a) and not e.higher_is_better
    assert e.delta == pytest.approx(np.mean(a) - np.mean(b), rel=1e-9)
    assert (e.low, e.high) == pytest.approx((ci.low, ci.high), rel=1e-9)  # both from the same float64 numbers


def test_a_task_cell_is_in_percent_and_higher_is_better():
    e = _entry("recall-mqar-1", "magnitude-causal-linear")
    results = json.loads((RESULTS / "recall-mqar-1" / "results.json").read_text())
    rows = {r["variant"]: r for r in results["variants"]}
    accuracy = rows["magnitude-causal-linear"]["final_val_accuracy"]["mean"]
    assert e.higher_is_better and e.mean == pytest.approx(100 * accuracy)
    assert e.verdict == -1 and e.high < 0  # 48.48% against 100%: worse, its interval below 0


@pytest.mark.parametrize("name, variant, verdict", [("boneless", "residual-qk", 1), ("magnitude", "magnitude-causal", -1),
                                                    ("magnitude", "magnitude-prefix", -1)])
def test_a_declared_primary_loss_is_paired_over_seeds_and_lower_is_better(name, variant, verdict):
    """boneless and magnitude declare the final validation loss as their primary metric: the cell is the mean of the
    per-seed differences (the seeds share the data order), with the study's BCa interval (scipy's here), and a lower
    loss is better."""
    e = _entry(name, variant)
    results = json.loads((RESULTS / name / "results.json").read_text())
    runs = {r["variant"]: {run["seed"]: run["final_val_loss"] for run in r["runs"] if run.get("status") == "finished"}
            for r in results["variants"]}
    seeds = sorted(runs[variant].keys() & runs["standard"].keys())
    diffs = np.array([runs[variant][s] - runs["standard"][s] for s in seeds])
    assert len(seeds) == 5 and not e.higher_is_better and e.ci_method == "BCa bootstrap"
    assert e.delta == pytest.approx(diffs.mean(), rel=1e-9)
    ci = stats.bootstrap((diffs,), np.mean, n_resamples=9999, method="BCa", rng=np.random.default_rng(0)).confidence_interval
    assert (e.low, e.high) == pytest.approx((ci.low, ci.high), rel=1e-9)
    # residual-qk: lower than standard in every seed; the magnitude gates higher in every seed; Holm p below 0.05
    assert (e.high < 0 if verdict == 1 else e.low > 0) and e.verdict == verdict


def test_a_declared_primary_metric_takes_the_studys_paired_interval():
    e = _entry("hijack-v2-1", "count-prior")
    count = last_logged(RESULTS / "hijack-v2-1", "count-prior", "hijack/exact-m32/accuracy")
    std = last_logged(RESULTS / "hijack-v2-1", "standard", "hijack/exact-m32/accuracy")
    seeds = sorted(count.keys() & std.keys())
    assert e.delta == pytest.approx(100 * np.mean([count[s] - std[s] for s in seeds]), rel=1e-9)
    assert e.ci_method == "BCa bootstrap" and e.low < e.delta < e.high and e.verdict == 1


def test_a_comparison_against_an_unconverged_baseline_says_so():
    e = _entry("hijack-v2-4", "count-prior")
    assert e.baseline_not_converged == 5
    assert "not converged" in generate.leaderboard_block(ROOT / "docs" / "leaderboard.md")


def test_the_unconverged_baseline_runs_counted_are_those_of_the_compared_seeds():
    """Where a variant has run some of the baseline's seeds, the count is over those seeds, from the summaries."""
    name = "hijack-v2-7"
    mine = sorted(int(d.name[4:]) for d in (RESULTS / name / "qk-norm").glob("seed*"))
    base = {s: json.loads((RESULTS / name / "standard" / f"seed{s}" / "summary.json").read_text())["converged"]
            for s in range(10)}
    assert sum(not base[s] for s in mine) > 0  # part 7's first seeds include standard's capped seed 2
    e = _entry(name, "qk-norm")
    assert e.baseline_not_converged == sum(not base[s] for s in mine)
    runs = "run" if e.baseline_not_converged == 1 else "runs"
    assert (f"(against a `standard` with {e.baseline_not_converged} {runs} not converged)"
            in generate.leaderboard_block(ROOT / "docs" / "leaderboard.md"))


def test_families():
    assert [family(v) for v in ("standard", "gqa", "magnitude-prefix-logits", "count-prior", "low-temperature",
                                "boneless-corr", "mla", "moh", "no-such-variant")] == [
        "softmax", "softmax", "magnitude", "controls", "controls", "projections", "projections", "heads", "other"]


def test_every_shipped_comparison_is_on_the_leaderboard_or_left_off_with_a_reason():
    shipped = {p.parent.name for p in RESULTS.glob("*/results.json")} | {p.parent.name for p in RESULTS.glob("*/sweep.json")}
    listed = set(generate.LEADERBOARD) | set(generate.LEFT_OFF)
    assert shipped == listed, (shipped - listed, listed - shipped)
    assert not set(generate.LEADERBOARD) & set(generate.LEFT_OFF)


def test_the_heatmap_is_current():
    entries = generate.leaderboard_entries()
    assert is_current(generate.LEADERBOARD_PLOT, generate.leaderboard_key(entries)), "run `python docs/generate.py`"


def test_a_benchmark_says_which_positions_it_has():
    """dilution-nope-1 trains mqar as dilution-mqar-1 does but without positional encoding: its benchmark is another
    one, and its label says how it differs (the label is all a reader of the table sees); the language model's
    learned positions, GPT-2's and the model's default, go unnamed."""
    from attnlab.experiments.leaderboard import _benchmark_label

    labels = {name: _benchmark_label(json.loads((ROOT / "results" / name / "results.json").read_text())["base_config"])
              for name in ("dilution-mqar-1", "dilution-nope-1", "dilution-lm-1")}
    assert ", RoPE" in labels["dilution-mqar-1"]
    assert labels["dilution-nope-1"] == labels["dilution-mqar-1"].replace(", RoPE", ", no positions")
    assert "positions" not in labels["dilution-lm-1"] and "RoPE" not in labels["dilution-lm-1"]


def test_speed_is_a_ratio_only_between_runs_on_one_machine():
    """dilution-mqar-3 copies standard's CPU runs beside GPU runs: no tokens/s ratio; hijack-v2-6 (all on one H100)
    has the ratio of the runs' mean tokens/s, recomputed from their summary.json."""
    assert _entry("dilution-mqar-3", "magnitude-prefix-logits-lowrank").speed is None
    mean = {v: np.mean([json.loads(p.read_text())["tokens_per_s"]
                        for p in (RESULTS / "hijack-v2-6" / v).glob("seed*/summary.json")])
            for v in ("standard", "differential")}
    assert _entry("hijack-v2-6", "differential").speed == pytest.approx(mean["differential"] / mean["standard"])


def test_a_speed_against_a_reused_baseline_is_marked():
    """noisy-gates-2 reuses dilution-noisy-1's standard runs (their summary.json names the directory they trained
    in): its speed ratios carry the mark and the note; dilution-noisy-1's own variants were timed beside their
    standard and do not."""
    def trained_in(name, variant):
        return {Path(json.loads(p.read_text())["run_dir"]).parent.parent.name
                for p in (RESULTS / name / variant).glob("seed*/summary.json")}

    assert trained_in("noisy-gates-2", "standard") == {"dilution-noisy-1"} != trained_in("noisy-gates-2", "magnitude-prefix-linear")
    assert trained_in("dilution-noisy-1", "standard") == trained_in("dilution-noisy-1", "qk-norm")
    assert _entry("noisy-gates-2", "magnitude-prefix-linear").speed_apart
    assert not _entry("dilution-noisy-1", "qk-norm").speed_apart and _entry("dilution-noisy-1", "qk-norm").speed
    page = (ROOT / "docs" / "leaderboard.md").read_text()
    row = next(line for line in page.splitlines() if "`magnitude-prefix-linear`" in line and "noisy-gates-2" in line)
    assert f"{_entry('noisy-gates-2', 'magnitude-prefix-linear').speed:.2f}x†" in row
    assert "were not timed side by side" in page


def test_a_verdict_needs_the_holm_adjusted_test_as_well_as_the_interval():
    """noisy-threshold-1: identity-qk's bootstrap interval lies below 0, but the paired t-test against standard,
    Holm-adjusted over the comparison's three variants (scipy and statsmodels on each run's summary.json), does
    not reject: no verdict, and the row shows the adjusted p instead of **worse**."""
    from statsmodels.stats.multitest import multipletests

    name, variants = "noisy-threshold-1", ("identity-qk", "residual-qk", "low-rank")
    acc = {v: [json.loads((RESULTS / name / v / f"seed{s}" / "summary.json").read_text())["final_val_accuracy"]
               for s in range(5)] for v in ("standard", *variants)}
    adjusted = multipletests([stats.ttest_rel(acc[v], acc["standard"]).pvalue for v in variants], method="holm")[1]
    e = _entry(name, "identity-qk")
    assert e.p_holm == pytest.approx(adjusted[0], rel=1e-9) and e.p_holm > 0.05
    assert e.side == -1 and e.high < 0 and e.verdict == 0
    page = (ROOT / "docs" / "leaderboard.md").read_text()
    row = next(line for line in page.splitlines() if "`identity-qk`" in line and name in line)
    assert f"(Holm p = {adjusted[0]:.3g})" in row and "**worse**" not in row


@pytest.mark.filterwarnings("ignore:Precision loss occurred")
def test_without_a_primary_metric_holm_runs_over_the_comparisons_welch_tests():
    """recall-mqar-1 (no declared primary): each variant's Holm p is Holm over the Welch tests of every variant's
    final accuracies against standard's, recomputed with scipy and statsmodels from the runs."""
    from statsmodels.stats.multitest import multipletests

    name = "recall-mqar-1"
    results = json.loads((RESULTS / name / "results.json").read_text())
    variants = [r["variant"] for r in results["variants"] if r["variant"] != results["baseline"]]

    def finals(v):
        return [json.loads(p.read_text())["final_val_accuracy"] for p in sorted((RESULTS / name / v).glob("seed*/summary.json"))]

    base = finals("standard")
    ps = [stats.ttest_ind(finals(v), base, equal_var=False).pvalue for v in variants]
    tested = [(v, p) for v, p in zip(variants, ps) if np.isfinite(p)]
    adjusted = dict(zip([v for v, _ in tested], multipletests([p for _, p in tested], method="holm")[1]))
    entries = {e.variant: e for e in leaderboard(RESULTS, [name])}
    for v, p in adjusted.items():
        assert entries[v].p_holm == pytest.approx(p, rel=1e-6), v
    assert any(e.verdict for e in entries.values()) and all(
        e.verdict == (e.side if e.p_holm is not None and e.p_holm < 0.05 else 0) for e in entries.values())
