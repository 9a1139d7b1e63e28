"""benchmarks/cuda_session.sh, the one-call GPU script, run without a GPU (its comparisons on the CPU, its GPU tests
skipped, its benchmarks left out with BENCH=0): it parses NAME=SOURCE@JOBS+VARIANTS and NAME:KEY=VALUE (a sweep),
copies SOURCE's standard runs into the comparison before it starts (so they are skipped, not retrained), trains the
named variants only, stops at its time limit, and returns what the device tool can carry back: at most 8 plain files
with plain names, the runs and their log in one archive without checkpoints."""

import os
import re
import subprocess
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def tar_text(path, name):
    with tarfile.open(path) as tar:
        return tar.extractfile(name).read().decode()


@pytest.mark.slow
def test_the_script_copies_the_reused_runs_and_returns_few_plain_files(tmp_path):
    out, work = tmp_path / "out", tmp_path / "grids"
    env = {**os.environ, "BENCH": "0", "SESSION_END": "60", "GRID_DEVICE": "cpu", "GRID_WORK": str(work)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run(["bash", str(ROOT / "benchmarks" / "cuda_session.sh"), str(out),
                           "dilution-mqar-3=dilution-mqar-1@1+standard", "dilution-nope-1:train.lr=2e-3@1+standard"],
                          capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and all(re.fullmatch(r"[A-Za-z0-9._-]+", f) for f in files), files
    assert {"machine.txt", "tests.log", "grids.tgz"} <= set(files)
    with tarfile.open(out / "grids.tgz") as tar:
        names = tar.getnames()
        log = tar.extractfile("./grids.log").read().decode()
    seeds = sorted(p.parent.name for p in (ROOT / "results" / "dilution-mqar-1" / "standard").glob("seed*/summary.json"))
    assert seeds and all(f"./dilution-mqar-3/standard/{s}/summary.json" in names for s in seeds)
    assert not any("checkpoint" in n for n in names)
    assert not any("magnitude-prefix-logits-lowrank" in n for n in names)  # the preset's other variant: not named
    assert "standard seed 0: already finished, skipped" in log and "dilution-mqar-3" in log
    # NAME:KEY=VALUE is a sweep in `attnlab sweep`'s layout, nothing copied into it
    assert "./dilution-nope-1-sweep/train.lr=2e-3/standard/seed0/config.toml" in names
    assert 'lr = 0.002' in tar_text(out / "grids.tgz", "./dilution-nope-1-sweep/train.lr=2e-3/standard/seed0/config.toml")
    assert not any(n.startswith("./dilution-nope-1/") for n in names)
