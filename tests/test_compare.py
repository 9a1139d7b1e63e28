"""attnlab.experiments: statistics against independent formulas, the report from planted run directories,
resumability with a fake trainer, the compare.toml guard, and one real end-to-end comparison."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import shutil
import statistics
import tomllib
from pathlib import Path

import pytest
import scipy.stats
from statsmodels.stats.multitest import multipletests

from attnlab.configio import apply_overrides, load_config, load_toml, save_toml
from attnlab.errors import ConfigError
from attnlab.experiments import compare, describe, run_config, run_dir, welch_ttest, write_report
from attnlab.experiments.grid import check_or_write_spec, spec_dict
from attnlab.presets import load_preset
from attnlab.train.config import RunConfig
from attnlab.train.checkpoint import META, STATE, WEIGHTS

# ------------------------------------------------------------------------------------------------- statistics


def welch_by_hand(a, b):
    """Welch (1947) t and Welch–Satterthwaite (Satterthwaite 1946) df, written out independently."""
    na, nb = len(a), len(b)
    ma, mb = sum(a) / na, sum(b) / nb
    va = sum((x - ma) ** 2 for x in a) / (na - 1)
    vb = sum((x - mb) ** 2 for x in b) / (nb - 1)
    ea, eb = va / na, vb / nb
    t = (ma - mb) / math.sqrt(ea + eb)
    df = (ea + eb) ** 2 / (ea**2 / (na - 1) + eb**2 / (nb - 1))
    return t, df


def test_describe_matches_statistics_module():
    xs = [2.51, 2.47, 2.55, 2.49]
    s = describe(xs)
    assert s.n == 4
    assert s.mean == pytest.approx(statistics.mean(xs), rel=1e-12)
    assert s.std == pytest.approx(statistics.stdev(xs), rel=1e-12)  # ddof=1


def test_describe_small_samples():
    assert describe([]).to_dict() == {"n": 0, "mean": None, "std": None}
    assert describe([3.0]).to_dict() == {"n": 1, "mean": 3.0, "std": None}
    assert describe([3.0, 3.0]).std == 0.0
    with pytest.raises(ValueError, match="non-finite"):
        describe([1.0, float("nan")])


@pytest.mark.parametrize("na,nb,sa,sb,shift", [(2, 2, 0.1, 0.1, 0.0), (3, 5, 0.05, 0.3, 0.2),
                                               (8, 3, 1.0, 0.01, -0.5), (4, 4, 0.02, 0.02, 0.01)])
def test_welch_matches_independent_formula_and_scipy(na, nb, sa, sb, shift):
    rng = random.Random(na * 100 + nb)
    a = [2.0 + shift + rng.gauss(0, sa) for _ in range(na)]
    b = [2.0 + rng.gauss(0, sb) for _ in range(nb)]
    res = welch_ttest(a, b)
    t, df = welch_by_hand(a, b)
    assert res.t == pytest.approx(t, rel=1e-9)
    assert res.df == pytest.approx(df, rel=1e-9)
    assert min(na, nb) - 1 <= res.df <= na + nb - 2  # Welch–Satterthwaite bounds
    assert res.p == pytest.approx(scipy.stats.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-9)
    assert res.p == pytest.approx(2 * scipy.stats.t.sf(abs(t), df), rel=1e-9)  # two-sided, from the formulas
    assert res.reason is None


def test_welch_sign_and_known_value():
    # a = [1, 2, 3], b = [2, 3, 5]: means 2 and 10/3, variances 1 and 7/3 -> t = -(4/3)/sqrt(10/9) = -1.2649,
    # df = (10/9)^2 / ((1/3)^2/2 + (7/9)^2/2) = 3.4483
    res = welch_ttest([1, 2, 3], [2, 3, 5])
    assert res.t == pytest.approx(-(4 / 3) / math.sqrt(10 / 9), rel=1e-12)
    assert res.df == pytest.approx((10 / 9) ** 2 / ((1 / 9) / 2 + (49 / 81) / 2), rel=1e-12)
    assert welch_ttest([2, 3, 5], [1, 2, 3]).t == pytest.approx(-res.t)


def test_welch_undefined_cases_are_none_not_nan():
    one = welch_ttest([2.5], [2.4, 2.6])
    assert (one.t, one.df, one.p) == (None, None, None) and "2 values" in one.reason
    flat = welch_ttest([2.5, 2.5], [2.4, 2.4])
    assert (flat.t, flat.df, flat.p) == (None, None, None) and "zero variance" in flat.reason
    half = welch_ttest([2.5, 2.5, 2.5], [2.3, 2.4])  # one flat sample: defined, df = n_other - 1
    t, df = welch_by_hand([2.5, 2.5, 2.5], [2.3, 2.4])
    assert half.t == pytest.approx(t) and half.df == pytest.approx(df) == 1.0
    assert 0 < half.p < 1


# ------------------------------------------------------------------------------------- fake runs and a fake trainer

STEPS = (10, 20, 30)


def tiny() -> RunConfig:
    return load_preset("tiny")


def plant_run(path: Path, cfg: RunConfig, status: str, final: float, *, tokens_per_s=1000.0, n_params=5000,
              curve=None, checkpoint=False, summary=True, accuracy=None) -> None:
    """A run directory as the trainer writes it: config.toml, metrics.jsonl, summary.json, checkpoint/."""
    path.mkdir(parents=True, exist_ok=True)
    save_toml(cfg, path / "config.toml")
    curve = curve or {s: final + (30 - s) * 0.01 for s in STEPS}
    with open(path / "metrics.jsonl", "w") as f:
        for step in range(1, max(curve) + 1):
            row = {"step": step, "tokens": step * 256, "train_loss": 3.0, "val_loss": curve.get(step), "lr": 1e-3,
                   "grad_norm": 1.0, "tokens_per_s": tokens_per_s, "step_time_s": 0.01}
            f.write(json.dumps(row) + "\n")
    if checkpoint:  # complete as find_checkpoint judges it: weights, state and meta.json with the step
        folder = path / "checkpoint"
        folder.mkdir(exist_ok=True)
        (folder / WEIGHTS).write_bytes(b"")
        (folder / STATE).write_bytes(b"")
        (folder / META).write_text(json.dumps({"step": max(curve)}))
    if summary:
        (path / "summary.json").write_text(json.dumps({
            "status": status, "steps": max(curve), "final_val_loss": final if status != "diverged" else float("nan"),
            "best_val_loss": min(curve.values()), "tokens_seen": max(curve) * 256, "wall_time_s": 1.0,
            "n_params": n_params, "tokens_per_s": tokens_per_s, "mfu": None,
            "variant": cfg.variant_name, "seed": cfg.train.seed,
            **({"final_val_accuracy": accuracy} if accuracy is not None else {}),
        }))


class FakeTrainer:
    """Same signature as attnlab.train.train; records its calls and writes a plausible run directory."""

    def __init__(self, outcomes=None):
        self.calls = []  # (variant, seed, "fresh" | "resume", cfg or None)
        self.outcomes = outcomes or {}  # (variant, seed) -> status

    def __call__(self, cfg, *, resume=None, quiet=False):
        if resume is not None:
            assert cfg is None
            path = Path(resume)
            cfg = load_config(RunConfig, path / "config.toml")
            self.calls.append((cfg.variant_name, cfg.train.seed, "resume", None))
        else:
            path = Path(cfg.out_dir)
            assert not path.exists() or not any(path.iterdir()), "fresh runs must start in a clean directory"
            self.calls.append((cfg.variant_name, cfg.train.seed, "fresh", cfg))
        status = self.outcomes.get((cfg.variant_name, cfg.train.seed), "finished")
        final = 2.0 + 0.1 * ["standard", "gqa", "mqa"].index(cfg.variant_name) + 0.01 * cfg.train.seed
        plant_run(path, cfg, status, final, checkpoint=True)
        if status == "diverged":  # like the real trainer: summary.json first, then an exception
            raise RuntimeError("training diverged at step 30")
        return json.loads((path / "summary.json").read_text())


def table_rows(report: Path) -> dict[str, list[str]]:
    """The main markdown table of report.md as {variant: cells}."""
    rows = {}
    for line in report.read_text().splitlines():
        if line.startswith("| variant |"):
            if rows:
                break
            continue
        if line.startswith("|---"):
            continue
        if line.startswith("| "):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
        elif rows:
            break
    return rows


# ---------------------------------------------------------------------------------------------------- the report


def test_report_gives_accuracy_as_it_gives_loss(tmp_path):
    """Runs that logged final_val_accuracy (a task's answer accuracy) get a table of mean ± std in % and a Welch
    test against the baseline, checked against statistics and scipy; runs without it (older runs) get none."""
    base = tiny()
    variants, seeds = ["standard", "mqa"], [0, 1, 2]
    check_or_write_spec(tmp_path, spec_dict(base, variants, seeds))
    accs = {"standard": [0.99, 0.97, 1.0], "mqa": [0.5, 0.62, 0.41]}
    for v in variants:
        for i, seed in enumerate(seeds):
            cfg = base.replace(model=base.model.replace(attention=v), train=base.train.replace(seed=seed))
            plant_run(run_dir(tmp_path, v, seed), cfg, "finished", 2.0 + i / 10, accuracy=accs[v][i])
    text = write_report(tmp_path).read_text()
    section = text[text.index("## Final validation accuracy"):]
    table = section[section.index("| variant"):].split("\n\n")[0].splitlines()[2:]
    rows = {c[0]: c[1:] for c in ([x.strip() for x in line.strip("|").split("|")] for line in table)}
    a, b = accs["standard"], accs["mqa"]
    t, df = welch_by_hand(b, a)
    p = scipy.stats.ttest_ind(b, a, equal_var=False).pvalue
    assert rows["standard"] == ["3", f"{100 * statistics.mean(a):.2f} ± {100 * statistics.stdev(a):.2f}",
                                "(baseline)", "—", "—", "—"]
    assert rows["mqa"] == ["3", f"{100 * statistics.mean(b):.2f} ± {100 * statistics.stdev(b):.2f}",
                           f"{100 * (statistics.mean(b) - statistics.mean(a)):+.2f}", f"{t:.2f}", f"{df:.1f}", f"{p:.3g}"]
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["variants"][1]["accuracy_welch_vs_baseline"]["p"] == pytest.approx(p)
    # and each seed's accuracy, in % at two decimals, in seed order (the spread a mean hides)
    per_seed = text[text.index("## Final validation accuracy (%) per seed"):]
    table = per_seed[per_seed.index("| variant"):].split("\n\n")[0].splitlines()
    assert table[0] == "| variant | seed 0 | seed 1 | seed 2 |"
    assert table[2:] == [f"| {v} | " + " | ".join(f"{100 * a:.2f}" for a in accs[v]) + " |" for v in variants]

    older = tmp_path / "older"
    check_or_write_spec(older, spec_dict(base, variants, seeds))
    for v in variants:
        for seed in seeds:
            cfg = base.replace(model=base.model.replace(attention=v), train=base.train.replace(seed=seed))
            plant_run(run_dir(older, v, seed), cfg, "finished", 2.0)
    assert "accuracy" not in write_report(older).read_text()


def test_report_from_planted_runs(tmp_path):
    base = tiny()
    variants, seeds = ["standard", "gqa", "mqa"], [0, 1, 2]
    check_or_write_spec(tmp_path, spec_dict(base, variants, seeds))
    losses = {"standard": [2.50, 2.54, 2.46], "gqa": [2.60, 2.58, 2.65], "mqa": [2.55]}
    speed = {"standard": [1000.0, 1100.0, 1200.0], "gqa": [1500.0, 1600.0, 1700.0], "mqa": [900.0]}
    params = {"standard": 6000, "gqa": 5500, "mqa": 5200}
    for v in variants:
        for i, s in enumerate(seeds):
            cfg = base.replace(model=base.model.replace(attention=v), train=base.train.replace(seed=s))
            if v == "mqa" and s == 1:
                plant_run(run_dir(tmp_path, v, s), cfg, "diverged", 0.0, n_params=params[v])
            elif v == "mqa" and s == 2:
                continue  # never started
            else:
                plant_run(run_dir(tmp_path, v, s), cfg, "finished", losses[v][i], tokens_per_s=speed[v][i],
                          n_params=params[v])
    report = write_report(tmp_path)

    rows = table_rows(report)
    assert list(rows) == variants
    sa, sg = losses["standard"], losses["gqa"]
    t, df = welch_by_hand(sg, sa)
    p = scipy.stats.ttest_ind(sg, sa, equal_var=False).pvalue
    assert rows["standard"] == ["3/3", f"{statistics.mean(sa):.4f} ± {statistics.stdev(sa):.4f}",
                                "(baseline)", "—", "—", "—", "1,100", "6,000"]
    assert rows["gqa"] == ["3/3", f"{statistics.mean(sg):.4f} ± {statistics.stdev(sg):.4f}",
                           f"{statistics.mean(sg) - statistics.mean(sa):+.4f}", f"{t:.2f}", f"{df:.1f}",
                           f"{p:.3g}", "1,600", "5,500"]
    assert rows["mqa"] == ["1/3 (1 diverged)", "2.5500 ± n/a", f"{2.55 - statistics.mean(sa):+.4f}",
                           "n/a", "n/a", "n/a", "900", "5,200"]

    text = report.read_text()
    assert "7,680 tokens per run = 30 steps × 8 batch × 32 block × 1 grad_accum" in text
    assert "preset: `tiny`" in text and "seeds: 0, 1, 2" in text
    assert "mqa seed 1: diverged" in text and "mqa seed 2: missing" in text
    assert "Welch 1947" in text and "Satterthwaite 1946" in text
    assert "gqa: the same attention as standard" in text  # tiny has n_head=2 = gqa's n_kv_head

    results = json.loads((tmp_path / "results.json").read_text())  # strict JSON: no NaN anywhere
    assert results["baseline"] == "standard"
    assert results["settings"]["token_budget"] == 30 * 8 * 32 * 1
    gqa = results["variants"][1]
    assert gqa["final_val_loss"]["mean"] == pytest.approx(statistics.mean(sg))
    assert gqa["final_val_loss"]["std"] == pytest.approx(statistics.stdev(sg))
    assert gqa["welch_vs_baseline"]["t"] == pytest.approx(t)
    assert gqa["welch_vs_baseline"]["df"] == pytest.approx(df)
    assert gqa["welch_vs_baseline"]["p"] == pytest.approx(p)
    assert gqa["same_attention_as_baseline"] is True
    mqa = results["variants"][2]
    assert mqa["same_attention_as_baseline"] is False
    assert mqa["final_val_loss"] == {"n": 1, "mean": 2.55, "std": None}
    assert mqa["welch_vs_baseline"]["t"] is None and mqa["welch_vs_baseline"]["reason"]
    assert [r["status"] for r in mqa["runs"]] == ["finished", "diverged", "missing"]
    assert (tmp_path / "loss_curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_diagnostics_from_planted_metrics(tmp_path):
    """The weight/gate tables: the latest pseudo-rank (logged at evaluations) and magnitude statistics (logged
    per layer at log steps) of each finished run, reduced over layers as documented, then mean ± std over seeds."""
    base = tiny()
    variants, seeds = ["standard", "magnitude-causal"], [0, 1]
    check_or_write_spec(tmp_path, spec_dict(base, variants, seeds))
    rank = {("standard", 0): 0.25, ("standard", 1): 0.35, ("magnitude-causal", 0): 0.5, ("magnitude-causal", 1): 0.7}
    t = {0: (0.9, 1.3), 1: (1.1, 0.7)}  # per layer (L0, L1)
    mu = {0: ((-2.0, 3.0), (-5.0, 1.0)), 1: ((-1.0, 4.0), (-0.5, 9.0))}  # (min, max) of L0, L1
    for v in variants:
        for s in seeds:
            path = run_dir(tmp_path, v, s)
            plant_run(path, base.replace(model=base.model.replace(attention=v), train=base.train.replace(seed=s)),
                      "finished", 2.0 + s * 0.1)
            rows = [{"step": 29, "pseudo_rank/q/mean": 0.99, "participation_ratio/q/mean": 99.0},  # superseded
                    {"step": 30, "val_loss": 2.0, "pseudo_rank/q/mean": rank[v, s],
                     "participation_ratio/q/mean": 10.0 * rank[v, s], "pseudo_rank/q/L0": 0.01}]
            if v == "magnitude-causal":
                rows.append({"step": 30, "mag/L0/t": t[s][0], "mag/L1/t": t[s][1],
                             "mag/L0/mu_min": mu[s][0][0], "mag/L1/mu_min": mu[s][1][0],
                             "mag/L0/mu_max": mu[s][0][1], "mag/L1/mu_max": mu[s][1][1]})
            with open(path / "metrics.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
    report = write_report(tmp_path)
    results = {r["variant"]: r["diagnostics"] for r in json.loads((tmp_path / "results.json").read_text())["variants"]}
    assert set(results["standard"]) == {"pseudo_rank/q/mean", "participation_ratio/q/mean"}
    assert results["standard"]["pseudo_rank/q/mean"]["mean"] == pytest.approx(0.30)
    assert results["standard"]["pseudo_rank/q/mean"]["std"] == pytest.approx(statistics.stdev([0.25, 0.35]))
    mag = results["magnitude-causal"]
    assert mag["mag/t"]["mean"] == pytest.approx(statistics.mean([(0.9 + 1.3) / 2, (1.1 + 0.7) / 2]))
    assert mag["mag/mu_min"]["mean"] == pytest.approx(statistics.mean([-5.0, -1.0]))  # min over layers
    assert mag["mag/mu_max"]["mean"] == pytest.approx(statistics.mean([3.0, 9.0]))  # max over layers
    text = report.read_text()
    assert f"| standard | 0.300 ± {statistics.stdev([0.25, 0.35]):.3f} (PR 3.0 ± 0.7) | n/a" in text
    assert "## Magnitude gates at the end of training" in text
    t_std, lo_std, hi_std = (statistics.stdev(x) for x in ([1.1, 0.9], [-5.0, -1.0], [3.0, 9.0]))
    assert (f"| magnitude-causal | 1.000 ± {t_std:.3f} | n/a | n/a | -3 ± {lo_std:.3g} | 6 ± {hi_std:.3g} | n/a |"
            in text)
    assert "| magnitude-causal | 0.600 ± 0.141 (PR 6.0 ± 1.4) | n/a | n/a |" in text
    assert "prior at floor" not in text  # the column of magnitude_apply="logits" appears only when logged

    for s in seeds:  # a logit prior logs the fraction of its weights at the floor: mean over layers, then seeds
        with open(run_dir(tmp_path, "magnitude-causal", s) / "metrics.jsonl", "a") as f:
            f.write(json.dumps({"step": 30, "mag/L0/prior_floored": 0.1 * s, "mag/L1/prior_floored": 0.3}) + "\n")
    text = write_report(tmp_path).read_text()
    want = statistics.mean([0.15, 0.2]), statistics.stdev([0.15, 0.2])
    assert "| max mu | solve residual | prior at floor |" in text
    assert text.count(f" | {want[0]:.3f} ± {want[1]:.3f} |") == 1


def test_report_loss_during_training_table(tmp_path):
    """Mean ± std of the validation loss at evaluation steps shared by every finished run: a step one run skipped
    is left out, a diverged run does not count, and more than six steps are thinned evenly keeping the ends."""
    base = tiny()
    variants, seeds = ["standard", "gqa"], [0, 1, 2]
    check_or_write_spec(tmp_path, spec_dict(base, variants, seeds))
    evals = [10, 20, 30, 40, 50, 60, 70, 80, 90, 100]  # seed 1 of gqa skips 20: 9 shared steps
    curves = {(v, s): {st: 3.0 - 0.01 * st + 0.1 * i + 0.003 * s * s for st in evals}
              for i, v in enumerate(variants) for s in seeds}
    del curves["gqa", 1][20]
    for (v, s), curve in curves.items():
        cfg = base.replace(model=base.model.replace(attention=v), train=base.train.replace(seed=s))
        status = "diverged" if (v, s) == ("standard", 2) else "finished"
        plant_run(run_dir(tmp_path, v, s), cfg, status, curve[100], curve=curve)
    text = write_report(tmp_path).read_text()
    shared = [10, 30, 40, 50, 60, 70, 80, 90, 100]
    shown = [shared[j] for j in (0, 2, 3, 5, 6, 8)]  # round(i * 8 / 5) for i = 0..5: 0, 1.6, 3.2, 4.8, 6.4, 8
    assert "| variant | " + " | ".join(f"step {st}" for st in shown) + " |" in text
    for v, used in (("standard", [0, 1]), ("gqa", [0, 1, 2])):
        cells = [f"{statistics.mean(curves[v, s][st] for s in used):.4f} ± "
                 f"{statistics.stdev(curves[v, s][st] for s in used):.4f}" for st in shown]
        assert f"| {v} | " + " | ".join(cells) + " |" in text
    assert "Validation loss during training" in text


def test_report_accuracy_during_training_table_and_plot(tmp_path):
    """A task's learning curves: val_accuracy at shared evaluation steps, mean ± std in % over the finished seeds
    (checked against statistics), and accuracy_curves.png; a comparison without accuracies gets neither."""
    base = tiny()
    variants, seeds = ["standard", "gqa"], [0, 1, 2]
    check_or_write_spec(tmp_path, spec_dict(base, variants, seeds))
    evals = (10, 20, 30)
    accs = {(v, s): {st: min(1.0, 0.1 * st / 10 + 0.2 * i + 0.05 * s) for st in evals}
            for i, v in enumerate(variants) for s in seeds}
    for (v, s), acc in accs.items():
        cfg = base.replace(model=base.model.replace(attention=v), train=base.train.replace(seed=s))
        path = run_dir(tmp_path, v, s)
        plant_run(path, cfg, "finished", 2.0, accuracy=acc[30])
        rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
        for row in rows:
            row["val_accuracy"] = acc.get(row["step"])
        (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_report(tmp_path).read_text()
    section = text[text.index("Validation accuracy (%) during training"):]
    assert "| variant | step 10 | step 20 | step 30 |" in section
    for v in variants:
        cells = [f"{100 * statistics.mean(accs[v, s][st] for s in seeds):.2f} ± "
                 f"{100 * statistics.stdev(accs[v, s][st] for s in seeds):.2f}" for st in evals]
        assert f"| {v} | " + " | ".join(cells) + " |" in section
    assert (tmp_path / "accuracy_curves.png").stat().st_size > 0 and "(accuracy_curves.png)" in text

    for v in variants:  # the same runs without accuracies: no table, no plot (a stale one is removed)
        for s in seeds:
            path = run_dir(tmp_path, v, s)
            rows = [json.loads(line) for line in (path / "metrics.jsonl").read_text().splitlines()]
            (path / "metrics.jsonl").write_text("".join(json.dumps({k: r[k] for k in r if k != "val_accuracy"})
                                                        + "\n" for r in rows))
    text = write_report(tmp_path).read_text()
    assert "accuracy (%) during training" not in text and not (tmp_path / "accuracy_curves.png").exists()


def test_report_without_any_finished_run(tmp_path):
    check_or_write_spec(tmp_path, spec_dict(tiny(), ["standard", "gqa"], [0]))
    report = write_report(tmp_path)
    rows = table_rows(report)
    assert rows["standard"][:2] == ["0/1", "n/a"] and rows["gqa"][2:6] == ["n/a"] * 4
    assert not (tmp_path / "loss_curves.png").exists()
    assert "No validation losses logged yet." in report.read_text()


def test_write_report_needs_a_comparison_dir(tmp_path):
    with pytest.raises(ConfigError, match="not a comparison directory"):
        write_report(tmp_path)


# ------------------------------------------------------------------------------------------------- compare()


def test_compare_runs_the_grid_with_identical_settings(tmp_path, capsys):
    fake = FakeTrainer()
    base = tiny().replace(out_dir="ignored")
    report = compare(base, ["standard", "gqa"], [3, 4], tmp_path / "cmp", train_fn=fake)
    assert report == tmp_path / "cmp" / "report.md" and report.exists()
    assert [(v, s, how) for v, s, how, _ in fake.calls] == [
        ("standard", 3, "fresh"), ("gqa", 3, "fresh"), ("standard", 4, "fresh"), ("gqa", 4, "fresh")]  # seed-major
    for v, s, _, cfg in fake.calls:
        assert cfg.out_dir == str(tmp_path / "cmp" / v / f"seed{s}")
        assert cfg.replace(model=cfg.model.replace(attention="standard"), train=cfg.train.replace(seed=1337),
                           out_dir="ignored") == base  # nothing else differs: data, token budget, schedule
    out = capsys.readouterr().out
    assert out.count("starting") == 4 and "[4/4] gqa seed 4: finished" in out
    for name in ("compare.toml", "results.json", "loss_curves.png"):
        assert (tmp_path / "cmp" / name).exists()


def test_compare_resumes(tmp_path):
    out = tmp_path / "cmp"
    variants, seeds = ["standard", "gqa", "mqa"], [0, 1]
    first = FakeTrainer(outcomes={("mqa", 0): "diverged"})
    compare(tiny(), variants, seeds, out, quiet=True, train_fn=first)
    assert len(first.calls) == 6

    # standard/0 finished (kept); standard/1 interrupted with a checkpoint; gqa/0 killed after a checkpoint
    # (no summary); gqa/1 never started; mqa/0 diverged (kept, not retried); mqa/1 killed before any checkpoint
    summary = json.loads((run_dir(out, "standard", 1) / "summary.json").read_text())
    (run_dir(out, "standard", 1) / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    (run_dir(out, "gqa", 0) / "summary.json").unlink()
    shutil.rmtree(run_dir(out, "gqa", 1))
    (run_dir(out, "mqa", 1) / "summary.json").unlink()
    shutil.rmtree(run_dir(out, "mqa", 1) / "checkpoint")

    second = FakeTrainer()
    compare(tiny(), variants, seeds, out, quiet=True, train_fn=second)
    assert [(v, s, how) for v, s, how, _ in second.calls] == [
        ("gqa", 0, "resume"), ("standard", 1, "resume"), ("gqa", 1, "fresh"), ("mqa", 1, "fresh")]

    third = FakeTrainer()
    compare(tiny(), variants, seeds, out, quiet=True, train_fn=third)
    assert third.calls == []
    rows = table_rows(out / "report.md")
    assert rows["mqa"][0] == "1/2 (1 diverged)" and rows["standard"][0] == rows["gqa"][0] == "2/2"


def test_compare_stops_when_a_run_is_interrupted(tmp_path, capsys):
    fake = FakeTrainer(outcomes={("standard", 0): "interrupted"})
    report = compare(tiny(), ["standard", "gqa"], [0, 1], tmp_path, train_fn=fake)
    assert len(fake.calls) == 1 and report.exists()
    assert "rerun the same command to resume" in capsys.readouterr().out
    assert table_rows(report)["standard"][0] == "0/2"


def test_compare_reads_each_runs_state_at_its_turn(tmp_path, capsys):
    """Another process may finish a run, or be writing to it, while the comparison works through its list:
    a run finished meanwhile is not retrained, and a run directory whose lock is held is skipped untouched
    (never deleted as "leftovers"), whatever its state looked like when the comparison started."""
    import fcntl

    base = tiny()
    busy = run_dir(tmp_path, "mqa", 0)
    busy.mkdir(parents=True)
    (busy / "metrics.jsonl").write_text('{"step": 0}\n')  # looks like leftovers: no checkpoint, no summary
    holder = open(busy / ".lock", "w")
    fcntl.flock(holder.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    holder.write("pid 4242 (another trainer)\n")
    holder.flush()

    fake = FakeTrainer()

    def train_and_finish_another(cfg, *, resume=None, quiet=False):
        out = fake(cfg, resume=resume, quiet=quiet)
        if cfg is not None and cfg.variant_name == "standard":  # meanwhile, someone else finishes gqa
            other = run_config(base, "gqa", 0, tmp_path)
            plant_run(run_dir(tmp_path, "gqa", 0), other, "finished", 2.2)
        return out

    try:
        compare(base, ["standard", "gqa", "mqa"], [0], tmp_path, train_fn=train_and_finish_another)
    finally:
        holder.close()
    out = capsys.readouterr().out
    assert [c[:3] for c in fake.calls] == [("standard", 0, "fresh")]
    assert "[2/3] gqa seed 0: already finished, skipped" in out
    assert "[3/3] mqa seed 0: skipped: " in out and "in use by pid 4242 (another trainer)" in out
    assert (busy / "metrics.jsonl").read_text() == '{"step": 0}\n'  # untouched


def test_compare_propagates_a_crash(tmp_path):
    def crashing(cfg, *, resume=None, quiet=False):
        Path(cfg.out_dir).mkdir(parents=True)
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        compare(tiny(), ["standard"], [0, 1], tmp_path, quiet=True, train_fn=crashing)


def test_compare_refuses_a_different_existing_comparison(tmp_path):
    compare(tiny(), ["standard", "gqa"], [0, 1], tmp_path, quiet=True, train_fn=FakeTrainer())
    longer = tiny().replace(train=tiny().train.replace(max_steps=60))
    cases = [
        (longer, ["standard", "gqa"], [0, 1], r"train\.max_steps: 30 -> 60"),
        (tiny(), ["gqa", "standard"], [0, 1], r"baseline \(the first variant\): \['standard'\] -> \['gqa'\]"),
    ]
    for base, variants, seeds, match in cases:
        fake = FakeTrainer()
        with pytest.raises(ConfigError, match=match) as info:
            compare(base, variants, seeds, tmp_path, quiet=True, train_fn=fake)
        assert "\n" not in str(info.value) and "already holds a different comparison" in str(info.value)
        assert fake.calls == []
    # the same comparison, with a different attention/seed/out_dir in the base (set per run anyway): resumes
    same = tiny().replace(out_dir="elsewhere", model=tiny().model.replace(attention="mqa"))
    fake = FakeTrainer()
    compare(same, ["standard", "gqa"], [0, 1], tmp_path, quiet=True, train_fn=fake)
    assert fake.calls == []


def test_an_extended_grid_may_declare_its_primary_metric_but_not_change_it(tmp_path):
    """Seeds added to a grid that declared no primary metric may declare one (for the added runs); a declared
    primary metric is part of the comparison: another one is refused in one line."""
    base, variants = tiny(), ["standard", "gqa"]
    check_or_write_spec(tmp_path, spec_dict(base, variants, [0, 1]))
    assert check_or_write_spec(tmp_path, spec_dict(base, variants, [0, 1, 2], "val_loss"), type(base))
    written = tomllib.loads((tmp_path / "compare.toml").read_text())
    assert written["primary"] == "val_loss" and written["seeds"] == [0, 1, 2]
    with pytest.raises(ConfigError, match=r"primary: 'val_loss' -> 'val_accuracy'") as info:
        check_or_write_spec(tmp_path, spec_dict(base, variants, [0, 1, 2], "val_accuracy"), type(base))
    assert "\n" not in str(info.value)
    # a later part that names the same primary metric resumes
    assert check_or_write_spec(tmp_path, spec_dict(base, variants, [3], "val_loss"), type(base))


def test_compare_in_parts_extends_the_grid(tmp_path):
    """Other seeds or variants on the same settings and baseline extend the comparison: only the new runs train,
    compare.toml lists the union, and the report covers every run."""
    compare(tiny(), ["standard", "gqa"], [0, 1], tmp_path, quiet=True, train_fn=FakeTrainer())
    fake = FakeTrainer()
    compare(tiny(), ["standard", "gqa"], [2], tmp_path, quiet=True, train_fn=fake)
    assert [(v, s) for v, s, _, _ in fake.calls] == [("standard", 2), ("gqa", 2)]
    fake = FakeTrainer()
    report = compare(tiny(), ["standard", "mqa"], [0, 1, 2], tmp_path, quiet=True, train_fn=fake)
    assert [(v, s) for v, s, _, _ in fake.calls] == [("mqa", 0), ("mqa", 1), ("mqa", 2)]
    spec = load_toml(tmp_path / "compare.toml")
    assert spec["variants"] == ["standard", "gqa", "mqa"] and spec["seeds"] == [0, 1, 2]
    assert table_rows(report)["gqa"][0] == "3/3" and table_rows(report)["mqa"][0] == "3/3"


def test_compare_written_before_a_new_setting_still_resumes(tmp_path):
    """A compare.toml from before a setting existed (here: train.track_rank) resumes when the new setting is at
    its default, and is refused when it is not."""
    import tomli_w

    compare(tiny(), ["standard", "gqa"], [0, 1], tmp_path, quiet=True, train_fn=FakeTrainer())
    spec = tomllib.loads((tmp_path / "compare.toml").read_text())
    del spec["base"]["train"]["track_rank"]
    (tmp_path / "compare.toml").write_text(tomli_w.dumps(spec))
    fake = FakeTrainer()
    compare(tiny(), ["standard", "gqa"], [0, 1], tmp_path, quiet=True, train_fn=fake)
    assert fake.calls == []
    off = tiny().replace(train=tiny().train.replace(track_rank=False))
    with pytest.raises(ConfigError, match=r"train\.track_rank: True -> False"):
        compare(off, ["standard", "gqa"], [0, 1], tmp_path, quiet=True, train_fn=FakeTrainer())


def test_compare_rejects_bad_lists_up_front(tmp_path):
    out = tmp_path / "cmp"
    with pytest.raises(ConfigError, match="unknown attention variant 'gqq' \\(did you mean 'gqa'\\?\\)"):
        compare(tiny(), ["standard", "gqq"], [0], out, train_fn=FakeTrainer())
    with pytest.raises(ConfigError, match="duplicate seed 1"):
        compare(tiny(), ["standard"], [1, 1], out, train_fn=FakeTrainer())
    with pytest.raises(ConfigError, match="non-empty list"):
        compare(tiny(), [], [0], out, train_fn=FakeTrainer())
    with pytest.raises(ConfigError, match="seed -1"):
        compare(tiny(), ["standard"], [-1], out, train_fn=FakeTrainer())
    assert not out.exists()


# ----------------------------------------------------------------------------------------------- end to end


def test_compare_end_to_end_tiny(tmp_path):
    try:
        from attnlab.train import train
    except ImportError:
        try:
            from attnlab.train.trainer import train
        except ImportError as e:
            pytest.skip(f"the trainer is not available yet: {e}")
    base = tiny()
    base = base.replace(
        data=dataclasses.replace(base.data, cache_dir=str(tmp_path / "cache")),
        train=base.train.replace(max_steps=6, warmup_steps=1, eval_interval=3, eval_tokens=256, batch_size=4,
                                 sample_tokens=0, log_interval=3),
    )
    calls = []

    def counting_train(cfg, **kw):
        calls.append(cfg)
        return train(cfg, **kw)

    report = compare(base, ["standard", "mqa"], [0, 1], tmp_path / "cmp", quiet=True, train_fn=counting_train)
    assert len(calls) == 4
    results = json.loads((tmp_path / "cmp" / "results.json").read_text())
    for row in results["variants"]:
        assert row["n_finished"] == 2, row["runs"]
        assert math.isfinite(row["final_val_loss"]["mean"]) and row["final_val_loss"]["std"] is not None
        assert row["n_params"] > 0
    assert results["variants"][1]["welch_vs_baseline"]["df"] is not None
    assert results["settings"]["token_budget"] == 6 * 4 * 32
    assert (tmp_path / "cmp" / "loss_curves.png").exists() and "| mqa | 2/2 |" in report.read_text()
    compare(base, ["standard", "mqa"], [0, 1], tmp_path / "cmp", quiet=True, train_fn=counting_train)
    assert len(calls) == 4  # everything finished: nothing retrained

    # a run killed after its last checkpoint but before summary.json: resumed through the real trainer
    (run_dir(tmp_path / "cmp", "mqa", 1) / "summary.json").unlink()
    compare(base, ["standard", "mqa"], [0, 1], tmp_path / "cmp", quiet=True, train_fn=counting_train)
    assert len(calls) == 5 and calls[-1] is None
    again = json.loads((tmp_path / "cmp" / "results.json").read_text())
    assert again["variants"][1]["final_val_loss"] == results["variants"][1]["final_val_loss"]


def _tiny_budget(tmp_path) -> RunConfig:
    base = tiny()
    return base.replace(
        data=dataclasses.replace(base.data, cache_dir=str(tmp_path / "cache")),
        train=base.train.replace(max_steps=4, warmup_steps=1, eval_interval=2, eval_tokens=256, batch_size=4,
                                 sample_tokens=0, log_interval=2),
    )


@pytest.mark.slow  # trains a whole comparison: about 25-50 s on the 2-core CPU
def test_parallel_jobs_match_sequential_runs(tmp_path):
    """jobs=2 (two `attnlab train` processes) gives the same losses as jobs=1 in this process, same threads."""
    base = _tiny_budget(tmp_path)
    variants, seeds = ["standard", "mqa"], [0, 1]
    compare(base, variants, seeds, tmp_path / "seq", quiet=True, threads=1)
    compare(base, variants, seeds, tmp_path / "par", quiet=True, jobs=2, threads=1)
    for v in variants:
        for s in seeds:
            a = json.loads((run_dir(tmp_path / "seq", v, s) / "summary.json").read_text())
            b = json.loads((run_dir(tmp_path / "par", v, s) / "summary.json").read_text())
            assert b["status"] == "finished"
            # same config, same thread count, same torch: the same floating-point operations
            assert b["final_val_loss"] == pytest.approx(a["final_val_loss"], rel=1e-6, abs=0)
    assert (tmp_path / "par" / "logs" / "mqa-seed1.log").exists()
    # everything finished: a rerun starts no process and rewrites the same report
    before = (tmp_path / "par" / "results.json").read_text()
    compare(base, variants, seeds, tmp_path / "par", quiet=True, jobs=2, threads=1)
    assert (tmp_path / "par" / "results.json").read_text() == before


def test_parallel_jobs_report_a_crashed_run(tmp_path):
    base = _tiny_budget(tmp_path)
    base = base.replace(data=dataclasses.replace(base.data, source=str(tmp_path / "missing.txt")))
    with pytest.raises(RuntimeError, match=r"standard seed 0: exited with status 2; see .*standard-seed0.log"):
        compare(base, ["standard"], [0], tmp_path / "cmp", quiet=True, jobs=2, threads=1)


@pytest.mark.parametrize("kw", [{"jobs": 0}, {"jobs": 1.5}, {"threads": 0}])
def test_jobs_and_threads_are_checked(tmp_path, kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        compare(tiny(), ["standard"], [0], tmp_path, train_fn=FakeTrainer(), **kw)


@pytest.mark.slow
@pytest.mark.parametrize("signame", ["SIGINT", "SIGTERM"])
def test_parallel_jobs_survive_sigint_and_resume(tmp_path, signame):
    """SIGINT (Ctrl-C) or SIGTERM (kill) to `attnlab compare --jobs 2` reaches both training processes once as
    SIGINT: each saves a checkpoint and reports "interrupted"; rerunning the command resumes both and finishes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    out = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "attnlab.cli", "compare", "--preset", "tiny", "--variants", "standard", "mqa",
           "--seeds", "0", "--jobs", "2", "--threads", "1", "--out-dir", str(out),
           f"data.cache_dir={tmp_path / 'cache'}", "train.max_steps=3000", "train.eval_interval=1000",
           "train.sample_tokens=0", "train.log_interval=10"]
    # SIGINT at its default in the child: a shell that runs the test suite as a background job (`... &`) starts
    # it with SIGINT ignored, which exec passes on, and Python then leaves SIGINT ignored (as in `nohup cmd &`)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    metrics = [run_dir(out, v, 0) / "metrics.jsonl" for v in ("standard", "mqa")]
    deadline = time.monotonic() + 120
    while not all(m.exists() and len(m.read_text().splitlines()) >= 3 for m in metrics):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    os.kill(proc.pid, getattr(signal, signame))
    text = proc.communicate(timeout=120)[0]
    assert "compare: interrupted" in text, text
    for v in ("standard", "mqa"):
        summary = json.loads((run_dir(out, v, 0) / "summary.json").read_text())
        assert summary["status"] == "interrupted" and 0 < summary["steps"] < 3000, summary
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": resuming (") == 2, done.stdout
    for v in ("standard", "mqa"):
        summary = json.loads((run_dir(out, v, 0) / "summary.json").read_text())
        assert summary["status"] == "finished" and summary["steps"] == 3000


def plant_hijack(out, variants, ms, acc, seeds=(0, 1, 2), tokens_per_s=None) -> None:
    """A hijack comparison in ``out`` whose runs logged hijack/m<m>/{accuracy,unique,cluster} twice (the HijackSweepHook
    at two evaluations; the last counts): accuracy acc[variant, m][seed index], unique mass 0.9 - 0.1 * seed index,
    cluster mass 0.01 * m."""
    base = tiny()
    check_or_write_spec(out, spec_dict(base, variants, list(seeds)))
    for v in variants:
        for i, s in enumerate(seeds):
            path = run_dir(out, v, s)
            plant_run(path, base.replace(model=base.model.replace(attention=v), train=base.train.replace(seed=s)),
                      "finished", 2.0, tokens_per_s=(tokens_per_s or {}).get(v, 1000.0))
            old = {f"hijack/m{m}/{k}": 0.5 for m in ms for k in ("accuracy", "unique", "cluster")}  # superseded
            last = {**{f"hijack/m{m}/accuracy": acc[v, m][i] for m in ms},
                    **{f"hijack/m{m}/unique": 0.9 - 0.1 * i for m in ms}, **{f"hijack/m{m}/cluster": 0.01 * m for m in ms}}
            with open(path / "metrics.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in ({"step": 29, **old}, {"step": 30, **last}))


def test_report_hijack_sweep_from_planted_metrics(tmp_path):
    """A comparison whose runs logged hijack/m<m>/{accuracy,unique,cluster} (HijackSweepHook) gets the accuracy
    table against m, checked against statistics and scipy's Welch test, the mass table, and the two plots; the
    last evaluation counts."""
    variants, ms = ["standard", "magnitude-prefix"], [0, 16]
    acc = {("standard", 0): [1.0, 0.98, 0.99], ("standard", 16): [0.2, 0.35, 0.1],
           ("magnitude-prefix", 0): [0.97, 1.0, 0.99], ("magnitude-prefix", 16): [0.9, 0.8, 0.95]}
    plant_hijack(tmp_path, variants, ms, acc)
    text = write_report(tmp_path).read_text()
    section = text[text.index("## Hijack sweep: accuracy"):]
    table = section[section.index("| variant"):].split("\n\n")[0].splitlines()[2:]
    rows = {c[0]: c[1:] for c in ([x.strip() for x in line.strip("|").split("|")] for line in table)}
    pct = lambda xs: f"{100 * statistics.mean(xs):.1f} ± {100 * statistics.stdev(xs):.1f}"
    assert rows["standard"] == ["3", pct(acc["standard", 0]), pct(acc["standard", 16])]
    ps = [scipy.stats.ttest_ind(acc["magnitude-prefix", m], acc["standard", m], equal_var=False).pvalue for m in ms]
    adjusted = multipletests(ps, method="holm")[1]  # the family: every (variant, m) test against the baseline
    for m, p, h, cell in zip(ms, ps, adjusted, rows["magnitude-prefix"][1:]):
        assert cell == f"{pct(acc['magnitude-prefix', m])} (p {p:.2g}; Holm {h:.2g})"
    mass = text[text.index("## Hijack sweep: where"):]
    assert f"| standard | {statistics.mean([0.9, 0.8, 0.7]):.3f} ± {statistics.stdev([0.9, 0.8, 0.7]):.3f} / 0.000 ± 0.000 | " in mass
    assert (tmp_path / "hijack_accuracy.png").stat().st_size > 0 and (tmp_path / "hijack_mass.png").exists()
    results = json.loads((tmp_path / "results.json").read_text())["hijack"]
    assert results["ms"] == ms and results["variants"][1]["m"]["16"]["cluster"]["mean"] == pytest.approx(0.16)


def test_report_length_extrapolation_from_planted_metrics(tmp_path):
    """Runs that logged length/<L>/accuracy (LengthHook) get the table of accuracy against the length: the training
    length's column is the validation accuracy, the others the last evaluation's; paired differences against the
    baseline checked against scipy's paired t-test and statsmodels' Holm over every (variant, length) test."""
    variants, lengths, seeds = ["standard", "ssmax"], [64, 128], [0, 1, 2]
    acc = {("standard", 32): [1.0, 0.99, 1.0], ("standard", 64): [0.6, 0.5, 0.7], ("standard", 128): [0.3, 0.2, 0.35],
           ("ssmax", 32): [0.99, 1.0, 1.0], ("ssmax", 64): [0.9, 0.7, 0.85], ("ssmax", 128): [0.6, 0.5, 0.4]}
    base = apply_overrides(tiny(), ["data.source=task:mqar", "data.task.seq_len=32"])
    check_or_write_spec(tmp_path, spec_dict(base, variants, seeds))
    for v in variants:
        for i, s in enumerate(seeds):
            path = run_dir(tmp_path, v, s)
            plant_run(path, base.replace(model=base.model.replace(attention=v), train=base.train.replace(seed=s)),
                      "finished", 0.1, accuracy=acc[v, 32][i])
            rows = [{"step": 29, **{f"length/{n}/accuracy": 0.0 for n in lengths}},  # superseded
                    {"step": 30, **{f"length/{n}/accuracy": acc[v, n][i] for n in lengths}}]
            with open(path / "metrics.jsonl", "a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
    text = write_report(tmp_path).read_text()
    section = text[text.index("## Length extrapolation: accuracy"):]
    table = section[section.index("| variant"):].split("\n\n")[0].splitlines()
    assert table[0] == "| variant | seeds | T = 32 | L = 64 | L = 128 |"
    rows = {c[0]: c[1:] for c in ([x.strip() for x in line.strip("|").split("|")] for line in table[2:])}
    pct = lambda xs: f"{100 * statistics.mean(xs):.1f} ± {100 * statistics.stdev(xs):.1f}"
    assert rows["standard"] == ["3", *(pct(acc["standard", n]) for n in (32, 64, 128))]
    tests = [scipy.stats.ttest_rel(acc["ssmax", n], acc["standard", n]).pvalue for n in (32, 64, 128)]
    adjusted = multipletests(tests, method="holm")[1]
    for n, p, h, cell in zip((32, 64, 128), tests, adjusted, rows["ssmax"][1:]):
        diff = 100 * statistics.mean(a - b for a, b in zip(acc["ssmax", n], acc["standard", n]))
        assert cell == f"{pct(acc['ssmax', n])} ({diff:+.1f}; p {p:.2g}; Holm {h:.2g})"
    assert (tmp_path / "length_accuracy.png").stat().st_size > 0 and "length_accuracy.png" in text
    results = json.loads((tmp_path / "results.json").read_text())["length"]
    assert results["train_length"] == 32 and results["lengths"] == lengths


def test_a_report_without_length_metrics_has_no_length_section(tmp_path):
    plant_hijack(tmp_path, ["standard", "mqa"], [0], {(v, 0): [1.0, 0.9, 0.8] for v in ("standard", "mqa")})
    (tmp_path / "length_accuracy.png").write_bytes(b"stale")
    text = write_report(tmp_path).read_text()
    assert "Length extrapolation" not in text and not (tmp_path / "length_accuracy.png").exists()
    assert "length" not in json.loads((tmp_path / "results.json").read_text())


def test_hijack_summary_joins_the_parts_with_one_baseline_and_each_parts_speed_ratio(tmp_path):
    """hijack_summary (the HIJACK-SUMMARY block of docs/generate.py): the baseline once, from the first part, every
    other variant from its part with its accuracy (mean ± std, Welch's p against its own part's baseline, checked
    against scipy, and Holm's adjustment within that part, checked against statsmodels) at each m > 0, and tokens/s
    over its own part's baseline."""
    from attnlab.experiments.hijack_report import hijack_summary
    from attnlab.experiments.report import read_results

    ms = [0, 4]
    acc1 = {("standard", 0): [1.0, 1.0, 1.0], ("standard", 4): [0.1, 0.2, 0.15],
            ("rbf", 0): [1.0, 1.0, 1.0], ("rbf", 4): [0.05, 0.1, 0.0]}
    acc2 = {("standard", 0): [1.0, 1.0, 1.0], ("standard", 4): [0.3, 0.2, 0.25],
            ("magnitude-prefix", 0): [1.0, 1.0, 0.9], ("magnitude-prefix", 4): [0.6, 0.7, 0.5]}
    plant_hijack(tmp_path / "h-1", ["standard", "rbf"], ms, acc1, tokens_per_s={"standard": 2000.0, "rbf": 1000.0})
    plant_hijack(tmp_path / "h-2", ["standard", "magnitude-prefix"], ms, acc2,
                 tokens_per_s={"standard": 4000.0, "magnitude-prefix": 3000.0})
    text = hijack_summary([(n, read_results(tmp_path / n)[0]) for n in ("h-1", "h-2")])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]
    pct = lambda xs: f"{100 * statistics.mean(xs):.1f} ± {100 * statistics.stdev(xs):.1f}"
    p = lambda a, b: scipy.stats.ttest_ind(a, b, equal_var=False).pvalue
    assert text.splitlines()[0] == "| variant | part | m = 4 | tokens/s vs baseline |"
    # Holm within each part: h-1 has one test (at m = 0 both sides are constant: no test), h-2 two
    p1 = p(acc1["rbf", 4], acc1["standard", 4])
    p2 = [p(acc2["magnitude-prefix", m], acc2["standard", m]) for m in ms]
    h2 = multipletests(p2, method="holm")[1][1]
    assert rows == [["standard", "h-1", pct(acc1["standard", 4]), "1.00x"],
                    ["rbf", "h-1", f"{pct(acc1['rbf', 4])} (p {p1:.2g}; Holm {p1:.2g})", "0.50x"],
                    ["magnitude-prefix", "h-2", f"{pct(acc2['magnitude-prefix', 4])} (p {p2[1]:.2g}; Holm {h2:.2g})",
                     "0.75x"]]


def test_hijack_protocol_sets_the_fixed_runs_beside_the_same_seeds_and_all_seeds_of_the_mixed_part(tmp_path):
    """hijack_protocol (the HIJACK-PROTOCOL block of docs/generate.py): per variant of the fixed-m experiment, its
    accuracy at each m, then the mixed-m part that trained that variant, with the fixed run's seed and with every
    seed (mean ± std, checked against statistics) when it has more; a variant no mixed part trained says so."""
    from attnlab.experiments.hijack_report import hijack_protocol
    from attnlab.experiments.report import read_results

    ms = [0, 4]
    fixed = {("standard", 0): [0.9], ("standard", 4): [0.6], ("rbf", 0): [1.0], ("rbf", 4): [0.25],
             ("mqa", 0): [0.5], ("mqa", 4): [0.125]}
    mix1 = {("standard", 0): [1.0, 0.95, 0.9], ("standard", 4): [0.7, 0.5, 0.4],
            ("rbf", 0): [1.0, 1.0, 0.8], ("rbf", 4): [0.3, 0.1, 0.2]}
    plant_hijack(tmp_path / "fx", ["standard", "rbf", "mqa"], ms, fixed, seeds=(0,))
    plant_hijack(tmp_path / "mx-1", ["standard", "rbf"], ms, mix1)
    text = hijack_protocol(("fx", read_results(tmp_path / "fx")[1]), [("mx-1", read_results(tmp_path / "mx-1")[1])])
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()[2:]]
    one = lambda x: f"{100 * x:.1f}"
    pct = lambda xs: f"{100 * statistics.mean(xs):.1f} ± {100 * statistics.stdev(xs):.1f}"
    assert text.splitlines()[0] == "| variant | trained as | seeds | m = 0 | m = 4 |"
    assert rows == [["standard", "fx", "0", one(0.9), one(0.6)],
                    ["", "mx-1", "0", one(1.0), one(0.7)],
                    ["", "mx-1", "0, 1, 2", pct(mix1["standard", 0]), pct(mix1["standard", 4])],
                    ["rbf", "fx", "0", one(1.0), one(0.25)],
                    ["", "mx-1", "0", one(1.0), one(0.3)],
                    ["", "mx-1", "0, 1, 2", pct(mix1["rbf", 0]), pct(mix1["rbf", 4])],
                    ["mqa", "fx", "0", one(0.5), one(0.125)],
                    ["", "not run", "none", "n/a", "n/a"]]


def test_one_gpu_per_child_when_there_are_several():
    """compare --jobs N spreads its children over the visible GPUs (CUDA_VISIBLE_DEVICES)."""
    from attnlab.experiments.grid import pick_gpu, visible_gpus

    assert visible_gpus({}, 4) == ["0", "1", "2", "3"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": "2,5"}, 2) == ["2", "5"]
    assert visible_gpus({"CUDA_VISIBLE_DEVICES": ""}, 0) == []
    gpus = ["2", "5"]
    assert pick_gpu(gpus, []) == "2" and pick_gpu(gpus, ["2"]) == "5" and pick_gpu(gpus, ["2", "5"]) == "2"
    assert pick_gpu(gpus, ["5", "5", "2"]) == "2" and pick_gpu([], ["x"]) is None


def test_export_ships_finished_and_diverged_runs_only(tmp_path):
    """An interrupted run (a summary with status "interrupted") is not over: --export leaves it out, as a run still
    going, and the shipped report counts it missing."""
    from attnlab.experiments.report import export_comparison

    out, base = tmp_path / "grid", tiny()
    check_or_write_spec(out, spec_dict(base, ["standard"], [0, 1, 2]))
    for seed, status in ((0, "finished"), (1, "interrupted"), (2, "diverged")):
        plant_run(run_dir(out, "standard", seed), base.replace(train=base.train.replace(seed=seed)), status, 2.0)
    export_comparison(out, tmp_path / "shipped")
    shipped = sorted(p.name for p in (tmp_path / "shipped" / "standard").iterdir())
    assert shipped == ["seed0", "seed2"]
