"""attnlab.train: schedule, parameter groups, the training loop and its run directory, checkpoints, resume."""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import signal
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from attnlab.config import GPTConfig
from attnlab.configio import load_config
from attnlab.data import Dataset, prepare
from attnlab.errors import ConfigError
from attnlab.model import GPT
from attnlab.train import (
    RunConfig,
    TrainConfig,
    TrainingDiverged,
    find_checkpoint,
    flops_per_token,
    load_checkpoint,
    load_run,
    lr_at,
    make_optimizer,
    matmul_peak_gflops,
    read_metrics,
    sample,
    save_checkpoint,
    split_params,
    train,
)
from attnlab.train import checkpoint as ckpt_mod
from attnlab import weights as weights_mod
from attnlab.train import distributed as dist_mod
from attnlab.train import flops as flops_mod
from attnlab.train.setup import Trainer
from helpers import tiny

EXACT_KEYS = ("step", "tokens", "train_loss", "val_loss", "lr", "grad_norm")
SUMMARY_KEYS = ("status", "steps", "final_val_loss", "best_val_loss", "tokens_seen", "wall_time_s", "n_params",
                "tokens_per_s", "mfu", "matmul_peak_gflops", "variant", "seed", "device")


pytestmark = pytest.mark.usefixtures("one_thread")


def exact_rows(run_dir) -> list[tuple]:
    return [tuple(r[k] for k in EXACT_KEYS) for r in read_metrics(os.path.join(run_dir, "metrics.jsonl"))]


def file_hash(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


# ------------------------------------------------------------------------------------------------ schedule


def test_a_warmup_longer_than_the_run_is_cut_to_the_run():
    """A preset's warmup (tiny: 5 steps) with a shorter run (a smoke run of 1-4 steps): W = min(warmup, max_steps),
    so the rate climbs linearly to lr at the last step instead of refusing the config."""
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=4)
    assert [lr_at(k, cfg) for k in range(5)] == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3], rel=1e-12)
    assert lr_at(1, cfg.replace(max_steps=1)) == 1e-3


def test_lr_at_matches_closed_form():
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=110)
    assert lr_at(0, cfg) == 0.0
    assert lr_at(5, cfg) == pytest.approx(5e-4, rel=1e-12)  # half way up the warmup
    assert lr_at(10, cfg) == pytest.approx(1e-3, rel=1e-12)  # peak at the end of warmup
    assert lr_at(60, cfg) == pytest.approx(5.5e-4, rel=1e-12)  # cosine midpoint: (lr + min_lr) / 2
    assert lr_at(35, cfg) == pytest.approx(1e-4 + 4.5e-4 * (1 + math.sqrt(0.5)), rel=1e-12)  # cos(pi/4)
    assert lr_at(85, cfg) == pytest.approx(1e-4 + 4.5e-4 * (1 - math.sqrt(0.5)), rel=1e-12)  # cos(3pi/4)
    assert lr_at(110, cfg) == pytest.approx(1e-4, rel=1e-12)
    assert lr_at(500, cfg) == pytest.approx(1e-4, rel=1e-12)
    decay = [lr_at(k, cfg) for k in range(10, 111)]
    assert all(a > b for a, b in zip(decay, decay[1:]))
    constant = cfg.replace(decay_lr=False)
    assert [lr_at(k, constant) for k in (5, 10, 60, 110)] == [5e-4, 1e-3, 1e-3, 1e-3]
    no_warmup = cfg.replace(warmup_steps=0)
    assert lr_at(0, no_warmup) == 1e-3 and lr_at(55, no_warmup) == pytest.approx(5.5e-4, rel=1e-12)


def test_decay_steps_ends_the_decay_before_the_cap_and_holds_min_lr_after_it():
    """A 110-step schedule run to a 400-step cap: the same closed-form rates as a 110-step run up to step 110
    (cosine midpoint at 60), then min_lr to the cap; a decay longer than the run stops part way down."""
    cfg = TrainConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, max_steps=400, decay_steps=110)
    assert lr_at(5, cfg) == pytest.approx(5e-4, rel=1e-12)
    assert lr_at(60, cfg) == pytest.approx(5.5e-4, rel=1e-12)
    assert lr_at(85, cfg) == pytest.approx(1e-4 + 4.5e-4 * (1 - math.sqrt(0.5)), rel=1e-12)
    assert [lr_at(k, cfg) for k in (110, 111, 250, 400)] == pytest.approx([1e-4] * 4, rel=1e-12)
    longer = cfg.replace(max_steps=35, decay_steps=60)  # the run ends at cos(pi/2): half way down
    assert lr_at(35, longer) == pytest.approx(5.5e-4, rel=1e-12)


# ------------------------------------------------------------------------------------------------ param groups


@pytest.mark.parametrize("extra", [{}, {"pos_encoding": "rope", "bias": False}, {"attention": "gqa"}])
def test_param_groups(extra):
    """Every Linear weight decays; biases, norms and embeddings do not (the tied head is the embedding)."""
    if extra.get("attention") == "gqa":
        extra = {"attention": {"n_kv_head": 1}}
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=16, **extra))
    decay, no_decay = split_params(model)
    decay_names, no_decay_names = {n for n, _ in decay}, {n for n, _ in no_decay}
    linear_weights = {f"{name}.weight" for name, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and name != "lm_head"}
    assert decay_names == linear_weights
    assert all(any(s in n for s in ("q_proj", "k_proj", "v_proj", "out_proj", "fc", "proj")) for n in decay_names)
    for name, p in model.named_parameters():
        if name.endswith(".bias") or ".ln_" in name or name.startswith(("ln_f", "wte", "pos")):
            assert name in no_decay_names, name
    assert "wte.weight" in no_decay_names and "lm_head.weight" not in decay_names | no_decay_names
    ids = [id(p) for _, p in decay + no_decay]
    assert len(ids) == len(set(ids)) == len(list(model.parameters()))
    assert sum(p.numel() for _, p in decay + no_decay) == sum(p.numel() for p in model.parameters())
    opt = make_optimizer(model, TrainConfig(weight_decay=0.1))
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    assert [len(g["params"]) for g in opt.param_groups] == [len(decay), len(no_decay)]


@pytest.mark.parametrize("variant", ["low-rank", "identity-qk", "qk-norm", "magnitude-causal"])
def test_matrices_outside_linear_layers_decay_too(variant):
    """Low-rank factors and identity-initialised weights are plain 2-D parameters: they decay like a Linear's
    weight, so variants compare fairly; scalar gains (qk-norm g, magnitude t/beta/gamma) do not."""
    model = GPT(GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=16, attention=variant))
    decay, no_decay = split_params(model)
    for name, p in decay:
        assert p.dim() == 2 and not name.startswith(("wte", "pos")), name
    for name, p in no_decay:
        assert p.dim() < 2 or name.startswith(("wte", "pos")), name
    assert sum(p.numel() for _, p in decay + no_decay) == sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------------------------------------ FLOPs


def test_flops_per_token_and_cached_peak(tmp_path, monkeypatch):
    cfg = GPTConfig(vocab_size=100, block_size=64, n_layer=3, n_head=4, n_embd=32)
    model = GPT(cfg)
    # N: every weight used in a matmul; the learned positions (64 x 32) are looked up, the tied wte is the head
    n = sum(p.numel() for p in model.parameters()) - 64 * 32
    assert flops_per_token(flops_mod.matmul_params(model), cfg) == 6 * n + 12 * 3 * 32 * 64
    peak = matmul_peak_gflops("cpu", tmp_path)
    assert peak > 0 and (tmp_path / "matmul_peak.json").is_file()
    # a measurement on a loaded machine (lower) cannot shrink the cached best; a better one replaces it
    monkeypatch.setattr(flops_mod, "measure_matmul_gflops", lambda *a, **k: peak / 3)
    assert matmul_peak_gflops("cpu", tmp_path) == peak
    monkeypatch.setattr(flops_mod, "measure_matmul_gflops", lambda *a, **k: peak * 2)
    assert flops_mod.matmul_peak("cpu", tmp_path) == {"gflops": peak * 2, "measurements": 3,
                                                       "since": time.strftime("%Y-%m-%d")}
    seen = []  # a bfloat16 run is measured against the bfloat16 peak, cached under its own key
    monkeypatch.setattr(flops_mod, "measure_matmul_gflops", lambda device, dtype: seen.append(dtype) or 7.0)
    assert matmul_peak_gflops("cpu", tmp_path, torch.bfloat16) == 7.0 and seen == [torch.bfloat16]
    assert matmul_peak_gflops("cpu", tmp_path) == peak * 2
    assert flops_mod.mfu(1000.0, 2e6, 100.0) == pytest.approx(1000 * 2e6 / 100e9)


# ------------------------------------------------------------------------------------------------ a whole run


def test_tiny_run_writes_every_artifact(tmp_path, cache_dir, capfd):
    cfg = tiny(tmp_path / "run", cache_dir, train__max_steps=20)
    summary = train(cfg, quiet=True)
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # quiet
    run = tmp_path / "run"
    for name in ("config.toml", "tokenizer.json", "metrics.jsonl", "loss.png", "samples.txt", "summary.json"):
        assert (run / name).is_file(), name
    ds = prepare(cfg.data)
    saved = load_config(RunConfig, run / "config.toml")
    assert saved.model == cfg.model.replace(vocab_size=ds.vocab_size) and saved.train == cfg.train
    assert json.loads((run / "tokenizer.json").read_text()) == json.loads(ds.tokenizer.to_json())

    rows = read_metrics(run / "metrics.jsonl")
    steps = [r["step"] for r in rows]
    assert steps == sorted(set(steps)) and steps[0] == 0 and steps[-1] == 20
    assert all(set(r) >= {"step", "tokens", "train_loss", "val_loss", "lr", "grad_norm", "tokens_per_s",
                          "step_time_s"} for r in rows)
    assert [r["step"] for r in rows if r["val_loss"] is not None] == [0, 10, 20]
    assert [r["step"] for r in rows if r["train_loss"] is not None] == [5, 10, 15, 20]
    assert all(r["tokens"] == r["step"] * 8 * 32 for r in rows)
    assert all(r["lr"] == lr_at(r["step"], cfg.train) for r in rows)
    first_val, last_val = rows[0]["val_loss"], rows[-1]["val_loss"]
    assert math.isfinite(last_val) and last_val < math.log(ds.vocab_size) and last_val < first_val

    png = (run / "loss.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 2000

    on_disk = json.loads((run / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert all(k in summary for k in SUMMARY_KEYS)
    assert summary["status"] == "finished" and summary["steps"] == 20 and summary["tokens_seen"] == 20 * 8 * 32
    assert summary["final_val_loss"] == last_val and summary["best_val_loss"] == min(r["val_loss"] for r in rows
                                                                                    if r["val_loss"] is not None)
    assert summary["variant"] == "standard" and summary["seed"] == 1337 and summary["device"] == "cpu"
    assert summary["tokens_per_s"] > 0 and summary["matmul_peak_gflops"] > 0 and 0 < summary["mfu"] < 1
    model, tokenizer, loaded_cfg = load_run(run)
    assert summary["n_params"] == sum(p.numel() for p in model.parameters())

    # the saved weights reproduce the reported validation loss (recomputed here independently)
    total, count = 0.0, 0
    with torch.no_grad():
        for x, y in ds.val_batches(cfg.train.eval_tokens, 8, cfg.model.block_size):
            logits, _ = model(x)
            total += torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
            count += y.numel()
    assert total / count == pytest.approx(summary["final_val_loss"], rel=1e-5)

    # pseudo-rank tracked on evaluation rows: recomputed here from the saved weights with plain SVDs
    assert [r["step"] for r in rows if "pseudo_rank/q/L0" in r] == [0, 10, 20]
    for i, block in enumerate(model.blocks):
        for m, weight in (("q", block.attn.q_proj.weight), ("o", block.attn.out_proj.weight)):
            s = torch.linalg.svdvals(weight.detach().double())
            energy = torch.cumsum(s**2, 0) / (s**2).sum()
            k_star = int((energy < 0.95).sum()) + 1  # smallest k holding 95% of sum s_i^2
            assert rows[-1][f"pseudo_rank/{m}/L{i}"] == pytest.approx(k_star / len(s), abs=1e-12)
            pr = float((s**2).sum() ** 2 / (s**4).sum())
            assert rows[-1][f"participation_ratio/{m}/L{i}"] == pytest.approx(pr, rel=1e-9)
    assert rows[-1]["pseudo_rank/q/mean"] == pytest.approx(
        sum(rows[-1][f"pseudo_rank/q/L{i}"] for i in range(cfg.model.n_layer)) / cfg.model.n_layer, abs=1e-12)

    text = (run / "samples.txt").read_text(encoding="utf-8")
    assert len(text) == cfg.train.sample_tokens and set(text) <= set(tokenizer.chars)

    # sample(): the requested number of tokens, reproducible, decoded by the run's tokenizer, RNG untouched
    rng = torch.get_rng_state()
    a = sample(run, max_new_tokens=37, seed=3)
    assert torch.equal(rng, torch.get_rng_state())
    assert len(a) == 37 and set(a) <= set(tokenizer.chars)
    assert sample(run, max_new_tokens=37, seed=3) == a
    assert sample(run, prompt="ROMEO:", max_new_tokens=5, temperature=0) == sample(run, "ROMEO:", 5, 0, None, 9)
    with pytest.raises(ConfigError, match="prompt"):
        sample(run, prompt="\u2603")

    with pytest.raises(ConfigError, match="already holds a run"):
        train(cfg, quiet=True)


def test_same_seed_same_losses(tmp_path, cache_dir):
    base = dict(train__max_steps=6, train__log_interval=1, train__eval_interval=3, model__dropout=0.1,
                train__sample_tokens=0)
    a = train(tiny(tmp_path / "a", cache_dir, **base), quiet=True)
    b = train(tiny(tmp_path / "b", cache_dir, **base), quiet=True)
    c = train(tiny(tmp_path / "c", cache_dir, train__seed=7, **base), quiet=True)
    assert exact_rows(tmp_path / "a") == exact_rows(tmp_path / "b")
    assert a["final_val_loss"] == b["final_val_loss"]
    assert exact_rows(tmp_path / "a") != exact_rows(tmp_path / "c") and c["final_val_loss"] != a["final_val_loss"]
    assert not (tmp_path / "a" / "samples.txt").exists()
    d = train(tiny(tmp_path / "d", cache_dir, train__track_rank=False, **base), quiet=True)
    assert d["final_val_loss"] == a["final_val_loss"]  # tracking the rank changes nothing else
    assert not any(k.startswith(("pseudo_rank", "participation")) for r in read_metrics(tmp_path / "d" /
                                                                                           "metrics.jsonl") for k in r)


@pytest.mark.slow  # about 26 s on the 2-core CPU: the default suite stays short; CI runs it with the slow tests
def test_bfloat16_autocast_run(tmp_path, cache_dir):
    summary = train(tiny(tmp_path / "bf16", cache_dir, train__max_steps=5, train__dtype="bfloat16",
                         train__sample_tokens=0), quiet=True)
    assert summary["status"] == "finished" and math.isfinite(summary["final_val_loss"])


# ------------------------------------------------------------------------------------------------ resume


RESUME = dict(train__max_steps=12, train__log_interval=1, train__eval_interval=4, train__checkpoint_interval=0,
              train__grad_accum=2, model__dropout=0.1, train__sample_tokens=20)


@pytest.fixture(scope="module")
def straight(tmp_path_factory, cache_dir):
    """The uninterrupted reference run for the resume tests."""
    run = tmp_path_factory.mktemp("straight") / "run"
    summary = train(tiny(run, cache_dir, **RESUME), quiet=True)
    return run, summary


def _interrupt_after_step(k):
    def hook(step):
        if step == k:
            raise KeyboardInterrupt
    return hook


def _sigint_after_step(k):
    def hook(step):
        if step == k:
            os.kill(os.getpid(), signal.SIGINT)  # a real Ctrl-C: the loop stops at the end of this step
    return hook


def _raise_on_call(monkeypatch, cls, name, n, when=lambda *a, **k: True):
    """Patch cls.name to raise KeyboardInterrupt on its n-th call for which ``when`` holds."""
    original = getattr(cls, name)
    calls = [0]

    def patched(*args, **kwargs):
        if when(*args, **kwargs):
            calls[0] += 1
            if calls[0] == n:
                raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(cls, name, patched)


@pytest.mark.parametrize("how", ["hook", "sigint", "mid_step", "mid_eval", "twice"])
def test_resume_is_exact(tmp_path, cache_dir, straight, monkeypatch, how):
    ref_run, ref = straight
    run = tmp_path / "run"
    cfg = tiny(run, cache_dir, **RESUME)
    hook, stopped_at = None, 5
    if how in ("hook", "twice"):
        hook = _interrupt_after_step(5)
    elif how == "sigint":
        hook = _sigint_after_step(5)
    elif how == "mid_step":  # Ctrl-C while drawing the 2nd micro-batch of step 6: step 6 is rolled back
        _raise_on_call(monkeypatch, Dataset, "get_batch", 12, when=lambda self, split, *a: split == "train")
    elif how == "mid_eval":  # Ctrl-C during the validation of step 8: its row is written after resuming
        _raise_on_call(monkeypatch, Trainer, "evaluate", 3)
        stopped_at = 8
    first = train(cfg, quiet=True, _after_step=hook)
    monkeypatch.undo()
    assert first["status"] == "interrupted" and first["steps"] == stopped_at
    assert find_checkpoint(run) == run / "checkpoint"
    assert json.loads((run / "checkpoint" / "meta.json").read_text())["step"] == stopped_at
    assert not (run / "samples.txt").exists()
    if how == "twice":  # interrupted again after resuming, then resumed to the end
        second = train(None, resume=run, quiet=True, _after_step=_interrupt_after_step(9))
        assert second["status"] == "interrupted" and second["steps"] == 9
    final = train(None, resume=str(run), quiet=True)
    assert final["status"] == "finished" and final["steps"] == 12
    assert exact_rows(run) == exact_rows(ref_run)  # bit-for-bit, no duplicated or missing steps
    for key in ("final_val_loss", "best_val_loss", "final_train_loss", "tokens_seen"):
        assert final[key] == ref[key], key
    mine, theirs = (load_file(r / "checkpoint" / "model.safetensors") for r in (run, ref_run))
    assert mine.keys() == theirs.keys() and all(torch.equal(mine[k], theirs[k]) for k in mine)
    assert (run / "samples.txt").read_text() == (ref_run / "samples.txt").read_text()


def test_resume_with_a_longer_schedule_and_errors(tmp_path, cache_dir, straight):
    ref_run, _ = straight
    run = tmp_path / "run"
    shutil.copytree(ref_run, run)
    longer = tiny(tmp_path / "elsewhere", cache_dir, **{**RESUME, "train__max_steps": 14})
    summary = train(longer, resume=run, quiet=True)
    assert summary["status"] == "finished" and summary["steps"] == 14 and not (tmp_path / "elsewhere").exists()
    assert [r[:5] for r in exact_rows(run)[:13]] == [r[:5] for r in exact_rows(ref_run)]
    assert [r[0] for r in exact_rows(run)] == list(range(15))
    assert load_config(RunConfig, run / "config.toml").train.max_steps == 14
    with pytest.raises(ConfigError, match="different \\[model\\]"):
        train(tiny(run, cache_dir, model__n_layer=1), resume=run)
    with pytest.raises(ConfigError, match="not a run directory"):
        train(None, resume=tmp_path)
    with pytest.raises(ConfigError, match="RunConfig"):
        train(None)


# ------------------------------------------------------------------------------------------------ checkpoints


def _tiny_model(seed):
    torch.manual_seed(seed)
    return GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=8))


def test_checkpoint_roundtrip_keeps_tied_weight(tmp_path):
    model = _tiny_model(0)
    save_checkpoint(tmp_path, model, {"step": 3, "extra": torch.arange(4)})
    fresh = _tiny_model(1)
    state = load_checkpoint(find_checkpoint(tmp_path), fresh)
    assert state["step"] == 3 and torch.equal(state["extra"], torch.arange(4))
    assert fresh.lm_head.weight is fresh.wte.weight
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values()):
        assert torch.equal(a, b), name


def test_checkpoint_crash_mid_save_keeps_previous(tmp_path, monkeypatch):
    good = _tiny_model(0)
    save_checkpoint(tmp_path, good, {"step": 1})

    def crash(tensors, path, metadata=None):  # a partial file, then the "crash"
        open(path, "wb").write(b"\0" * 100)
        raise OSError("disk full")

    monkeypatch.setattr(weights_mod, "save_file", crash)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(tmp_path, _tiny_model(1), {"step": 2})
    monkeypatch.undo()
    assert find_checkpoint(tmp_path) == tmp_path / "checkpoint"
    loaded = _tiny_model(2)
    assert load_checkpoint(find_checkpoint(tmp_path), loaded)["step"] == 1
    assert torch.equal(loaded.wte.weight, good.wte.weight)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]

    # a kill between "old checkpoint renamed away" and "new one renamed into place": the new one is found
    renames = [0]
    real_rename = os.rename

    def killed_rename(src, dst):
        renames[0] += 1
        if renames[0] == 2:
            raise KeyboardInterrupt
        real_rename(src, dst)

    monkeypatch.setattr(ckpt_mod.os, "rename", killed_rename)
    newer = _tiny_model(3)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(tmp_path, newer, {"step": 2})
    monkeypatch.undo()
    assert not (tmp_path / "checkpoint").exists()
    found = find_checkpoint(tmp_path)
    assert found.name.endswith(".new") and load_checkpoint(found, loaded)["step"] == 2
    assert torch.equal(loaded.wte.weight, newer.wte.weight)
    (tmp_path / ".checkpoint-dead.new").mkdir()  # an incomplete leftover (no meta.json) is ignored...
    assert find_checkpoint(tmp_path) == found
    save_checkpoint(tmp_path, good, {"step": 3})  # ...and the next save clears every leftover
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint"]


def test_failed_save_during_training_leaves_resumable_run(tmp_path, cache_dir, straight, monkeypatch):
    ref_run, ref = straight
    run = tmp_path / "run"
    calls = [0]
    real = weights_mod.save_file

    def flaky(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:
            raise OSError("disk full")
        return real(*args, **kwargs)

    monkeypatch.setattr(weights_mod, "save_file", flaky)
    with pytest.raises(OSError, match="disk full"):
        train(tiny(run, cache_dir, **{**RESUME, "train__checkpoint_interval": 4}), quiet=True)
    monkeypatch.undo()
    assert json.loads((run / "checkpoint" / "meta.json").read_text())["step"] == 4
    load_run(run)
    assert train(None, resume=run, quiet=True)["final_val_loss"] == ref["final_val_loss"]
    assert exact_rows(run) == exact_rows(ref_run)


# ------------------------------------------------------------------------------------------------ divergence


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_loss_stops_the_run(tmp_path, cache_dir, monkeypatch, bad):
    run = tmp_path / "run"
    original = GPT.forward
    calls = [0]

    def forward(self, idx, targets=None, **kw):
        logits, loss = original(self, idx, targets, **kw)
        if self.training and loss is not None:
            calls[0] += 1
            if calls[0] == 7:
                loss = loss * bad
        return logits, loss

    monkeypatch.setattr(GPT, "forward", forward)
    hashes = {}

    def remember(step):
        if step == 5:
            hashes["weights"] = file_hash(run / "checkpoint" / "model.safetensors")
            hashes["state"] = file_hash(run / "checkpoint" / "state.pt")

    cfg = tiny(run, cache_dir, train__max_steps=12, train__checkpoint_interval=5)
    with pytest.raises(TrainingDiverged, match="diverged at step 7") as info:
        train(cfg, quiet=True, _after_step=remember)
    assert "\n" not in str(info.value) and "checkpoint" in str(info.value)
    summary = json.loads((run / "summary.json").read_text())
    # the host reads the loss at the logged steps only (5, 10, ...): step 7's update is skipped on the device by
    # the fused AdamW, steps 8 and 9 train, and step 10 stops before its update
    assert summary["status"] == "diverged" and summary["steps"] == 9
    assert json.loads((run / "checkpoint" / "meta.json").read_text())["step"] == 5
    assert file_hash(run / "checkpoint" / "model.safetensors") == hashes["weights"]
    assert file_hash(run / "checkpoint" / "state.pt") == hashes["state"]
    assert max(r["step"] for r in read_metrics(run / "metrics.jsonl")) == 5
    assert all(math.isfinite(r["train_loss"]) for r in read_metrics(run / "metrics.jsonl") if r["train_loss"])


# ------------------------------------------------------------------------------------------------ misc


def test_tensorboard_missing_is_a_config_error(tmp_path, cache_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # the import fails as if not installed
    with pytest.raises(ConfigError, match=r"pip install .attnlab\[tensorboard\]."):
        train(tiny(tmp_path / "tb", cache_dir, train__tensorboard=True), quiet=True)
    assert not (tmp_path / "tb").exists()


def test_float16_on_the_cpu_is_a_one_line_error_before_anything_is_written(tmp_path, cache_dir):
    """float16 autocast on the CPU would run silently and many times slower: refused, bfloat16 named instead."""
    with pytest.raises(ConfigError, match=r"train.dtype='float16' on the CPU.*bfloat16"):
        train(tiny(tmp_path / "fp16", cache_dir, train__dtype="float16", train__device="cpu"), quiet=True)
    assert not (tmp_path / "fp16").exists()


def test_tensorboard_events_match_metrics(tmp_path, cache_dir):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "tb"
    train(tiny(run, cache_dir, train__tensorboard=True, train__max_steps=4, train__warmup_steps=1), quiet=True)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    logged = {e.step: e.value for e in events.Scalars("val_loss")}
    want = {r["step"]: r["val_loss"] for r in read_metrics(run / "metrics.jsonl") if r["val_loss"] is not None}
    assert logged.keys() == want.keys() and all(abs(logged[k] - want[k]) < 1e-6 for k in want)


def test_global_batch_split_over_ranks():
    slices = [dist_mod.local_slice(8, dist_mod.DistInfo(r, 4)) for r in range(4)]
    assert [list(range(8))[s] for s in slices] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    with pytest.raises(ConfigError, match="divisible"):
        dist_mod.local_slice(7, dist_mod.DistInfo(0, 2))


def test_stop_signals_first_asks_second_raises_but_not_inside_the_update():
    """The handler only sets a flag; a second signal raises KeyboardInterrupt at once, except inside the update
    (uninterruptible), where it stays a request to stop after the step; the previous handlers come back."""
    from attnlab.train.signals import StopSignals

    said = []
    previous = signal.getsignal(signal.SIGINT)
    with StopSignals(said.append) as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested and len(said) == 1
        with stop.uninterruptible():
            os.kill(os.getpid(), signal.SIGTERM)  # a second one during the update: no exception
        assert stop.requested and len(said) == 1
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):  # the handler runs at the next bytecode boundary
                pass
    assert signal.getsignal(signal.SIGINT) is previous
