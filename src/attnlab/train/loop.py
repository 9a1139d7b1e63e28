"""The training loop, read top to bottom: :func:`run` takes the steps, :func:`train_step` is one step.

Step k (counted from 1: the k-th optimizer update) goes, as :func:`train_step` reads:

1. the learning rate: every parameter group gets lr_at(k) (linear warmup, then cosine decay; attnlab.train.optim).
2. the micro-batches: train.grad_accum times, this rank's slice of the next global batch from the seeded batch
   generator, the forward pass under autocast (train.dtype), and the backward pass of loss / grad_accum (fp16:
   scaled by the GradScaler). Under DDP the gradients are all-reduced on the last micro-batch only.
3. the gradients: unscaled (fp16), their global norm taken before clipping, clipped to train.grad_clip when > 0.
4. the non-finite guard (attnlab.train.guards): a NaN or infinite loss or norm stops the run before the update.
   With the fused AdamW the check stays on the device, read only at steps that are read anyway (logged, evaluated,
   saved, the last one, or stopping); under DDP the ranks also agree here whether to stop after this step.
5. the update: AdamW's step (skipped on the device for a bad step), zero_grad, and the step and token counts.

Steps 2-4 change only the batch generator, the RNG and the gradients: interrupted (Ctrl-C twice, or a guard), they
are undone (attnlab.train.resume.rollback) and the run is back at the previous step boundary. Step 5 lands whole
(a second Ctrl-C waits for it: attnlab.train.signals).

Then the bookkeeping of step k (:func:`bookkeeping`), each part when due: the validation (every
train.eval_interval steps and at the last one), with the stop rule (train.stop_at) and the divergence guard on it;
the metrics row (every train.log_interval steps and at every validation); the checkpoint (every
train.checkpoint_interval steps and at the last one). The loop ends at train.max_steps, when the stop rule is met,
or when a signal asked it to stop; :func:`finish` then checkpoints the boundary it stopped at, samples text from a
finished run and writes summary.json.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable

import torch
from torch import nn

from ..atomic import write_text
from ..rundir import SAMPLES_FILE
from . import distributed as D
from . import report
from .checkpoint import find_checkpoint
from .config import TrainConfig
from .guards import Diverged, TrainingDiverged, diverged_message
from .optim import lr_at, set_lr, skip_step_if_not_finite
from .resume import rollback, save, snapshot
from .sampling import SAMPLE_TEMPERATURE, SAMPLE_TOP_K, generate_text
from .signals import StopSignals

__all__ = ["run", "train_step", "bookkeeping", "eval_due", "row_due", "checkpoint_due"]


# ============================================================================================ the loop


def run(t, after_step: Callable[[int], None] | None = None) -> dict:
    """Train ``t`` (an attnlab.train.setup.Trainer) to train.max_steps, or until stopped; returns the summary."""
    status = "finished"
    bar = report.progress_bar(t)
    try:
        with StopSignals(lambda text: report.say(t, text)) as stop:
            catch_up(t)
            while training_left(t) and not stop_agreed(t, stop):
                stats = train_step(t, stop)
                bookkeeping(t, t.step, stats)
                show_progress(bar, stats, t.tokens_per_step)
                if after_step is not None:
                    after_step(t.step)
            if training_left(t):
                status = "interrupted"
    except KeyboardInterrupt:  # a second Ctrl-C: the run is at a step boundary (train_step undid a partial step)
        status = "interrupted"
    except Diverged as d:
        bar.close()
        diverged(t, d)
    finally:
        bar.close()
    return finish(t, status)


def train_step(t, stop: StopSignals) -> dict:
    """Take step k = t.step + 1 (the list in the module docstring); returns its stats for the metrics row."""
    k = t.step + 1
    lr = lr_at(k, t.tc)
    set_lr(t.optimizer, lr)                                                   # 1. the schedule's lr for step k
    logged = row_due(k, t.tc)                                                 # its row is written: hooks measure
    read = logged or eval_due(k, t.tc) or checkpoint_due(k, t.tc) or k >= t.tc.max_steps  # host reads allowed
    start = time.perf_counter()
    before = snapshot(t)
    try:
        with measuring(t.hooks, t.model, logged):
            loss = forward_backward(t)                                        # 2. micro-batches, backward
        grad_norm = clip_gradients(t)                                         # 3. the norm before clipping
        if t.guard.on_device:                                                 # 4. the non-finite guard, no read:
            t.stop_agreed = stop.requested                                    #    one process votes alone
            bad = t.guard.flag(k, loss, grad_norm)                            #    remembered on the device
            if read or t.stop_agreed:
                t.guard.raise_if_flagged()                                    #    names the first bad step
            loss_value, norm_value = (float(loss), float(grad_norm)) if read else (None, None)
        else:                                                                 # 4. the guard on host values
            loss_value, t.stop_agreed = mean_loss_and_stop_vote(t, loss, stop.requested)
            norm_value = float(grad_norm)
            t.guard.check(k, loss_value, norm_value, scaled=t.scaler.is_enabled())
    except BaseException:  # Ctrl-C or a guard before the update: undo the step's draws and gradients
        rollback(t, before)
        raise
    with stop.uninterruptible():                                              # 5. the update, whole
        if t.guard.on_device:
            skip_step_if_not_finite(t.optimizer, bad)                         #    a no-op on the device when bad
        else:
            t.scaler.step(t.optimizer)                                        #    fp16: skipped on inf gradients
            t.scaler.update()
        t.optimizer.zero_grad(set_to_none=True)
        t.step, t.tokens = k, t.tokens + t.tokens_per_step
    elapsed = time.perf_counter() - start
    t.throughput.add(t.tokens_per_step, elapsed)
    stats = {"train_loss": loss_value, "lr": lr, "grad_norm": norm_value, "step_time_s": elapsed}
    return {**stats, **{key: v for hook in t.hooks for key, v in hook.step_stats(t.model).items()}} \
        if logged else stats


def bookkeeping(t, k: int, stats: dict) -> None:
    """After step k: validation, the metrics row, the checkpoint, whichever are due; raises Diverged from the
    divergence guard (after the row is written, before a checkpoint of the bad state)."""
    t.last_stats = stats
    val = None
    if eval_due(k, t.tc):
        val, t.last_acc = t.evaluate()
        t.last_val, t.last_eval_step = val, k
        if math.isfinite(val) and (t.best_val is None or val < t.best_val):
            t.best_val = val
        t.divergence.watch(val)
        if t.stop_rule and t.threshold_step is None and t.stop_rule.met(
                {"val_loss": val, "val_accuracy": t.last_acc}):
            t.threshold_step = k  # the loop ends after this step
    if row_due(k, t.tc) or val is not None:
        report.log_step(t, k, stats, val)
    if checkpoint_due(k, t.tc) and t.saved_step != k and not t.divergence.bad:  # no checkpoint of a bad state
        save(t)
    t.divergence.raise_if_diverged(k, val)


# ============================================================================================ when


def eval_due(k: int, tc: TrainConfig) -> bool:
    """Validation after step k: every train.eval_interval steps (0: never) and after the last step."""
    return k == tc.max_steps or (tc.eval_interval > 0 and k % tc.eval_interval == 0)


def row_due(k: int, tc: TrainConfig) -> bool:
    """A metrics row for step k: every train.log_interval steps and at every validation."""
    return k % tc.log_interval == 0 or eval_due(k, tc)


def checkpoint_due(k: int, tc: TrainConfig) -> bool:
    """A checkpoint after step k: every train.checkpoint_interval steps (0: only the last) and after the last."""
    return k > 0 and (k == tc.max_steps or (tc.checkpoint_interval > 0 and k % tc.checkpoint_interval == 0))


def training_left(t) -> bool:
    """Below the step cap and the stop rule (train.stop_at) not met yet."""
    return t.step < t.tc.max_steps and t.threshold_step is None


def stop_agreed(t, stop: StopSignals) -> bool:
    """Stop before the next step: under DDP when the ranks voted so in the last step (all stop alike), else as
    soon as a signal asked."""
    return t.stop_agreed if t.info.enabled else stop.requested


# ============================================================================================ step details


@contextlib.contextmanager
def measuring(hooks, model, record: bool):
    """The hooks around a step's forward/backward (attnlab.train.hooks); ``record``: its row will be logged."""
    for hook in hooks:
        hook.step_begins(model, record)
    try:
        yield
    finally:
        for hook in hooks:
            hook.step_ends(model)


def next_batch(t) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's slice of the next global micro-batch (every rank draws the same global batch)."""
    x, y = t.ds.get_batch("train", t.tc.batch_size, t.cfg.model.block_size, t.gen)
    x, y = x[t.rows_slice], y[t.rows_slice]
    if t.device.type == "cuda":
        return x.pin_memory().to(t.device, non_blocking=True), y.pin_memory().to(t.device, non_blocking=True)
    return x.to(t.device), y.to(t.device)


def forward_backward(t) -> torch.Tensor:
    """train.grad_accum micro-batches, each loss scaled by 1/grad_accum; returns their mean loss (0-d, not read)."""
    ga = t.tc.grad_accum
    total = torch.zeros((), device=t.device)
    for micro in range(ga):
        x, y = next_batch(t)
        no_sync = t.info.enabled and micro < ga - 1  # DDP all-reduces the gradients in the last backward only
        with t.ddp.no_sync() if no_sync else contextlib.nullcontext():
            with t.autocast():
                _, loss = t.ddp(x, y, answers_only=t.tc.head_at_answers)
            t.scaler.scale(loss / ga).backward()
        total += loss.detach().float()
    return total / ga


def clip_gradients(t) -> torch.Tensor:
    """Global gradient norm before clipping (a 0-d tensor, not read); clips to train.grad_clip when > 0."""
    t.scaler.unscale_(t.optimizer)
    params = [p for g in t.optimizer.param_groups for p in g["params"] if p.grad is not None]
    if t.tc.grad_clip > 0:
        return nn.utils.clip_grad_norm_(params, t.tc.grad_clip)
    return nn.utils.get_total_norm([p.grad for p in params])


def mean_loss_and_stop_vote(t, loss: torch.Tensor, stop_requested: bool) -> tuple[float, bool]:
    """The step's loss averaged over ranks (read on the host) and whether any rank asks to stop: one all_reduce."""
    both = torch.stack([loss, torch.tensor(float(stop_requested), device=t.device)])
    summed = D.all_reduce(both, t.info)  # sums over ranks (no-op on one process)
    return float(summed[0]) / t.info.world_size, bool(summed[1] > 0)


def show_progress(bar, stats: dict, tokens_per_step: int) -> None:
    bar.update(1)
    if stats["train_loss"] is not None:  # read on the host at the steps that are read only
        tok_s = tokens_per_step / max(stats["step_time_s"], 1e-9)
        bar.set_postfix(loss=f"{stats['train_loss']:.4f}", tok_s=f"{tok_s:.0f}", refresh=False)


# ============================================================================================ start and end


def catch_up(t) -> None:
    """Step 0 validation on a fresh run; after a resume, redo a row the interruption left unwritten."""
    k = t.step
    due = (k == 0 and t.tc.eval_interval > 0) or (k > 0 and row_due(k, t.tc))
    if due and t.info.is_main:
        due = k not in t.logged_steps
    if D.broadcast_object(due, t.info):  # rank 0 knows which rows are written
        bookkeeping(t, k, t.last_stats if k else {})


def finish(t, status: str) -> dict:
    """Checkpoint the step boundary the run stopped at (unless saved), sample a finished run, write the summary."""
    if t.saved_step != t.step:
        save(t)
    if t.info.is_main and status == "finished" and t.tc.sample_tokens > 0:
        text = generate_text(t.model, t.ds.tokenizer, t.ds.prompt, t.tc.sample_tokens, SAMPLE_TEMPERATURE,
                             SAMPLE_TOP_K, t.tc.seed)
        write_text(t.run_dir / SAMPLES_FILE, text)
    return report.summary(t, status)  # the caller (CLI) reports summary["checkpoint"] when interrupted


def diverged(t, d: Diverged) -> None:
    """Write summary.json (status "diverged") without saving a checkpoint, then raise TrainingDiverged."""
    t.optimizer.zero_grad(set_to_none=True)
    message = diverged_message(d, find_checkpoint(t.run_dir))
    report.summary(t, "diverged", message=message, diverged_at=d.step)
    raise TrainingDiverged(message)
