"""Guards of the trainer. The divergence guard: a validation loss that stays above divergence_factor x the run's first
one for divergence_patience evaluations stops the run in one line, with status "diverged", and no checkpoint of
the bad state replaces the last good one."""

import copy
import json

import pytest

from attnlab.train import TrainingDiverged, find_checkpoint, read_metrics, train
from attnlab.train.checkpoint import load_checkpoint
from helpers import tiny

SETTINGS = dict(train__max_steps=200, train__eval_interval=10, train__checkpoint_interval=10, train__sample_tokens=0,
                train__eval_tokens=2048)


def test_lr_10_stops_with_one_line_and_keeps_the_good_checkpoint(tmp_path, cache_dir):
    """lr 1e-3 for 20 steps (two good checkpoints), then resumed at lr 10: the loss blows up and the run stops."""
    run = tmp_path / "run"
    train(tiny(run, cache_dir, **{**SETTINGS, "train__max_steps": 20, "train__warmup_steps": 0}), quiet=True)
    with pytest.raises(TrainingDiverged) as info:
        train(tiny(run, cache_dir, **{**SETTINGS, "train__lr": 10.0, "train__min_lr": 0.0, "train__warmup_steps": 0}),
              resume=run, quiet=True)
    message = str(info.value)
    assert "\n" not in message and "above 2 x its first value" in message and "3 evaluations in a row" in message
    rows = [r for r in read_metrics(run / "metrics.jsonl") if r.get("val_loss") is not None]
    first = rows[0]["val_loss"]
    bad = [r["step"] for r in rows if r["val_loss"] > 2 * first]
    assert bad == bad[:3] and len(bad) == 3 and bad[0] > 20  # three bad evaluations after the resume, then stop
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "diverged" and summary["steps"] == bad[-1]
    assert load_checkpoint(find_checkpoint(run))["step"] == 20  # the last good checkpoint, not a bad one


def test_patience_0_turns_the_guard_off(tmp_path, cache_dir):
    summary = train(tiny(tmp_path / "run", cache_dir, **{**SETTINGS, "train__max_steps": 40, "train__lr": 10.0,
                                                         "train__divergence_patience": 0}), quiet=True)
    assert summary["status"] == "finished" and summary["final_val_loss"] > 2 * 4.0


def test_bad_settings_are_one_line():
    from attnlab.train import TrainConfig
    from helpers import one_line_error

    one_line_error(lambda: TrainConfig(divergence_factor=1.0), "train.divergence_factor")
    one_line_error(lambda: TrainConfig(divergence_patience=-1), "train.divergence_patience")


def test_tf32_on_for_cuda_float32_and_off_inside_the_magnitude_gate():
    """TF32 on for CUDA float32 and off inside the magnitude gate, checked on CPU through the flags themselves (torch keeps them on CPU builds too). The flags
    are module properties, not attributes, so they are saved and restored by hand (monkeypatch cannot undo them)."""
    import torch

    from attnlab.mechanisms.magnitude.fused import ieee_float32
    from attnlab.train.trainer import configure_tf32

    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        assert not configure_tf32("cpu", "float32") and not configure_tf32("cuda", "bfloat16")
        assert not torch.backends.cuda.matmul.allow_tf32
        assert configure_tf32("cuda", "float32") and torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cudnn.allow_tf32
        with ieee_float32("cuda"):
            assert not torch.backends.cuda.matmul.allow_tf32
        assert torch.backends.cuda.matmul.allow_tf32  # restored after the gate
        with ieee_float32("cpu"):
            assert torch.backends.cuda.matmul.allow_tf32  # CPU matmuls have no TF32: nothing to switch
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.mark.parametrize("form", ["causal", "prefix"])
def test_full_precision_backward_gives_autograd_s_values_and_gradients(form):
    """The wrapper that runs the low-rank (autograd) gate's backward inside ieee_float32 on CUDA (its TF32 effect
    is measured in tests/test_cuda.py): forced on CPU, its weights and gradients (keys, log t, landmarks) equal
    plain autograd's in float64, to rounding (1e-12)."""
    import torch

    from attnlab.mechanisms.magnitude.fused import full_precision_backward, lowrank_key_weights

    torch.manual_seed(0)
    keys = torch.randn(2, 3, 40, 8, dtype=torch.float64, requires_grad=True)
    log_t = torch.tensor(0.3, dtype=torch.float64, requires_grad=True)
    marks = torch.randn(3, 16, 8, dtype=torch.float64, requires_grad=True)

    def fn(k, lt, lm):
        w, mag, _ = lowrank_key_weights(k, lm, lt.exp(), 0.1, form=form, chunk=16)
        return w, mag

    probe = None
    results = []
    for force in (False, True):
        w, mag = full_precision_backward(fn, keys, log_t, marks, force=force)
        probe = torch.linspace(-1, 1, w.numel(), dtype=w.dtype).view_as(w) if probe is None else probe
        grads = torch.autograd.grad((w * probe).sum() + mag.sum(), (keys, log_t, marks))
        results.append((w.detach(), *grads))
    for plain, wrapped in zip(*results):
        torch.testing.assert_close(wrapped, plain, rtol=1e-12, atol=1e-12)


def test_mfu_counts_the_magnitude_gates():
    """The gates' FLOPs (absent from 6 N) are counted; at least the Gram matrix of every gate,
    2 T^2 d per K/V head forward (a closed-form floor), and nothing for a model without gates."""
    import torch

    from attnlab import GPT, GPTConfig
    from attnlab.train.flops import gate_flops_per_token

    t, d = 64, 16
    for attention in ("magnitude-causal", "magnitude-prefix"):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=30, block_size=t, n_layer=2, n_head=2, n_embd=2 * d, attention=attention))
        per_token = gate_flops_per_token(model, t)
        assert per_token >= 2 * (2 * t * t * d) // t, attention  # 2 layers x 2 heads x 2 T^2 d / T
        assert all(p.grad is None for p in model.parameters())  # the count leaves no gradients behind
    assert gate_flops_per_token(GPT(GPTConfig(vocab_size=30, block_size=t, n_layer=2, n_head=2, n_embd=32)), t) == 0


def _fused_adamw_or_skip(device: str):
    """make_optimizer's AdamW on ``device``: fused where torch has the kernel (CPU and CUDA), else the test skips."""
    import torch

    from attnlab import GPT, GPTConfig
    from attnlab.train import TrainConfig, make_optimizer

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device: the CUDA fused AdamW is checked where one is")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=1, n_head=2, n_embd=8)).to(device)
    try:
        opt = make_optimizer(model, TrainConfig(), device)
    except RuntimeError as e:  # a torch build without the fused kernel for this device
        pytest.skip(f"this torch has no fused AdamW on {device}: {e}")
    if not opt.defaults.get("fused"):
        pytest.skip(f"make_optimizer does not use the fused AdamW on {device}")
    for group in opt.param_groups:
        group["lr"] = 1e-2  # lr_at(0) is 0 (warm-up)
    return model, opt


def _optimizer_state(model, opt) -> dict:
    """Every parameter, and every tensor of the optimizer's state (both moments, the step count), cloned."""
    state = {f"param/{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, p in enumerate(model.parameters()):
        for key, value in opt.state[p].items():
            state[f"state/{i}/{key}"] = value.detach().clone()
    return state


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_the_fused_adamw_found_inf_contract(device):
    """The private torch contract skip_step_if_not_finite relies on (see its docstring), checked against the installed
    torch: with found_inf = 1 the fused AdamW's step leaves every weight, both moments and the step count exactly as
    they were, even with NaN gradients; with found_inf = 0 it is an ordinary step, equal to the unfused AdamW's; the
    attribute is removed after the step. If this fails, torch changed the contract: the trainer can no longer skip
    a non-finite step on the device (read the loss every step instead, as under DDP)."""
    import torch

    from attnlab.train.optim import param_groups, skip_step_if_not_finite

    model, opt = _fused_adamw_or_skip(device)
    false, true = torch.zeros((), dtype=torch.bool, device=device), torch.ones((), dtype=torch.bool, device=device)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    skip_step_if_not_finite(opt, false)  # one ordinary step first: moments and step counts exist and are nonzero
    assert not hasattr(opt, "found_inf")
    before = _optimizer_state(model, opt)
    assert all(float(s["step"]) == 1 for s in opt.state.values())

    for p in model.parameters():
        p.grad = torch.full_like(p, float("nan"))
    skip_step_if_not_finite(opt, true)  # a flagged step: nothing moves
    after = _optimizer_state(model, opt)
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)

    reference = copy.deepcopy(model)  # the same state through the unfused AdamW: the step it must equal
    ref_opt = torch.optim.AdamW(param_groups(reference, 0.0), fused=False)
    ref_opt.load_state_dict(copy.deepcopy(opt.state_dict()))  # lr, betas, weight decay, moments, step counts
    grads = {n: torch.randn_like(p) for n, p in model.named_parameters()}
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        p.grad, q.grad = grads[n].clone(), grads[n].clone()
    skip_step_if_not_finite(opt, false)  # an unflagged step: an ordinary one
    ref_opt.step()
    assert all(float(s["step"]) == 2 for s in opt.state.values())
    assert not torch.equal(before["param/wte.weight"], model.wte.weight)
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6, msg=n)

