"""Weights & Biases tracking: every metrics.jsonl scalar reaches wandb.log at its step, the run id
is kept in the run directory and a resumed run continues it; a real offline run writes under RUN_DIR/wandb."""

import sys
import types

import pytest

from attnlab.errors import ConfigError
from attnlab.train import read_metrics, train
from helpers import one_line_error, tiny


class _FakeRun:
    def __init__(self, calls, **kwargs):
        self.calls, self.kwargs = calls, kwargs
        calls.append(("init", kwargs))

    def log(self, data, step):
        self.calls.append(("log", step, dict(data)))

    def finish(self):
        self.calls.append(("finish",))


@pytest.fixture
def fake_wandb(monkeypatch):
    calls = []
    module = types.SimpleNamespace(init=lambda **kw: _FakeRun(calls, **kw))
    monkeypatch.setitem(sys.modules, "wandb", module)
    return calls


def test_rows_ids_and_resume(tmp_path, cache_dir, fake_wandb):
    run = tmp_path / "run"
    cfg = tiny(run, cache_dir, train__max_steps=4, train__warmup_steps=1, train__eval_interval=2,
               train__log_interval=1, train__wandb_project="attnlab-test", train__checkpoint_interval=2)
    train(cfg.replace(train=cfg.train.replace(max_steps=2)), quiet=True)
    run_id = (run / "wandb_id.txt").read_text().strip()
    init = fake_wandb[0][1]
    assert (init["project"], init["id"], init["resume"], init["mode"]) == ("attnlab-test", run_id, "allow", "offline")
    assert init["config"]["train"]["wandb_project"] == "attnlab-test" and init["dir"] == str(run)
    train(cfg, resume=run, quiet=True)
    inits = [c for c in fake_wandb if c[0] == "init"]
    assert len(inits) == 2 and inits[1][1]["id"] == run_id  # the resumed launch continues the same W&B run
    assert [c[0] for c in fake_wandb].count("finish") == 2
    logged = {c[1]: c[2] for c in fake_wandb if c[0] == "log"}
    for row in read_metrics(run / "metrics.jsonl"):
        expected = {k: row[k] for k in ("train_loss", "val_loss", "lr", "grad_norm", "tokens_per_s")
                    if row.get(k) is not None}
        assert {k: logged[row["step"]][k] for k in expected} == expected, row["step"]
    assert sorted(logged) == sorted(r["step"] for r in read_metrics(run / "metrics.jsonl"))


def test_missing_wandb_and_bad_settings_are_one_line(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # the import fails as if not installed
    one_line_error(lambda: train(tiny(tmp_path / "w", cache_dir, train__wandb_project="p"), quiet=True),
                   "pip install 'attnlab[wandb]'")
    with pytest.raises(ConfigError, match="train.wandb_mode='cloud' is not allowed"):
        tiny(tmp_path / "x", cache_dir, train__wandb_mode="cloud")


@pytest.mark.slow
def test_a_real_offline_run(tmp_path, cache_dir, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    train(tiny(run, cache_dir, train__max_steps=2, train__warmup_steps=1, train__wandb_project="p"), quiet=True)
    run_id = (run / "wandb_id.txt").read_text().strip()
    folders = list((run / "wandb").glob(f"offline-run-*-{run_id}"))
    assert len(folders) == 1 and (folders[0] / f"run-{run_id}.wandb").stat().st_size > 0
