"""benchmarks/kernel_resources.py compiles the Triton kernels for sm_90 on a machine without a GPU and reads their
registers and spills from the cubin: run as the docs say (a fresh process, Triton's interpreter off), it reports
every kernel with numbers a CUDA compiler can give (1 to 255 registers, shared memory for the tiles), and it
refuses to run under the interpreter in one line."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="triton is not installed (pip install attnlab[kernels])")
ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "kernel_resources.py"


def _run(*args, interpret: str | None = None):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if interpret is not None:
        env["TRITON_INTERPRET"] = interpret
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_every_kernel_compiles_for_sm90_with_a_resource_report():
    done = _run("--blocks", "32x32", "--num-warps", "4")
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    kernels = {r["kernel"] for r in report["rows"]}
    assert {"perkey._forward_kernel", "perkey._dkdv_kernel", "perkey._dq_kernel"} <= kernels
    assert {f"lowrank.{k}[GATE={g}]" for k in ("_forward_kernel", "_dkdv_kernel", "_dq_kernel") for g in (0, 1)} <= kernels
    for row in report["rows"]:
        assert 1 <= row["regs"] <= 255 and row["stack_bytes"] >= 0 and row["shared_bytes"] > 0, row
        assert row["instructions"] > 100 and row["mufu"].get("EX2", 0) > 0, row  # every kernel exponentiates


@pytest.mark.slow
def test_backward_tiles_report_the_two_backward_kernels_with_their_own_tiles():
    """--backward-blocks 64x16: the dK/dV kernel with 16 queries per step over its 64 keys (BLOCK_M 16, BLOCK_N 64)
    and the dq kernel the reverse, for both gates, and nothing else when --blocks is empty."""
    done = _run("--blocks", "--backward-blocks", "64x16", "--num-warps", "4")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {(r["kernel"], r["block_m"], r["block_n"]) for r in json.loads(done.stdout)["rows"]}
    assert rows == {(f"lowrank.{k}[GATE={g}]", *tiles) for g in (0, 1)
                    for k, tiles in (("_dkdv_kernel", (16, 64)), ("_dq_kernel", (64, 16)))}


def test_bad_backward_tiles_are_one_line_errors():
    for bad in ("64x8", "64xfoo"):
        done = _run("--blocks", "--backward-blocks", bad)
        assert done.returncode != 0 and done.stderr.strip().count("\n") == 0 and "allowed" in done.stderr, done.stderr


def test_under_the_interpreter_it_refuses_in_one_line():
    done = _run("--blocks", "32x32", interpret="1")
    assert done.returncode == 2 and done.stderr.strip().count("\n") == 0 and "TRITON_INTERPRET" in done.stderr


@pytest.mark.slow
def test_the_low_rank_prior_takes_the_special_functions_of_plain_flash_attention():
    """The low-rank prior's kernels form exp(z - log lambda_j) max(w, floor lambda_j) (lowrank's docstring): one
    exp2 per score and no per-score log or division, so their SASS holds as many MUFU.EX2 as the per-key kernels'
    (whose score is plain z + p_j) and at most a few more other MUFU instructions (a reciprocal or log per key or
    row), where a per-score log or division would add one per score the thread owns (32 at 64 x 64, 4 warps)."""
    done = _run("--blocks", "64x64", "--num-warps", "4")
    assert done.returncode == 0, done.stderr[-2000:]
    rows = {r["kernel"]: r for r in json.loads(done.stdout)["rows"]}
    for name in ("_forward_kernel", "_dkdv_kernel", "_dq_kernel"):
        flash, mine = rows[f"perkey.{name}"]["mufu"], rows[f"lowrank.{name}[GATE=0]"]["mufu"]
        assert flash.get("EX2", 0) >= 32 and mine.get("EX2", 0) == flash["EX2"], (name, mine, flash)
        others = sum(n for op, n in mine.items() if op != "EX2")
        assert others <= sum(n for op, n in flash.items() if op != "EX2") + 4, (name, mine, flash)
