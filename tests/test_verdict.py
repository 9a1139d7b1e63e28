"""The verdict of a comparison (attnlab.experiments.verdict, in the report): steps-to-threshold with censored runs,
the primary metric's paired tests, bootstrap CIs and Holm's adjustment, checked against scipy and statsmodels on
planted run directories."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from statsmodels.stats.multitest import multipletests

from attnlab.configio import save_toml
from attnlab.errors import ConfigError
from attnlab.experiments.grid import check_or_write_spec, spec_dict
from attnlab.experiments.report import read_results, write_report
from attnlab.experiments.verdict import check_primary
from attnlab.presets import load_preset
from attnlab.rundir import comparison_run_dir as run_dir

CAP = 1000
VARIANTS = ["standard", "count-prior", "qk-norm"]
SEEDS = [0, 1, 2, 3, 4]
# steps to threshold per seed; None: hit the cap without converging
STEPS = {"standard": [400, 550, None, 700, None], "count-prior": [200, 250, 300, 250, 350],
         "qk-norm": [None, None, None, 900, 600]}
ACC = {"standard": [0.62, 0.70, 0.55, 0.81, 0.60], "count-prior": [0.95, 0.97, 0.91, 0.99, 0.93],
       "qk-norm": [0.66, 0.69, 0.58, 0.80, 0.67]}
METRIC = "hijack/synonym-m32/accuracy"


def plant(out: Path, primary: str | None = METRIC) -> None:
    base = load_preset("tiny").replace(train=load_preset("tiny").train.replace(max_steps=CAP,
                                                                                stop_at="val_accuracy >= 0.99"))
    check_or_write_spec(out, spec_dict(base, VARIANTS, SEEDS, primary))
    for v in VARIANTS:
        for i, seed in enumerate(SEEDS):
            path = run_dir(out, v, seed)
            path.mkdir(parents=True)
            save_toml(base.replace(model=base.model.replace(attention=v), train=base.train.replace(seed=seed)),
                      path / "config.toml")
            reached = STEPS[v][i]
            last = reached or CAP
            rows = [{"step": s, "tokens": s * 64, "train_loss": 1.0, "val_loss": 1.0 - s / 2000,
                     "val_accuracy": 0.5 + s / 4000, METRIC: 0.5} for s in range(0, last, 100)]
            rows.append({"step": last, "tokens": last * 64, "train_loss": 0.5, "val_loss": 0.4,
                         "val_accuracy": 0.99 if reached else 0.9, METRIC: ACC[v][i]})
            (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (path / "summary.json").write_text(json.dumps({
                "status": "finished", "steps": last, "max_steps": CAP, "final_val_loss": 0.4,
                "final_val_accuracy": 0.99 if reached else 0.9, "stop_at": "val_accuracy >= 0.99",
                "threshold_step": reached, "converged": reached is not None, "tokens_per_s": 1000.0,
                "n_params": 100, "variant": v, "seed": seed}))


def _censored(steps):
    return scipy.stats.CensoredData(uncensored=[s for s in steps if s is not None],
                                    right=[CAP for s in steps if s is None])


def test_steps_to_threshold_per_seed_median_and_logrank(tmp_path):
    plant(tmp_path)
    results, _ = read_results(tmp_path)
    conv = {row["variant"]: row for row in results["convergence"]["variants"]}
    assert results["convergence"]["stop_at"] == "val_accuracy >= 0.99"
    # count-prior: nothing censored, so the Kaplan-Meier median is the lower median of the five steps
    assert conv["count-prior"]["median"] == sorted(STEPS["count-prior"])[2] == 250
    assert conv["count-prior"]["n_converged"] == 5
    # standard: 400, 550, 700 reached, two censored at 1000: S drops to 4/5, 3/5, then 2/5 at 700
    assert conv["standard"]["median"] == 700 and conv["standard"]["n_converged"] == 3
    # qk-norm: 3 of 5 censored: S never reaches 1/2, the median is only known to exceed the cap
    assert conv["qk-norm"]["median"] is None and conv["qk-norm"]["median_lower_bound"] == CAP
    want = scipy.stats.logrank(_censored(STEPS["count-prior"]), _censored(STEPS["standard"]))
    assert conv["count-prior"]["logrank_vs_baseline"]["p"] == pytest.approx(want.pvalue, rel=1e-12)
    assert [r["steps"] for r in conv["standard"]["runs"]] == [400, 550, CAP, 700, CAP]
    text = write_report(tmp_path).read_text()
    assert "## Steps to threshold (val_accuracy >= 0.99)" in text
    assert f"| standard | 3/5 | 700 | 400 | 550 | >{CAP} | 700 | >{CAP} | (baseline) |" in text
    assert f"| qk-norm | 2/5 | >{CAP} |" in text
    main = text[text.index("| variant | finished |"):].splitlines()
    assert any(line.startswith("| qk-norm | 5/5 (3/5 not converged) |") for line in main)
    assert any(line.startswith("| count-prior | 5/5 |") for line in main)


def test_primary_metric_paired_tests_bootstrap_and_holm(tmp_path):
    plant(tmp_path)
    results, _ = read_results(tmp_path)
    primary = results["primary"]
    assert primary["metric"] == METRIC and primary["better"] == "higher"
    rows = {row["variant"]: row for row in primary["variants"]}
    p_raw = []
    for v in VARIANTS[1:]:
        row = rows[v]
        want = scipy.stats.ttest_rel(ACC[v], ACC["standard"])
        assert row["paired"] and row["test"]["p"] == pytest.approx(want.pvalue, rel=1e-10)
        d = np.subtract(ACC[v], ACC["standard"])
        assert row["difference"] == pytest.approx(d.mean(), abs=1e-15)
        assert row["ci"]["low"] < d.mean() < row["ci"]["high"]
        p_raw.append(want.pvalue)
    holm = multipletests(p_raw, method="holm")[1]
    assert [rows[v]["p_holm"] for v in VARIANTS[1:]] == pytest.approx(list(holm), rel=1e-12)
    assert rows["standard"]["n_not_converged"] == 2 and rows["count-prior"]["n_not_converged"] == 0
    text = write_report(tmp_path).read_text()
    section = text[text.index(f"## Primary metric: {METRIC}"):]
    s = ACC["standard"]
    assert (f"| standard | 5 | {100 * statistics.mean(s):.2f} ± {100 * statistics.stdev(s):.2f} (2 not converged) "
            "| (baseline) |") in section
    assert "Holm's adjustment over the 2 tests against standard" in section


def test_paired_over_the_shared_seeds_and_unpaired_without_two(tmp_path):
    plant(tmp_path)
    (run_dir(tmp_path, "qk-norm", 4) / "summary.json").unlink()  # still going: seed 4 drops out of its test
    results, _ = read_results(tmp_path)
    row = {r["variant"]: r for r in results["primary"]["variants"]}["qk-norm"]
    want = scipy.stats.ttest_rel(ACC["qk-norm"][:4], ACC["standard"][:4])
    assert row["paired"] and row["n_compared"] == 4 and row["test"]["p"] == pytest.approx(want.pvalue, rel=1e-10)
    for seed in (1, 2, 3):
        (run_dir(tmp_path, "standard", seed) / "summary.json").unlink()
    results, _ = read_results(tmp_path)  # standard: seeds 0 and 4; qk-norm: 0-3; one shared seed, so Welch
    row = {r["variant"]: r for r in results["primary"]["variants"]}["qk-norm"]
    want = scipy.stats.ttest_ind(ACC["qk-norm"][:4], [ACC["standard"][0], ACC["standard"][4]], equal_var=False)
    assert not row["paired"] and row["test"]["p"] == pytest.approx(want.pvalue, rel=1e-10)
    table = write_report(tmp_path).read_text()
    assert "| Welch | — |" in table  # the pairs column counts paired seeds: none under Welch, not the 4 runs
    assert "| Welch | 4 |" not in table


def test_the_primary_tests_again_over_the_converged_runs_only(tmp_path):
    """Where a run hit its cap, the report repeats the tests over the seeds where both sides converged; the
    paired tests are scipy's over those seeds, Holm over the family."""
    plant(tmp_path)
    results, _ = read_results(tmp_path)
    rows = {row["variant"]: row for row in results["primary_converged"]["variants"]}
    both = {v: [i for i in range(len(SEEDS)) if STEPS[v][i] and STEPS["standard"][i]] for v in VARIANTS[1:]}
    assert both == {"count-prior": [0, 1, 3], "qk-norm": [3]}
    want = scipy.stats.ttest_rel([ACC["count-prior"][i] for i in both["count-prior"]],
                                 [ACC["standard"][i] for i in both["count-prior"]])
    row = rows["count-prior"]
    assert row["paired"] and row["n_compared"] == 3 and row["test"]["p"] == pytest.approx(want.pvalue, rel=1e-10)
    # qk-norm shares one converged seed with standard: Welch over each side's converged runs
    converged = {v: [ACC[v][i] for i in range(len(SEEDS)) if STEPS[v][i]] for v in VARIANTS}
    want_qk = scipy.stats.ttest_ind(converged["qk-norm"], converged["standard"], equal_var=False)
    assert not rows["qk-norm"]["paired"] and rows["qk-norm"]["test"]["p"] == pytest.approx(want_qk.pvalue, rel=1e-10)
    holm = multipletests([want.pvalue, want_qk.pvalue], method="holm")[1]
    assert [rows[v]["p_holm"] for v in VARIANTS[1:]] == pytest.approx(list(holm), rel=1e-12)
    assert rows["standard"]["summary"]["n"] == 3 and rows["standard"]["n_not_converged"] == 0
    text = write_report(tmp_path).read_text()
    section = text[text.index("## Primary metric over the converged runs only"):text.index("## Steps to threshold")]
    s = converged["standard"]
    assert f"| standard | 3 | {100 * statistics.mean(s):.2f} ± {100 * statistics.stdev(s):.2f} | (baseline) |" in section


def test_holm_counts_only_the_tests_the_converged_runs_allow(tmp_path):
    plant(tmp_path)
    path = run_dir(tmp_path, "qk-norm", 4) / "summary.json"  # qk-norm keeps one converged run: no test
    path.write_text(json.dumps({**json.loads(path.read_text()), "converged": False, "threshold_step": None}))
    results, _ = read_results(tmp_path)
    rows = {row["variant"]: row for row in results["primary_converged"]["variants"]}
    assert rows["qk-norm"]["test"]["p"] is None and rows["qk-norm"]["p_holm"] is None
    assert rows["count-prior"]["p_holm"] == rows["count-prior"]["test"]["p"]  # a family of one: Holm changes nothing
    text = write_report(tmp_path).read_text()
    assert ("Holm's adjustment over the 1 test against standard that the runs allow (of 2: too few runs for the "
            "rest)") in text
    assert "Holm's adjustment over the 2 tests against standard. Detectable" in text  # the first table: both tests


def test_without_a_censored_run_there_is_no_converged_only_table(tmp_path):
    plant(tmp_path)
    for v in VARIANTS:  # every run now met the threshold at the cap's last evaluation
        for seed in SEEDS:
            path = run_dir(tmp_path, v, seed) / "summary.json"
            summary = json.loads(path.read_text())
            path.write_text(json.dumps({**summary, "converged": True, "threshold_step": summary["steps"]}))
    results, _ = read_results(tmp_path)
    assert "primary_converged" not in results
    assert "over the converged runs only" not in write_report(tmp_path).read_text()


def test_a_primary_metric_that_is_the_stop_rules_own_gets_no_converged_only_table(tmp_path):
    plant(tmp_path, primary="val_accuracy")  # every converged run sits at the threshold: nothing to compare
    results, _ = read_results(tmp_path)
    assert results["primary"] is not None and "primary_converged" not in results


def test_no_primary_and_no_rule_leave_the_report_as_it_was(tmp_path):
    plant(tmp_path, primary=None)
    results, _ = read_results(tmp_path)
    assert results["primary"] is None and results["convergence"] is not None
    assert "## Primary metric" not in write_report(tmp_path).read_text()


@pytest.mark.parametrize("bad", ["accuracy", "val loss", 3, "hijack"])
def test_a_bad_primary_is_a_one_line_error(bad):
    with pytest.raises(ConfigError, match="is not a metric") as info:
        check_primary(bad)
    assert "\n" not in str(info.value)
