"""benchmarks/attention_layer.py --profile: each row gains the costliest entries of one forward+backward call under
torch.profiler. On the CPU these are aten operators by self time, so the low-rank causal magnitude layer's list must
hold the operators its solver calls (attnlab.mechanisms.magnitude.lowrank: a Cholesky factor and triangular solves)
beside SDPA's, and the standard layer's none of them; shares are of the call's total, so any N of them add up to at
most 1, and the entries come costliest first."""

import contextlib
import io
import json

import pytest

from helpers import script

attention_layer = script("benchmarks/attention_layer.py", "attention_layer")


def _rows(*argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        attention_layer.main(["--seq", "64", "--batch", "1", "--heads", "2", "--head-dim", "16", "--repeats", "1",
                              "--warmup", "0", *argv])
    return {r["variant"]: r for r in json.loads(out.getvalue())["results"]}


def test_the_profile_names_the_solver_in_the_low_rank_layer_and_not_in_standard():
    rows = _rows("--variants", "standard", "magnitude-causal-lowrank", "--profile", "200")
    names = {v: [e["name"] for e in r["profile"]["top"]] for v, r in rows.items()}
    solver = {"aten::linalg_cholesky_ex", "aten::linalg_solve_triangular"}
    assert solver <= set(names["magnitude-causal-lowrank"]), names["magnitude-causal-lowrank"]
    assert not solver & set(names["standard"]), names["standard"]
    for v, r in rows.items():
        assert any("scaled_dot_product" in n for n in names[v]), (v, names[v])
        top, total = r["profile"]["top"], r["profile"]["total_ms"]
        assert r["profile"]["clock"].startswith("cpu") and total > 0
        assert [e["ms"] for e in top] == sorted((e["ms"] for e in top), reverse=True)
        assert 0 < sum(e["share"] for e in top) <= 1 + 1e-3 and all(e["calls"] >= 1 for e in top)


def test_without_profile_no_row_has_one_and_n_limits_the_list():
    assert "profile" not in _rows("--variants", "standard")["standard"]
    assert len(_rows("--variants", "standard", "--profile", "3")["standard"]["profile"]["top"]) == 3


def test_a_negative_profile_is_a_one_line_error():
    with pytest.raises(SystemExit) as stop:
        attention_layer.main(["--profile", "-1"])
    message = str(stop.value.code)
    assert "\n" not in message and "--profile -1; allowed" in message


@pytest.mark.slow
def test_compile_adds_a_compiled_row_after_each_eager_one():
    """--compile (torch.compile of both layers: about 30 s on the 2-core CPU, hence slow): each variant's eager row,
    then its compiled row, timed against the compiled reference, with no core columns."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        attention_layer.main(["--seq", "64", "--batch", "1", "--heads", "2", "--head-dim", "16", "--repeats", "1",
                              "--warmup", "1", "--compile", "--variants", "magnitude-causal-lowrank"])
    bench = json.loads(out.getvalue())
    eager, compiled = bench["results"]
    assert bench["compile"] is True and "compiled" not in eager and compiled["compiled"] is True
    assert eager["variant"] == compiled["variant"] == "magnitude-causal-lowrank" and eager["path"] == compiled["path"]
    assert compiled["core_fwd_ratio"] is None and all(compiled[f"layer_{m}_ms"] > 0 for m in ("fwd", "fwd_bwd"))

