"""Tasks through the ordinary harness: data.source = "task:<name>" and data.task.<param> as config
keys, TaskDataset's batches, val_accuracy in metrics.jsonl, exact resume, one-line errors, the leak test on a model
trained on a task, and the attention-mass measurement against a hand count."""

import contextlib
import json
import math

import numpy as np
import pytest
import torch

from attnlab.analysis.task_mass import attention_mass
from attnlab.cli import main
from attnlab.configio import apply_overrides, load_config
from attnlab.data import DataConfig, prepare
from attnlab.data.tokenizers import TaskTokenizer, load_tokenizer
from attnlab.presets import load_preset
from attnlab.tasks import MQAR, get_task
from attnlab.train import RunConfig, load_run, read_metrics, train
from helpers import LEAK_TOL, max_leak, one_line_error, tiny

TASK = ["data.source=task:mqar", "data.task.n_pairs=4", "data.task.n_keys=8", "data.task.n_values=8",
        "data.task.seq_len=24"]


def test_task_parameters_are_config_keys():
    cfg = apply_overrides(load_preset("tiny"), TASK)
    assert cfg.data.task == {"n_pairs": 4, "n_keys": 8, "n_values": 8, "seq_len": 24}
    assert prepare(cfg.data).task == get_task("mqar", {"n_pairs": 4, "n_keys": 8, "n_values": 8, "seq_len": 24})
    again = apply_overrides(cfg, ["data.task.n_pairs=5"])  # one key changed, the others kept
    assert again.data.task == {**cfg.data.task, "n_pairs": 5}
    unset = apply_overrides(cfg, ["data.task.seq_len=none"])  # back to the task's default
    assert unset.data.task == {"n_pairs": 4, "n_keys": 8, "n_values": 8} and prepare(unset.data).seq_len == MQAR().seq_len == 32


def test_bad_task_settings_are_one_line_errors():
    one_line_error(lambda: DataConfig(source="task:mqr"), "'mqr'", "did you mean 'mqar'")
    one_line_error(lambda: DataConfig(source="task:mqar", task={"n_pair": 4}), "n_pair", "n_pairs")
    one_line_error(lambda: DataConfig(source="task:mqar", task={"n_pairs": 400}), "n_pairs=400")
    one_line_error(lambda: DataConfig(task={"n_pairs": 4}), "data.task", "not a task")
    one_line_error(lambda: apply_overrides(load_preset("tiny"), ["data.source=task:hijack", "data.task.m=10000"]),
                   "m=10000")


def test_task_tokenizer_round_trip(tmp_path):
    tok = TaskTokenizer(12, "mqar")
    assert tok.encode("3 11 0") == [3, 11, 0] and tok.decode([3, 11, 0]) == "3 11 0"
    tok.save(tmp_path / "t.json")
    assert load_tokenizer(tmp_path / "t.json") == tok
    for bad in ("12", "a 1", "", "-1"):
        with pytest.raises(ValueError):
            tok.encode(bad)


def test_batches_are_the_tasks_sequences():
    ds = prepare(apply_overrides(load_preset("tiny"), TASK).data)
    g = torch.Generator().manual_seed(5)
    x, y = ds.get_batch("train", 6, 24, g)
    assert x.shape == y.shape == (6, 24) and x.dtype == y.dtype == torch.int64
    g2 = torch.Generator().manual_seed(5)
    seed = int(torch.randint(2**62, (1,), generator=g2))
    want_x, want_y = ds.task.sample(6, np.random.default_rng([1, seed]))  # the documented seeding
    assert np.array_equal(x.numpy(), want_x) and np.array_equal(y.numpy(), want_y)
    batches = list(ds.val_batches(24 * 100, 64, 24))
    assert [b[0].shape[0] for b in batches] == [64, 36]
    first = np.concatenate([b[0].numpy() for b in batches])
    assert np.array_equal(first, np.concatenate([b[0].numpy() for b in ds.val_batches(24 * 100, 7, 24)]))
    assert not np.array_equal(first[:6], x.numpy())  # validation is another stream
    one_line_error(lambda: ds.get_batch("train", 2, 32, g), "block_size=32", "24")


def _train_task(tmp_path, name, steps, stop_after=None, **kw):
    """Train the small mqar config for ``steps`` steps; ``stop_after=k``: Ctrl-C after step k (checkpointed)."""
    cfg = apply_overrides(tiny(tmp_path / name, tmp_path / "cache", train__max_steps=steps, train__warmup_steps=2,
                               train__eval_interval=4, train__log_interval=2, train__sample_tokens=8, **kw), TASK)

    def interrupt(step):
        if step == stop_after:
            raise KeyboardInterrupt

    with one_thread():
        return cfg, train(cfg, quiet=True, _after_step=interrupt)


@contextlib.contextmanager
def one_thread():
    """A tiny model gains nothing from threads, and runs compared bit for bit must use the same number."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def test_a_task_run_logs_accuracy_and_resumes_exactly(tmp_path):
    cfg, summary = _train_task(tmp_path, "full", 8)
    saved = load_config(RunConfig, tmp_path / "full" / "config.toml")
    assert saved.model.block_size == 24 and saved.model.vocab_size == get_task("mqar", cfg.data.task).vocab_size
    rows = read_metrics(tmp_path / "full")
    evals = [r for r in rows if r["val_loss"] is not None]
    assert [r["step"] for r in evals] == [0, 4, 8]
    assert all(0 <= r["val_accuracy"] <= 1 for r in evals) and summary["final_val_accuracy"] == evals[-1]["val_accuracy"]
    assert all(r["val_accuracy"] is None for r in rows if r["val_loss"] is None)

    # the logged accuracy and loss are those of the saved model on the validation sequences, counted here by hand
    model, tokenizer, _ = load_run(tmp_path / "full")
    ds = prepare(saved.data)
    correct = total = 0
    nll = 0.0
    for x, y in ds.val_batches(saved.train.eval_tokens, 8, 24):
        logits = model(x)[0]
        for b in range(x.shape[0]):
            for t in range(x.shape[1]):
                if y[b, t] >= 0:
                    total += 1
                    correct += int(logits[b, t].argmax() == y[b, t])
                    nll -= torch.log_softmax(logits[b, t].double(), -1)[y[b, t]].item()
    assert summary["final_val_accuracy"] == pytest.approx(correct / total, abs=1e-12)
    assert summary["final_val_loss"] == pytest.approx(nll / total, rel=1e-5)
    assert all(word.isdigit() for word in (tmp_path / "full" / "samples.txt").read_text().split())
    assert tokenizer == TaskTokenizer(saved.model.vocab_size, "mqar")

    # Ctrl-C after step 5 and resume to 8: the same rows as the uninterrupted run
    assert _train_task(tmp_path, "half", 8, stop_after=5)[1]["status"] == "interrupted"
    with one_thread():
        resumed = train(None, resume=tmp_path / "half", quiet=True)
    keys = ("step", "train_loss", "val_loss", "val_accuracy", "grad_norm")
    assert [tuple(r[k] for k in keys) for r in read_metrics(tmp_path / "half")] == \
           [tuple(r[k] for k in keys) for r in rows]
    assert resumed["final_val_accuracy"] == summary["final_val_accuracy"]


def test_a_model_trained_on_a_task_does_not_leak(tmp_path):
    _train_task(tmp_path, "run", 4)
    model, _, _ = load_run(tmp_path / "run")
    assert max_leak(model) < LEAK_TOL


@pytest.mark.parametrize("fused", [False, True])
def test_attention_mass_against_a_hand_count(fused):
    """attention_mass averages, over the query positions, the weights on the unique key's and the cluster's
    positions; recomputed here from the model's attention maps with explicit loops. A binding is the key and the
    value token after it, or the one binding token when fused."""
    from attnlab import GPT, GPTConfig

    task = get_task("hijack", {"m": 4, "fused": fused})
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=task.vocab_size, block_size=task.seq_len, n_layer=2, n_head=2, n_embd=16))
    got = attention_mass(model, task, n=5, seed=3, batch_size=2)
    x, y = task.sample(5, np.random.default_rng(3))
    roles = task.roles(x)
    maps = model.attention_maps(torch.as_tensor(x))
    for layer in range(2):
        for head in range(2):
            sums, n = [0.0] * 4, 0
            for b in range(5):
                for i in np.flatnonzero(roles[b] == 3):
                    n += 1
                    for k, role in enumerate((1, 2)):
                        keys = np.flatnonzero(roles[b] == role)
                        sums[k] += sum(maps[layer][b, head, i, j].item() for j in keys)
                        sums[k + 2] += sum(maps[layer][b, head, i, j].item()
                                           + (0.0 if fused else maps[layer][b, head, i, j + 1].item())
                                           for j in keys)  # a binding: the key and the value token after it
            for k, name in enumerate(("unique", "cluster", "unique_binding", "cluster_binding")):
                assert got[name][layer, head] == pytest.approx(sums[k] / n, abs=1e-6), name
    assert got["n_queries"] == n
    logits = model(torch.as_tensor(x))[0]
    at = (roles == 3) & (y >= 0)
    assert got["accuracy"] == pytest.approx(float((logits.argmax(-1).numpy() == y)[at].mean()), abs=1e-12)
    assert (roles == 2).sum(1).tolist() == [4] * 5  # m = 4 cluster keys in every sequence
    one_line_error(lambda: attention_mass(model, get_task("mqar"), n=2), "mqar", "does not mark key roles")


def test_cli_tasks_and_mass(tmp_path, capsys):
    assert main(["tasks"]) == 0
    out = capsys.readouterr().out
    for name in ("mqar", "induction", "selective-copy", "noisy-recall", "hijack"):
        assert any(line.startswith(name + " ") for line in out.splitlines()), name
    run = tmp_path / "hj"
    cfg = apply_overrides(tiny(run, tmp_path / "cache", train__max_steps=2, train__warmup_steps=1,
                               train__eval_interval=0, train__sample_tokens=0),
                          ["data.source=task:hijack", "data.task.m=2", "data.task.m_max=8"])
    train(cfg, quiet=True)
    assert main(["mass", str(run), "m=8", "m_max=none", "--n", "4"]) == 0
    out = capsys.readouterr().out
    assert "| layer | unique binding" in out and "accuracy at them" in out
    assert json.loads((run / "summary.json").read_text())["status"] == "finished"
    assert math.isfinite(json.loads((run / "summary.json").read_text())["final_val_loss"])


def test_a_task_comparisons_report_names_the_task(tmp_path):
    from attnlab.experiments.grid import check_or_write_spec, spec_dict
    from attnlab.experiments.report import write_report

    base = apply_overrides(load_preset("tiny"), TASK)
    check_or_write_spec(tmp_path, spec_dict(base, ["standard"], [0]))
    text = write_report(tmp_path).read_text()  # no run has finished yet: the settings are still reported
    assert "source=task:mqar" in text and "task={'n_pairs': 4, 'n_keys': 8, 'n_values': 8, 'seq_len': 24}" in text


def test_the_head_at_the_answers_only_trains_the_same_run(tmp_path):
    """train.head_at_answers: the head and the loss at the answer positions only. Its training and validation losses
    and accuracies match the ordinary run's to float32 rounding (the same terms of the same mean, summed in another
    order: relative 1e-5 over 8 steps), and the accuracy it logs is the one counted from the full logits."""
    _, full = _train_task(tmp_path, "full", 8)
    _, lean = _train_task(tmp_path, "lean", 8, train__head_at_answers=True)
    a, b = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "lean")
    assert [r["step"] for r in a] == [r["step"] for r in b]
    for ra, rb in zip(a, b):
        for key in ("train_loss", "val_loss"):
            if ra[key] is not None:
                assert rb[key] == pytest.approx(ra[key], rel=1e-5), (ra["step"], key)
    assert lean["final_val_accuracy"] == full["final_val_accuracy"]
    assert lean["final_val_loss"] == pytest.approx(full["final_val_loss"], rel=1e-5)
