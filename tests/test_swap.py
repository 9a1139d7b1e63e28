"""attnlab swap: a trained model evaluated with its attention switched (a prior off, or on) at test time."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.errors import ConfigError
from attnlab.analysis.task_mass import task_accuracy
from attnlab.experiments.swap import evaluate_swap, swap_attention
from attnlab.tasks import HijackV2
from attnlab.train import train
from helpers import tiny


def _model(attention):
    torch.manual_seed(3)
    return GPT(GPTConfig(vocab_size=20, block_size=12, n_layer=2, n_head=2, n_embd=16, attention=attention)).eval()


def test_switching_the_prior_off_keeps_every_other_weight():
    trained = _model("magnitude-prefix-logits")
    swapped, params = swap_attention(trained, "standard")
    gate = [k for k in trained.state_dict() if ".magnitude." in k]
    assert gate and sorted(params["dropped"]) == sorted(gate) and params["new"] == []
    # independently: a standard GPT that must take exactly the other weights (strict load)
    plain = GPT(trained.config.replace(attention="standard")).eval()
    plain.load_state_dict({k: v for k, v in trained.state_dict().items() if k not in gate}, strict=True)
    idx = torch.randint(0, 20, (3, 12))
    with torch.no_grad():
        assert torch.equal(swapped(idx)[0], plain(idx)[0])
        assert not torch.allclose(swapped(idx)[0], trained(idx)[0])  # the prior did change the outputs


def test_switching_the_prior_on_adds_only_the_gate_at_its_initial_values():
    trained = _model("standard")
    swapped, params = swap_attention(trained, "magnitude-prefix-logits", seed=5)
    assert params["dropped"] == [] and params["new"] and all(".magnitude." in k for k in params["new"])
    state, original = swapped.state_dict(), trained.state_dict()
    assert all(torch.equal(state[k], original[k]) for k in params["copied"])
    torch.manual_seed(5)
    fresh = GPT(trained.config.replace(attention="magnitude-prefix-logits")).state_dict()
    assert all(torch.equal(state[k], fresh[k]) for k in params["new"])


def test_the_same_attention_gives_the_same_model():
    trained = _model("standard")
    swapped, params = swap_attention(trained, "standard")
    assert params["new"] == params["dropped"] == []
    idx = torch.randint(0, 20, (2, 12))
    with torch.no_grad():
        assert torch.equal(swapped(idx)[0], trained(idx)[0])


def test_task_accuracy_counts_every_answer():
    task = HijackV2.tiny()
    model = GPT(GPTConfig(vocab_size=task.vocab_size, block_size=task.seq_len, n_layer=1, n_head=2, n_embd=8)).eval()
    x, y = task.sample(40, np.random.default_rng(11))
    with torch.no_grad():
        guess = model(torch.as_tensor(x))[0].argmax(-1).numpy()
    want = (guess == y)[y >= 0].mean()
    assert task_accuracy(model, task, n=40, seed=11, batch_size=7) == pytest.approx(want, abs=1e-12)


@pytest.mark.slow  # trains a run and scores it at every m; CI runs it with the slow tests
def test_evaluate_swap_on_a_run(tmp_path):
    run = tmp_path / "run"
    train(tiny(run, str(tmp_path / "cache"), data__source="task:hijack-v2", data__task__m_max=4,
               data__task__seq_len=40, train__max_steps=4, train__warmup_steps=1, train__eval_interval=0, train__sample_tokens=0), quiet=True)
    result = evaluate_swap(run, "count-prior")
    saved = json.loads((run / "swap-count-prior.json").read_text())
    assert saved == json.loads(json.dumps(result))
    assert result["trained_with"] == "standard" and result["parameters"]["new"] == []
    assert set(result["original"]) == set(result["swapped"]) and "hijack/synonym-m4/accuracy" in result["original"]
    with pytest.raises(ConfigError, match="unknown attention variant"):
        evaluate_swap(run, "no-such-variant")


def test_a_text_run_is_a_one_line_error(tmp_path):
    run = tmp_path / "run"
    train(tiny(run, str(tmp_path / "cache"), train__max_steps=2, train__warmup_steps=1, train__eval_interval=0, train__sample_tokens=0),
          quiet=True)
    with pytest.raises(ConfigError, match="swap evaluates runs on a task") as info:
        evaluate_swap(run, "standard")
    assert "\n" not in str(info.value)


@pytest.mark.slow  # trains a whole comparison: about 25-50 s on the 2-core CPU
def test_swaps_over_a_comparison_are_summarised_and_shipped(tmp_path):
    import scipy.stats

    from attnlab.experiments import compare
    from attnlab.experiments.report import export_comparison
    from attnlab.experiments.swap import swap_comparison, swap_summary, swap_summary_table

    base = tiny(tmp_path / "unused", str(tmp_path / "cache"), data__source="task:hijack-v2", data__task__m_max=4,
                data__task__seq_len=40, train__max_steps=6, train__warmup_steps=1, train__eval_interval=0,
                train__sample_tokens=0)
    out = tmp_path / "cmp"
    compare(base, ["standard", "count-prior"], [0, 1, 2], out, quiet=True)
    results = swap_comparison(out, "standard", "count-prior")
    assert [r["run"] for r in results] == [str(out / "standard" / f"seed{s}") for s in (0, 1, 2)]
    metric = "hijack/exact-m4/accuracy"
    (row,) = swap_summary(out, [metric])
    original = [r["original"][metric] for r in results]
    swapped = [r["swapped"][metric] for r in results]
    cell = row["metrics"][metric]
    assert (row["trained"], row["attention"], row["n"]) == ("standard", "count-prior", 3)
    assert cell["original"]["mean"] == pytest.approx(np.mean(original), abs=1e-12)
    assert cell["swapped"]["mean"] == pytest.approx(np.mean(swapped), abs=1e-12)
    if len({b - a for a, b in zip(original, swapped)}) > 1:
        assert cell["test"]["p"] == pytest.approx(scipy.stats.ttest_rel(swapped, original).pvalue, rel=1e-10)
    assert "| `standard` | `count-prior` | 3 |" in swap_summary_table(out, [metric])
    export_comparison(out, tmp_path / "shipped")
    shipped = tmp_path / "shipped" / "standard" / "seed1" / "swap-count-prior.json"
    assert json.loads(shipped.read_text()) == json.loads((out / "standard" / "seed1" / "swap-count-prior.json").read_text())
    assert swap_summary(tmp_path / "shipped", [metric]) == swap_summary(out, [metric])
    with pytest.raises(ConfigError, match="no variant 'qk-norm'"):
        swap_comparison(out, "qk-norm", "standard")
