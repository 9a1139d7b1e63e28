"""benchmarks/head_at_answers.py: both sides train the experiment's config but for train.head_at_answers, and the
JSON names the task's real length and vocabulary (read from the task, not from the preset's placeholder model)."""

import contextlib
import io
import json

from helpers import script

head_at_answers = script("benchmarks/head_at_answers.py", "head_at_answers")


def test_the_benchmark_times_both_sides_of_the_switch(monkeypatch):
    seen = []

    def steps(cfg, n, device="cpu"):
        seen.append((cfg.train.head_at_answers, cfg.train.batch_size, n, device))
        return [0.5 if cfg.train.head_at_answers else 2.0] * n

    monkeypatch.setattr(head_at_answers, "attnlab_steps", steps)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        head_at_answers.main(["--batch", "4", "--steps", "3", "--repeats", "2"])
    row = json.loads(out.getvalue())
    assert seen == [(False, 4, 3, "cpu"), (True, 4, 3, "cpu")] * 2
    assert (row["seq_len"], row["vocab_size"], row["batch_size"]) == (64, 8192, 4)
    assert row["median_step_ms"] == {"every_position": 2000.0, "answers_only": 500.0} and row["ratio"] == 0.25
