"""One writer per directory: a run directory or a comparison held by another process is refused in one line."""

from __future__ import annotations

import fcntl
import os

import pytest

from attnlab.errors import ConfigError
from attnlab.experiments import compare
from attnlab.lock import LOCK_FILE, DirectoryLock
from attnlab.presets import load_preset
from attnlab.configio import apply_overrides
from attnlab.train import train


@pytest.fixture
def held(tmp_path):
    """Hold ``<dir>/.lock`` the way another process would: a separate open file with an exclusive flock
    (flock locks belong to the open file, so this conflicts even within one process)."""
    handles = []

    def hold(path):
        path.mkdir(parents=True, exist_ok=True)
        fh = open(path / LOCK_FILE, "w")
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        fh.write("pid 4242 (a test)\n")
        fh.flush()
        handles.append(fh)
        return fh

    yield hold
    for fh in handles:
        fh.close()


def _tiny(out_dir, cache_dir):
    return apply_overrides(load_preset("tiny"), [
        f"out_dir={out_dir}", f"data.cache_dir={cache_dir}", "train.max_steps=2", "train.warmup_steps=1",
        "train.eval_interval=2", "train.eval_tokens=256", "train.batch_size=2", "train.sample_tokens=0",
    ])


def test_training_refuses_a_run_directory_in_use(tmp_path, held):
    run = tmp_path / "run"
    fh = held(run)
    with pytest.raises(ConfigError, match=r"run is in use by pid 4242 \(a test\); wait") as e:
        train(_tiny(run, tmp_path / "cache"), quiet=True)
    assert "\n" not in str(e.value)
    assert not (run / "metrics.jsonl").exists() and not (run / "config.toml").exists()
    fh.close()  # the holder exits: the kernel drops its lock, the stale file does not block
    summary = train(_tiny(run, tmp_path / "cache"), quiet=True)
    assert summary["status"] == "finished"
    # the finished run released its lock: another process can take it (and resuming works)
    with DirectoryLock(run):
        pass
    assert train(None, resume=run, quiet=True)["status"] == "finished"


def test_resume_refuses_a_run_directory_in_use(tmp_path, held):
    run = tmp_path / "run"
    train(_tiny(run, tmp_path / "cache"), quiet=True)
    rows = (run / "metrics.jsonl").read_text()
    held(run)
    with pytest.raises(ConfigError, match="in use by pid 4242"):
        train(_tiny(run, tmp_path / "cache").replace(train=_tiny(run, tmp_path / "cache").train.replace(
            max_steps=4)), resume=run, quiet=True)
    assert (run / "metrics.jsonl").read_text() == rows  # nothing appended


def test_compare_refuses_an_out_dir_in_use(tmp_path, held):
    out = tmp_path / "cmp"
    held(out)
    calls = []
    with pytest.raises(ConfigError, match="cmp is in use by pid 4242"):
        compare(load_preset("tiny"), ["standard"], [0], out, quiet=True,
                train_fn=lambda *a, **k: calls.append(a))
    assert calls == [] and sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # no compare.toml, no run


def test_lock_is_exclusive_and_reentrant_safe(tmp_path):
    a = DirectoryLock(tmp_path / "d", what="thing").acquire()
    assert (tmp_path / "d" / LOCK_FILE).read_text() == f"pid {os.getpid()} (thing)\n"
    with pytest.raises(ConfigError, match=rf"d is in use by pid {os.getpid()} \(thing\)"):
        DirectoryLock(tmp_path / "d").acquire()
    a.acquire()  # already held by this object: no-op, no self-deadlock
    a.release()
    a.release()  # twice is harmless
    with DirectoryLock(tmp_path / "d"):
        pass


def test_a_run_that_fails_during_set_up_leaves_no_directory(tmp_path):
    run = tmp_path / "runs" / "new"
    cfg = apply_overrides(_tiny(run, tmp_path / "cache"), [f"data.source={tmp_path / 'missing.txt'}"])
    with pytest.raises(ConfigError, match="missing.txt"):
        train(cfg, quiet=True)
    assert not run.exists()  # the lock had created it; nothing else was written
    existing = tmp_path / "existing"
    existing.mkdir()
    with pytest.raises(ConfigError, match="missing.txt"):
        train(apply_overrides(cfg, [f"out_dir={existing}"]), quiet=True)
    assert existing.is_dir()  # a directory the user made stays
