"""attnlab sweep: one comparison per value of a setting, the metric per value and the best value per variant."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from attnlab.configio import apply_overrides, load_config, save_toml
from attnlab.errors import ConfigError
from attnlab.experiments.grid_sweep import find_sweep, parse_sweep, sweep, sweep_results, write_sweep_report
from attnlab.presets import load_preset
from attnlab.train import RunConfig

# accuracy of a fake run: a function of (variant, lr, seed), so the best lr differs between the variants
ACC = {("standard", 1e-3): 0.70, ("standard", 3e-3): 0.90, ("standard", 1e-2): 0.60,
       ("mqa", 1e-3): 0.80, ("mqa", 3e-3): 0.75, ("mqa", 1e-2): 0.20}


def fake_train(cfg, *, resume=None, quiet=False):
    """Writes what attnlab.train.train writes for a finished run, with a planted accuracy; records the config."""
    path = Path(cfg.out_dir)
    path.mkdir(parents=True, exist_ok=True)
    save_toml(cfg, path / "config.toml")
    acc = ACC[cfg.variant_name, cfg.train.lr] + 0.01 * cfg.train.seed
    (path / "metrics.jsonl").write_text(json.dumps({"step": 5, "tokens": 5, "train_loss": 1.0, "val_loss": 1 - acc,
                                                    "val_accuracy": acc}) + "\n")
    summary = {"status": "finished", "steps": 5, "final_val_loss": 1 - acc, "final_val_accuracy": acc,
               "variant": cfg.variant_name, "seed": cfg.train.seed}
    (path / "summary.json").write_text(json.dumps(summary))
    return summary


def _base():
    return apply_overrides(load_preset("tiny"), ["data.source=task:mqar"])


def test_one_comparison_per_value_and_the_best_per_variant(tmp_path):
    path = sweep(_base(), "train.lr", ["1e-3", "3e-3", "1e-2"], ["standard", "mqa"], [0, 1], tmp_path, quiet=True,
                 train_fn=fake_train)
    for value, lr in (("1e-3", 1e-3), ("3e-3", 3e-3), ("1e-2", 1e-2)):
        cfg = load_config(RunConfig, tmp_path / f"train.lr={value}" / "mqa" / "seed1" / "config.toml")
        assert cfg.train.lr == lr and cfg.train.seed == 1  # the value reaches the runs, nothing else changes
    results = json.loads((tmp_path / "sweep.json").read_text())
    assert results["metric"] == "val_accuracy" and results["better"] == "higher"
    rows = {r["variant"]: r for r in results["variants"]}
    assert rows["standard"]["best"] == "3e-3" and rows["mqa"]["best"] == "1e-3"
    want = [ACC["mqa", 1e-2], ACC["mqa", 1e-2] + 0.01]
    assert rows["mqa"]["by_value"]["1e-2"]["mean"] == pytest.approx(statistics.mean(want), abs=1e-12)
    text = path.read_text()
    assert f"**{100 * statistics.mean([0.9, 0.91]):.2f} ± {100 * statistics.stdev([0.9, 0.91]):.2f} (n=2)**" in text
    assert "| mqa |" in text and [line for line in text.splitlines() if line.startswith("| mqa |")][0].endswith(
        "| 1e-3 |")


def test_on_text_the_metric_is_the_loss_and_lower_is_better(tmp_path):
    base = load_preset("tiny")
    sweep(base, "train.lr", ["1e-3", "3e-3"], ["standard"], [0], tmp_path, quiet=True, train_fn=fake_train)
    results = sweep_results(tmp_path, "train.lr", ["1e-3", "3e-3"])
    assert results["metric"] == "val_loss" and results["variants"][0]["best"] == "3e-3"  # 1 - 0.90 < 1 - 0.70


@pytest.mark.parametrize("text", ["train.lr", "train.lr=1e-3", "=1e-3,2e-3", "train.lr=1e-3,,2e-3",
                                  "train.lr=1e-3,1e-3"])
def test_a_bad_sweep_is_a_one_line_error(text):
    with pytest.raises(ConfigError, match="KEY=V1,V2") as info:
        parse_sweep(text)
    assert "\n" not in str(info.value)


def test_a_bad_value_fails_before_any_run(tmp_path):
    with pytest.raises(ConfigError, match="train.lr"):
        sweep(_base(), "train.lr", ["1e-3", "-1"], ["standard"], [0], tmp_path, quiet=True, train_fn=fake_train)
    assert not any(tmp_path.iterdir())


def test_every_run_is_listed_with_its_status_and_unfinished_runs_too(tmp_path):
    """sweep.json's "runs" and sweep.md's run table: one row per run, an interrupted run with its last evaluation,
    a run at its cap without meeting its rule marked not converged; the summaries count only the finished runs."""
    sweep(_base(), "train.lr", ["1e-3", "3e-3"], ["standard"], [0, 1], tmp_path, quiet=True, train_fn=fake_train)
    run = tmp_path / "train.lr=3e-3" / "standard" / "seed1"
    summary = json.loads((run / "summary.json").read_text())
    (run / "summary.json").write_text(json.dumps({**summary, "status": "interrupted", "steps": 7,
                                                   "final_val_loss": 0.5, "final_val_accuracy": 0.42}))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 5, "val_loss": 0.5, "val_accuracy": 0.42}) + "\n")
    capped = tmp_path / "train.lr=1e-3" / "standard" / "seed0"
    summary = json.loads((capped / "summary.json").read_text())
    (capped / "summary.json").write_text(json.dumps({**summary, "converged": False, "threshold_step": None}))
    path = write_sweep_report(tmp_path)  # key and values from the folder names
    runs = {(r["value"], r["seed"]): r for r in json.loads((tmp_path / "sweep.json").read_text())["runs"]}
    assert sorted(runs) == [("1e-3", 0), ("1e-3", 1), ("3e-3", 0), ("3e-3", 1)]
    assert runs["3e-3", 1]["status"] == "interrupted" and runs["3e-3", 1]["evaluated_at"] == 5
    text = path.read_text()
    assert "| standard | 3e-3 | 1 | interrupted, not converged | 7 | 0.42 | 5 |" not in text  # a percentage
    assert "| standard | 3e-3 | 1 | interrupted, not converged | 7 | 42.00 | 5 |" in text
    assert "| standard | 1e-3 | 0 | finished, not converged | 5 |" in text
    assert "(n=1)" in text  # 3e-3: the interrupted seed is not in the mean


def test_sweep_folders_give_the_key_and_the_values_in_numeric_order(tmp_path):
    for value in ("1e-2", "3.16e-3", "1e-3"):
        (tmp_path / f"train.lr={value}").mkdir()
        (tmp_path / f"train.lr={value}" / "compare.toml").write_text("")
    (tmp_path / "train.lr=junk").mkdir()  # no compare.toml: not a comparison
    assert find_sweep(tmp_path) == ("train.lr", ["1e-3", "3.16e-3", "1e-2"])
    assert find_sweep(tmp_path / "train.lr=1e-3") is None
    (tmp_path / "model.n_embd=64").mkdir()
    (tmp_path / "model.n_embd=64" / "compare.toml").write_text("")
    with pytest.raises(ConfigError, match="more than one key"):
        find_sweep(tmp_path)


def test_attnlab_report_on_a_sweep_directory_writes_the_sweep_table(tmp_path, capsys):
    from attnlab.cli import main

    sweep(_base(), "train.lr", ["1e-3", "3e-3"], ["standard"], [0], tmp_path, quiet=True, train_fn=fake_train)
    (tmp_path / "sweep.md").unlink()
    assert main(["report", str(tmp_path)]) == 0
    assert "# Sweep of train.lr" in capsys.readouterr().out and (tmp_path / "sweep.md").is_file()
    assert main(["report", str(tmp_path), "--export", str(tmp_path / "out")]) == 2  # one comparison at a time
    err = capsys.readouterr().err.strip()
    assert "export each comparison of the sweep" in err and "\n" not in err
