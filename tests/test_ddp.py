"""Distributed data parallel: torchrun with 2 CPU processes (gloo) reproduces the single-process run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from attnlab.configio import apply_overrides
from attnlab.presets import load_preset
from attnlab.train import read_metrics, train

REPO = Path(__file__).resolve().parents[1]

WORKER = textwrap.dedent("""
    import json, os, sys
    import torch
    torch.set_num_threads(1)
    from attnlab.configio import apply_overrides
    from attnlab.model import GPT
    from attnlab.presets import load_preset
    from attnlab.train import train

    rows = set()  # the batch sizes this rank trains on
    forward = GPT.forward
    def recording_forward(self, idx, targets=None, **kw):
        if self.training:
            rows.add(idx.shape[0])
        return forward(self, idx, targets, **kw)
    GPT.forward = recording_forward
    cfg = apply_overrides(load_preset("tiny"), sys.argv[1:])
    train(cfg, quiet=True)
    with open(os.path.join(cfg.out_dir, f"rows-{os.environ['RANK']}.json"), "w") as f:
        json.dump(sorted(rows), f)
""")


def _overrides(out_dir, cache_dir) -> list[str]:
    return [f"out_dir={out_dir}", f"data.cache_dir={cache_dir}", "train.max_steps=6", "train.warmup_steps=2",
            "train.log_interval=1", "train.eval_interval=3", "train.grad_accum=2", "train.sample_tokens=0"]


@pytest.mark.slow  # two torchrun processes, about 11 s on the 2-core CPU; CI runs it with the slow tests
@pytest.mark.skipif(not torch.distributed.is_available(), reason="torch.distributed not available")
def test_torchrun_two_processes_match_single_process(tmp_path):
    cache = tmp_path / "cache"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        single = train(apply_overrides(load_preset("tiny"), _overrides(tmp_path / "single", cache)), quiet=True)
    finally:
        torch.set_num_threads(threads)

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(script), *_overrides(tmp_path / "ddp", cache)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]

    for rank in (0, 1):  # the global micro-batch of 8 is split in two
        assert json.loads((tmp_path / "ddp" / f"rows-{rank}.json").read_text()) == [4]
    summary = json.loads((tmp_path / "ddp" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["world_size"] == 2
    assert summary["tokens_seen"] == single["tokens_seen"]
    ddp_rows, ref_rows = (read_metrics(tmp_path / name / "metrics.jsonl") for name in ("ddp", "single"))
    assert [r["step"] for r in ddp_rows] == [r["step"] for r in ref_rows] == list(range(7))
    for a, b in zip(ddp_rows, ref_rows):
        for key in ("train_loss", "val_loss", "grad_norm"):
            if b[key] is None:
                assert a[key] is None
            else:
                assert a[key] == pytest.approx(b[key], rel=1e-5), (a["step"], key)
        assert a["tokens"] == b["tokens"] and a["lr"] == b["lr"]
    assert (tmp_path / "ddp" / "checkpoint" / "meta.json").is_file()
    assert not (tmp_path / "ddp" / "samples.txt").exists()
