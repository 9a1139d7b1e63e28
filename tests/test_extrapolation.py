"""Length extrapolation: a model trained at the task's seq_len T, evaluated at longer lengths (train.eval_lengths)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.analysis.task_mass import at_length, task_accuracy
from attnlab.errors import ConfigError
from attnlab.tasks import MQAR
from attnlab.train import train
from attnlab.train.hooks import LengthHook
from helpers import tiny


def _model(pos_encoding="rope", attention="standard", block_size=16):
    torch.manual_seed(4)
    return GPT(GPTConfig(vocab_size=40, block_size=block_size, n_layer=2, n_head=2, n_embd=16,
                         pos_encoding=pos_encoding, attention=attention)).eval()


@pytest.mark.parametrize("pos", ["rope", "sinusoidal", "none"])
@pytest.mark.parametrize("attention", ["standard", "ssmax", "magnitude-prefix-logits"])
def test_the_longer_copy_reads_a_prefix_as_the_model_does(pos, attention):
    """Causal attention: the first T positions of a 4T sequence see only themselves, so the copy's logits there
    equal the trained model's on those T tokens (float32; 1e-5 covers a different summation order in SDPA)."""
    model = _model(pos, attention)
    longer = at_length(model, 64)
    assert longer.config.block_size == 64 and not longer.training
    idx = torch.randint(0, 40, (3, 64))
    with torch.no_grad():
        short, _ = model(idx[:, :16])
        long, _ = longer(idx)
    torch.testing.assert_close(long[:, :16], short, atol=1e-5, rtol=1e-5)
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), longer.parameters()))


def test_learned_positions_cannot_extrapolate():
    with pytest.raises(ConfigError, match="learned positions has none beyond block_size=16"):
        at_length(_model("learned"), 32)


def test_the_hook_evaluates_the_task_at_each_length():
    task = MQAR(n_pairs=3, n_keys=6, n_values=6, seq_len=16)
    model = _model(block_size=16)
    hook = LengthHook(task, [32, 64], n=40)
    row = hook.eval_stats(model)
    assert sorted(row) == ["length/32/accuracy", "length/64/accuracy"]
    for length in (32, 64):
        x, y = task.replace(seq_len=length).sample(40, np.random.default_rng([13, length]))
        assert x.shape == (40, length) and ((y >= 0).sum(1) == 3).all()  # the same 3 queries, a longer stream
        with torch.no_grad():  # the accuracy counted here, on a GPT built at that length with the same weights
            fresh = GPT(model.config.replace(block_size=length)).eval()
            fresh.load_state_dict(model.state_dict())
            pred = fresh(torch.as_tensor(x))[0].argmax(-1).numpy()
        assert row[f"length/{length}/accuracy"] == pytest.approx(float((pred == y)[y >= 0].mean()), abs=1e-12)
    assert task_accuracy(model, task) == task_accuracy(model, task)  # the model's own mode and length untouched


def test_bad_lengths_are_one_line_errors(tmp_path):
    task = MQAR(n_pairs=3, n_keys=6, n_values=6, seq_len=16)
    with pytest.raises(ConfigError, match="each length must exceed the task's seq_len=16"):
        LengthHook(task, [16])
    with pytest.raises(ConfigError, match="repeats a length"):
        tiny(tmp_path, tmp_path, train__eval_lengths="[32,32]")
    with pytest.raises(ConfigError, match=r"train.eval_lengths\[\]"):
        tiny(tmp_path, tmp_path, train__eval_lengths="[0]")
    cfg = tiny(tmp_path / "run", tmp_path / "cache", train__eval_lengths="[64]", train__max_steps=1)
    with pytest.raises(ConfigError, match="is not a task"):
        train(cfg, quiet=True)
    cfg = tiny(tmp_path / "run2", tmp_path / "cache", data__source="task:mqar", train__eval_lengths="[64]",
               model__pos_encoding="learned", train__max_steps=1)
    with pytest.raises(ConfigError, match="'learned' has none"):
        train(cfg, quiet=True)


def test_a_run_logs_the_longer_lengths(tmp_path):
    run = tmp_path / "run"
    train(tiny(run, str(tmp_path / "cache"), data__source="task:mqar", model__pos_encoding="rope",
               train__eval_lengths="[64,128]", train__max_steps=4, train__warmup_steps=1, train__eval_interval=2,
               train__sample_tokens=0, train__track_rank=False), quiet=True)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if r.get("val_loss") is not None]
    assert [r["step"] for r in evals] == [0, 2, 4]
    assert all(0.0 <= r[f"length/{n}/accuracy"] <= 1.0 for r in evals for n in (64, 128))
