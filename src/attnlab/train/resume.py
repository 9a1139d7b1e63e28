"""What makes a resumed run continue bit for bit: the checkpoint's state, and the undo of an interrupted step.

A checkpoint (:mod:`attnlab.train.checkpoint`: weights + state.pt + meta.json, replaced atomically) is always taken at
a step boundary and stores everything the rest of the run depends on: the weights, the optimizer and grad-scaler
state, the batch generator, every rank's RNG state, the step and token counts, and the loop's record (validation
losses, the stop rule's step, the last row's stats, the time spent). :func:`restore` puts all of it back.

A step changes nothing of that state before its optimizer update except the batch generator, the RNG (dropout) and
the gradients; :func:`snapshot` remembers the first two and :func:`rollback` restores them and drops the gradients,
so that a step interrupted before its update leaves the run at the previous boundary.
"""

from __future__ import annotations

import torch

from . import distributed as D
from .checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from .guards import DivergenceGuard

__all__ = ["save", "restore", "snapshot", "rollback", "rng_state", "set_rng_state"]

FORMAT = 1


def rng_state(device: torch.device) -> dict:
    """The torch CPU RNG state and, on CUDA, the device's RNG state."""
    state = {"cpu": torch.get_rng_state(), "cuda": None}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


def snapshot(t) -> tuple:
    """What a step changes before its update (batch generator, RNG): restored by :func:`rollback`."""
    return t.gen.get_state(), rng_state(t.device)


def rollback(t, snap: tuple) -> None:
    """Undo a step that did not reach its update: the batch generator and RNG as before it, no gradients."""
    t.gen.set_state(snap[0])
    set_rng_state(snap[1], t.device)
    t.optimizer.zero_grad(set_to_none=True)


def save(t) -> None:
    """Checkpoint the current step boundary (collective under DDP: gathers every rank's RNG state)."""
    rng = D.gather_objects(rng_state(t.device), t.info)
    if t.info.is_main:
        state = {
            "format": FORMAT,
            "step": t.step,
            "tokens": t.tokens,
            "optimizer": t.optimizer.state_dict(),
            "scaler": t.scaler.state_dict() if t.scaler.is_enabled() else None,
            "batch_generator": t.gen.get_state(),
            "rng": rng,
            "world_size": t.info.world_size,
            "best_val_loss": t.best_val,
            "last_val_loss": t.last_val,
            "last_val_accuracy": t.last_acc,
            "last_eval_step": t.last_eval_step,
            "first_val_loss": t.divergence.first,
            "threshold_step": t.threshold_step,
            "last_stats": t.last_stats,
            "elapsed_s": t.elapsed(),
        }
        save_checkpoint(t.run_dir, t.model, state, {"tokens": t.tokens})
    t.saved_step = t.step
    D.barrier(t.info)


def restore(t) -> None:
    """Load the latest complete checkpoint of the run directory (none: start from scratch in it)."""
    folder = find_checkpoint(t.run_dir)
    if folder is None:
        return
    state = load_checkpoint(folder, t.model, map_location="cpu")
    t.optimizer.load_state_dict(state["optimizer"])
    if state.get("scaler"):
        t.scaler.load_state_dict(state["scaler"])
    t.gen.set_state(state["batch_generator"])
    rng = state["rng"]  # one per rank; a run resumed on another number of ranks starts them all from rank 0's
    set_rng_state(rng[t.info.rank] if len(rng) == t.info.world_size else rng[0], t.device)
    t.step = t.saved_step = int(state["step"])
    t.tokens = int(state["tokens"])
    t.best_val, t.last_val = state.get("best_val_loss"), state.get("last_val_loss")
    t.last_acc = state.get("last_val_accuracy")
    t.last_eval_step = state.get("last_eval_step")
    t.divergence = DivergenceGuard(t.tc, first=state.get("first_val_loss"))
    t.threshold_step = state.get("threshold_step")
    t.last_stats = state.get("last_stats") or {}
    t.elapsed_before = float(state.get("elapsed_s", 0.0))
