"""The `attnlab` command: one-line errors with exit status 2, and a tiny end-to-end train / sample / resume."""

import json

import pytest

from attnlab.cli import main


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNLAB_CACHE", str(tmp_path / "cache"))
    return tmp_path


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("attnlab: error: ")
    return err


def test_variants_lists_the_registry(capsys):
    from attnlab import variants

    assert main(["variants"]) == 0
    out = capsys.readouterr().out
    for name in variants():
        assert f"\n{name} " in "\n" + out


@pytest.mark.parametrize("args, expected", [
    (["train", "--preset", "tiny", "train.lrr=1"], ["train.lrr", "did you mean 'train.lr'"]),
    (["train", "--preset", "tny"], ["'tny'", "did you mean 'tiny'"]),
    (["train", "--preset", "tiny", "model.attention=rbff"], ["'rbff'", "did you mean 'rbf'"]),
    (["train", "--preset", "tiny", "model.n_head=3"], ["n_embd=32", "n_head=3"]),
    (["train", "--preset", "tiny", "train.lr=-1"], ["train.lr=-1", "> 0"]),
    (["train", "--preset", "tiny", "model.n_layer"], ["model.n_layer", "KEY=VALUE"]),
    (["train", "--config", "/nonexistent/run.toml"], ["/nonexistent/run.toml"]),
    (["compare", "--preset", "tiny", "--variants", "standard", "nope"], ["'nope'"]),
    (["compare", "--experiment", "bonelss"], ["'bonelss'", "did you mean 'boneless'"]),
    (["compare", "--experiment", "boneless", "--preset", "tiny"], ["--experiment boneless", "KEY=VALUE"]),
    (["compare", "--experiment", "boneless", "train.max_stepz=3"], ["train.max_stepz"]),
    (["compare", "--preset", "tiny"], ["--variants", "--experiment"]),
    (["report", "/nonexistent/cmp"], ["/nonexistent/cmp", "compare.toml"]),
])
def test_config_mistakes_are_one_line(args, expected, capsys, cache):
    assert main(args) == 2
    err = error_line(capsys)
    for text in expected:
        assert text in err, err


def test_missing_data_names_the_file(capsys, cache):
    missing = cache / "no-such-corpus.txt"
    assert main(["train", "--preset", "tiny", "--data", str(missing), "--out", str(cache / "run")]) == 2
    assert str(missing) in error_line(capsys)


def test_train_sample_and_resume_refusal(capsys, cache):
    run = cache / "run"
    assert main(["train", "--preset", "tiny", "--quiet", "--out", str(run), "train.max_steps=6",
                 "train.warmup_steps=2", "train.sample_tokens=20"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 6
    capsys.readouterr()
    assert main(["sample", str(run), "--tokens", "40", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert len(text) == 41  # 40 characters (char tokenizer) + print's newline
    assert main(["train", "--resume", str(run), "train.lr=1"]) == 2
    assert "--resume" in capsys.readouterr().err


def test_compare_experiment_runs_the_shipped_grid(capsys, cache):
    """`compare --experiment boneless` trains the experiment's six variants; KEY=VALUE shrinks the model and
    budget (the command line's overrides come after the experiment's own), --seeds narrows the grid."""
    import tomllib

    out = cache / "bl"
    small = ["model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.block_size=16", "train.max_steps=2",
             "train.warmup_steps=1", "train.batch_size=2", "train.eval_interval=2", "train.eval_tokens=64",
             "train.sample_tokens=0"]
    assert main(["compare", "--experiment", "boneless", "--seeds", "0", "--quiet", "--out-dir", str(out),
                 *small]) == 0
    spec = tomllib.loads((out / "compare.toml").read_text())
    assert spec["variants"] == ["standard", "boneless-corr", "boneless-softmax", "boneless-value", "identity-qk",
                                "residual-qk"]
    assert spec["seeds"] == [0] and spec["base"]["train"]["max_steps"] == 2
    assert spec["base"]["preset"] == "cpu" and spec["base"]["train"]["lr"] == 2e-3  # the cpu preset underneath
    for v in spec["variants"]:
        assert json.loads((out / v / "seed0" / "summary.json").read_text())["status"] == "finished"
    assert "boneless-corr" in (out / "report.md").read_text()

    # `attnlab report` rewrites the report from the directory as it stands and trains nothing: a run whose
    # summary is gone is reported unfinished and stays untouched
    (out / "report.md").unlink()
    (out / "residual-qk" / "seed0" / "summary.json").unlink()
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.rstrip().endswith(f"report: {out / 'report.md'}")
    text = (out / "report.md").read_text()
    assert text in printed
    assert "residual-qk seed 0: incomplete (`residual-qk/seed0`)" in text and "boneless-corr" in text
    assert not (out / "residual-qk" / "seed0" / "summary.json").exists()


def test_report_export_ships_the_runs_without_checkpoints(capsys, cache):
    """`attnlab report DIR --export DEST` copies compare.toml and each finished run's config, metrics and summary
    (no checkpoint, no unfinished run) and writes a report in DEST with the same numbers as DIR's."""
    from attnlab.experiments.report import read_results

    out, dest = cache / "grid", cache / "shipped"
    small = ["model.n_layer=1", "model.n_embd=16", "model.n_head=2", "model.block_size=16", "train.max_steps=2",
             "train.warmup_steps=1", "train.batch_size=2", "train.eval_interval=2", "train.eval_tokens=64",
             "train.sample_tokens=0"]
    assert main(["compare", "--preset", "tiny", "--variants", "standard", "mqa", "--seeds", "0", "1", "--quiet",
                 "--out-dir", str(out), *small]) == 0
    (out / "mqa" / "seed1" / "summary.json").unlink()  # as if still training
    assert any((out / "standard" / "seed0").rglob("*.safetensors"))
    capsys.readouterr()
    assert main(["report", str(out), "--export", str(dest)]) == 0
    assert capsys.readouterr().out.rstrip().endswith(f"report: {dest / 'report.md'}")
    shipped = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    runs = [f"{v}/seed{s}/{f}" for v, s in (("mqa", 0), ("standard", 0), ("standard", 1))
            for f in ("config.toml", "metrics.jsonl", "summary.json")]
    plots = ["loss_curves.png", "loss_delta.png", "accuracy_curves.png"]  # the runs log val_accuracy (on text too)
    assert shipped == sorted(["compare.toml", *plots, "report.md", "results.json", *runs])
    theirs, _ = read_results(dest)
    ours, _ = read_results(out)

    def numbers(results):
        return [(r["final_val_loss"], r["welch_vs_baseline"], r["diagnostics"], r["tokens_per_s_mean"])
                for r in results["variants"]]

    assert numbers(theirs) == numbers(ours) and theirs["variants"][1]["n_finished"] == 1
    assert [r["status"] for r in theirs["variants"][1]["runs"]] == ["finished", "missing"]  # "incomplete" in DIR
    assert main(["report", str(out), "--export", str(out)]) == 2  # not onto itself
    assert "--export" in capsys.readouterr().err

    # the same compare command on the shipped copy trains only the run that was left out
    kept = (dest / "standard" / "seed0" / "metrics.jsonl").read_text()
    assert main(["compare", "--preset", "tiny", "--variants", "standard", "mqa", "--seeds", "0", "1", "--quiet",
                 "--out-dir", str(dest), *small]) == 0
    assert json.loads((dest / "mqa" / "seed1" / "summary.json").read_text())["status"] == "finished"
    assert (dest / "standard" / "seed0" / "metrics.jsonl").read_text() == kept
    assert read_results(dest)[0]["variants"][1]["n_finished"] == 2


def test_listing_commands_start_without_torch_as_benchmarked():
    """docs/speed.md quotes results/benchmarks/cli_startup.json (benchmarks/cli_startup.py), and each listing
    command there took well under `import torch` (the bound: 1.2x). The measurement is shipped, not timed here."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    bench = json.loads((root / "results" / "benchmarks" / "cli_startup.json").read_text())
    ratios = {name.split()[1]: row["ratio_to_import_torch"] for name, row in bench["commands"].items()}
    assert set(ratios) == {"--help", "variants", "tasks", "experiments"} and max(ratios.values()) <= 1.2
    quoted = (f"`import torch` took {bench['reference_s']:.3f} s, and\n`attnlab --help` {ratios['--help']:.3f}x of it, "
              f"`attnlab variants` {ratios['variants']:.3f}x, `attnlab tasks` {ratios['tasks']:.3f}x, "
              f"`attnlab experiments` {ratios['experiments']:.3f}x.")
    assert quoted in (root / "docs" / "speed.md").read_text()


def test_listing_commands_import_no_torch():
    """The registry, the task list and the catalog load with torch blocked: `variants`, `tasks` and `experiments`
    never import it (a fresh interpreter, so the test's own torch does not count)."""
    import subprocess
    import sys

    code = ("import sys; sys.modules['torch'] = None\nfrom attnlab.cli import main\n"
            "for c in ('variants', 'tasks', 'experiments'):\n    assert main([c]) == 0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
