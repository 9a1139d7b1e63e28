"""Research measurements reach the trainer through hooks (attnlab.train.hooks): a hook of a study's own is called
as the interface says and its numbers land in metrics.jsonl; the default hooks follow the run config."""

import math

import torch

from attnlab import GPT, GPTConfig
from attnlab.analysis.rank import rank_metrics
from attnlab.train import read_metrics, train
from attnlab.train.hooks import MagnitudeGateHook, RankHook, TrainHook, default_hooks
from helpers import tiny


class Recorder(TrainHook):
    """Counts every call, measures the mean |weight| of the first layer's W_q (a number we can recompute)."""

    prefixes = ("probe/",)

    def __init__(self):
        self.calls = []

    def step_begins(self, model, record):
        self.calls.append(("begins", record, model.training))

    def step_stats(self, model):
        self.calls.append(("stats",))
        return {"probe/wq_abs": float(model.blocks[0].attn.q_proj.weight.detach().abs().mean()), "probe/nan": math.nan}

    def step_ends(self, model):
        self.calls.append(("ends",))

    def eval_stats(self, model):
        self.calls.append(("eval",))
        return {"probe/eval_calls": float(sum(c[0] == "eval" for c in self.calls))}


def test_a_studys_hook_is_called_as_documented_and_logged(tmp_path):
    hook = Recorder()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model gains nothing from threads
    try:
        train(tiny(tmp_path / "run", tmp_path / "cache", train__max_steps=4, train__warmup_steps=2,
                   train__log_interval=2, train__eval_interval=4, train__sample_tokens=0, train__track_rank=False),
              quiet=True, hooks=[hook])
    finally:
        torch.set_num_threads(threads)
    steps = [c for c in hook.calls if c[0] == "begins"]
    assert [record for _, record, _ in steps] == [False, True, False, True]  # rows are logged at steps 2 and 4
    assert all(training for *_, training in steps)
    assert sum(c == ("ends",) for c in hook.calls) == 1 + 4  # once at build (recording off), then every step
    assert sum(c == ("stats",) for c in hook.calls) == 2
    assert sum(c == ("eval",) for c in hook.calls) == 2  # step 0 and step 4
    rows = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    assert sorted(rows) == [0, 2, 4]
    assert "probe/wq_abs" not in rows[0] and rows[0]["probe/eval_calls"] == 1.0
    assert rows[2]["probe/wq_abs"] > 0 and rows[2]["probe/nan"] is None  # non-finite values are logged as null
    assert "probe/eval_calls" not in rows[2] and rows[4]["probe/eval_calls"] == 2.0
    assert not any(key.startswith(("pseudo_rank/", "mag/")) for row in rows.values() for key in row)


def test_default_hooks_follow_the_config_and_the_model(tmp_path):
    cfg = tiny(tmp_path / "run", tmp_path / "cache")
    standard = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8))
    gated = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, attention="magnitude-causal"))
    assert [type(h) for h in default_hooks(cfg, standard)] == [RankHook]
    assert [type(h) for h in default_hooks(cfg, gated)] == [MagnitudeGateHook, RankHook]
    no_rank = cfg.replace(train=cfg.train.replace(track_rank=False))
    assert default_hooks(no_rank, standard) == []
    assert RankHook().eval_stats(standard) == rank_metrics(standard)
