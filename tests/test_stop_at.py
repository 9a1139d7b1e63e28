"""train.stop_at: a run stops at the first evaluation that meets its threshold, or is censored at the cap.

The reference is a run of the same config without the rule: its metrics.jsonl says at which evaluation the rule
first holds, and the run with the rule must be that run cut at that step, bit for bit.
"""

from __future__ import annotations

import json

import pytest

from attnlab.errors import ConfigError
from attnlab.train import TrainConfig, read_metrics, train
from attnlab.train.config import StopRule
from helpers import one_line_error, tiny

SETTINGS = {"train__max_steps": 40, "train__eval_interval": 5, "train__checkpoint_interval": 10,
            "train__sample_tokens": 0, "train__track_rank": False}


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cache_dir):
    """A run to the cap without a rule, and its evaluation rows {step: val_loss}."""
    run = tmp_path_factory.mktemp("reference") / "run"
    train(tiny(run, cache_dir, **SETTINGS), quiet=True)
    rows = read_metrics(run / "metrics.jsonl")
    return run, rows, {r["step"]: r["val_loss"] for r in rows if r["val_loss"] is not None}


def _rule_met_first(evals: dict, threshold: float) -> int:
    """The first evaluated step whose loss is <= threshold, read off the reference run's rows."""
    return min(step for step, loss in evals.items() if loss <= threshold)


def _keys(rows):
    return [(r["step"], r["train_loss"], r["val_loss"]) for r in rows]


def test_the_run_stops_at_the_first_evaluation_that_meets_the_rule(tmp_path, cache_dir, reference):
    _, ref_rows, evals = reference
    steps = sorted(evals)
    threshold = evals[steps[len(steps) // 2]]  # met at the middle evaluation at the latest
    expected = _rule_met_first(evals, threshold)
    assert 0 < expected < 40
    run = tmp_path / "run"
    summary = train(tiny(run, cache_dir, **SETTINGS, train__stop_at=f"val_loss <= {threshold!r}"), quiet=True)
    assert summary["status"] == "finished" and summary["converged"] is True
    assert summary["threshold_step"] == expected == summary["steps"] == summary["final_val_step"]
    assert summary["stop_at"] == f"val_loss <= {threshold:g}" and summary["max_steps"] == 40
    assert summary["final_val_loss"] == evals[expected]
    rows = read_metrics(run / "metrics.jsonl")
    assert _keys(rows) == _keys([r for r in ref_rows if r["step"] <= expected])  # the same run, cut there
    assert json.loads((run / "checkpoint" / "meta.json").read_text())["step"] == expected


def test_a_run_that_reaches_the_cap_is_not_converged(tmp_path, cache_dir, reference):
    _, ref_rows, evals = reference
    run = tmp_path / "run"
    best = min(evals.values())
    summary = train(tiny(run, cache_dir, **SETTINGS, train__stop_at=f"val_loss < {best / 2!r}"), quiet=True)
    assert summary["status"] == "finished" and summary["steps"] == 40
    assert summary["converged"] is False and summary["threshold_step"] is None
    assert _keys(read_metrics(run / "metrics.jsonl")) == _keys(ref_rows)


def test_without_a_rule_the_summary_says_so(reference):
    run, _, _ = reference
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_at"] is None and summary["converged"] is None and summary["threshold_step"] is None


def test_a_resumed_run_meets_the_rule_at_the_same_step(tmp_path, cache_dir, reference):
    _, _, evals = reference
    steps = sorted(evals)
    threshold = evals[steps[-2]]
    expected = _rule_met_first(evals, threshold)
    assert expected > 10  # so that the interruption below comes before it
    run = tmp_path / "run"
    cfg = tiny(run, cache_dir, **SETTINGS, train__stop_at=f"val_loss <= {threshold!r}")

    def interrupt(step):
        if step == 10:
            raise KeyboardInterrupt

    first = train(cfg, quiet=True, _after_step=interrupt)
    assert first["status"] == "interrupted" and first["converged"] is False
    final = train(None, resume=run, quiet=True)
    assert final["threshold_step"] == expected == final["steps"] and final["converged"] is True
    again = train(None, resume=run, quiet=True)  # a converged run stays where it stopped
    assert again["steps"] == expected and again["threshold_step"] == expected


def test_the_rule_holding_at_step_zero_trains_nothing(tmp_path, cache_dir):
    summary = train(tiny(tmp_path / "run", cache_dir, **SETTINGS, train__stop_at="val_loss >= 0"), quiet=True)
    assert summary["threshold_step"] == 0 and summary["steps"] == 0 and summary["converged"] is True


@pytest.mark.parametrize("rule, fragments", [
    ("val_acc >= 0.9", ["train.stop_at", "'val_acc'", "did you mean 'val_accuracy'", "val_loss, val_accuracy"]),
    ("val_accuracy => 0.9", ["does not parse", "METRIC OP NUMBER"]),
    ("val_accuracy >= 1.5", ["1.5", "outside val_accuracy's range [0, 1]"]),
    ("val_loss <= -0.1", ["-0.1", "outside val_loss's range [0, inf]"]),
    ("val_loss <= nan", ["nan", "outside"]),
    ("val_loss <= x", ["'x' is not a number"]),
])
def test_a_bad_rule_is_a_one_line_error(rule, fragments):
    one_line_error(lambda: TrainConfig(stop_at=rule), *fragments)


@pytest.mark.parametrize("text, values, met", [
    ("val_accuracy >= 0.99", {"val_accuracy": 0.99}, True),
    ("val_accuracy > 0.99", {"val_accuracy": 0.99}, False),
    ("val_loss < 0.5", {"val_loss": 0.4999}, True),
    ("val_loss <= 0.5", {"val_loss": float("nan")}, False),
    ("val_loss <= 0.5", {"val_accuracy": 1.0}, False),
])
def test_the_rule_against_plain_comparisons(text, values, met):
    assert StopRule.parse(text).met(values) is met


def test_a_bad_rule_fails_before_training(tmp_path, cache_dir):
    with pytest.raises(ConfigError, match="stop_at"):
        train(tiny(tmp_path / "run", cache_dir, **SETTINGS, train__stop_at="accuracy >= 2"), quiet=True)
    assert not (tmp_path / "run").exists()
