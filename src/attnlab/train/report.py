"""What a run reports: the metrics rows, the throughput, summary.json (with loss.png) and the console lines."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch

from ..atomic import write_text
from ..data import default_cache_dir
from ..rundir import METRICS_FILE, PLOT_FILE, SUMMARY_FILE
from .checkpoint import find_checkpoint
from .flops import device_name, matmul_peak, mfu
from .optim import lr_at
from .plots import plot_losses
from .trackers import log_row

__all__ = ["Throughput", "log_step", "summary", "say", "progress_bar", "finite_or_none", "DTYPES"]

DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}  # train.dtype -> autocast dtype


def finite_or_none(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def write_json(path: Path, data: dict) -> None:
    """Atomic JSON write (non-finite floats become null)."""
    clean = {k: (finite_or_none(v) if isinstance(v, float) else v) for k, v in data.items()}
    write_text(path, json.dumps(clean, indent=2) + "\n")


class Throughput:
    """Tokens and seconds of this launch's steps: all of them, all but the launch's first one (which pays one-off
    costs: allocations, compilation), and those since the last metrics row."""

    def __init__(self):
        self.all = [0, 0.0]
        self.warm = [0, 0.0]
        self.window = [0, 0.0]

    def add(self, tokens: int, seconds: float) -> None:
        if self.all[1] > 0:  # not the launch's first step
            self.warm[0] += tokens
            self.warm[1] += seconds
        for total in (self.all, self.window):
            total[0] += tokens
            total[1] += seconds

    def window_rate(self, fallback):
        """Tokens per second since the last row (``fallback`` if no step since), and start a new window."""
        tokens, seconds = self.window
        self.window = [0, 0.0]
        return tokens / seconds if seconds > 0 else fallback

    def launch_rate(self) -> float | None:
        """Tokens per second of this launch, without its first step when there were others."""
        tokens, seconds = self.warm if self.warm[1] > 0 else self.all
        return tokens / seconds if seconds > 0 else None


def say(t, text: str) -> None:
    """One line on stderr (above the progress bar), unless quiet (ranks other than 0 are quiet)."""
    if not t.quiet:
        from tqdm import tqdm

        tqdm.write(text, file=sys.stderr)


def progress_bar(t):
    from tqdm import tqdm

    if not t.quiet:
        n = sum(p.numel() for p in t.model.parameters())
        say(t, f"training {t.cfg.variant_name} ({n / 1e6:.2f}M parameters) on "
               f"{device_name(t.device)} x{t.info.world_size} -> {t.run_dir}")
    return tqdm(total=t.tc.max_steps, initial=t.step, unit="step", disable=t.quiet, dynamic_ncols=True,
                file=sys.stderr)


def row(t, k: int, stats: dict, val: float | None, tokens_per_s) -> dict:
    """A metrics.jsonl row: step, tokens seen, train loss of step k (mean over its micro-batches and ranks),
    val loss (null unless evaluated), lr used by step k, gradient norm before clipping, throughput; with
    hooks also the keys they measured in the step (e.g. "mag/L<i>/<stat>", see attnlab.train.trainer)."""
    measured = {key: finite_or_none(value) for key, value in stats.items() if key.startswith(t.hook_prefixes)}
    return {
        "step": k,
        "tokens": t.tokens,
        "train_loss": stats.get("train_loss"),
        "val_loss": val,
        "val_accuracy": t.last_acc if val is not None else None,
        "lr": stats.get("lr", lr_at(k, t.tc)),
        "grad_norm": finite_or_none(stats.get("grad_norm")),
        "tokens_per_s": tokens_per_s,
        "step_time_s": stats.get("step_time_s"),
        **measured,
    }


def log_step(t, k: int, stats: dict, val: float | None) -> None:
    """Append step k's row to metrics.jsonl (rank 0; with the hooks' evaluation keys) and send it to the trackers."""
    r = row(t, k, stats, val, t.throughput.window_rate(stats.get("tokens_per_s")))
    t.last_stats = {**stats, "tokens_per_s": r["tokens_per_s"]}
    if not t.info.is_main:
        return
    if val is not None:  # e.g. the Boneless write-up: how the weights' pseudo-rank evolves (RankHook)
        for hook in t.hooks:
            r.update(hook.eval_stats(t.model))
    with open(t.run_dir / METRICS_FILE, "a", encoding="utf-8") as f:
        f.write(json.dumps(r) + "\n")
    t.logged_steps.add(k)
    log_row(t.trackers, r, t.hook_prefixes)
    if val is not None:
        say(t, f"step {k}: val loss {val:.4f}" + (
            f", train loss {r['train_loss']:.4f}" if r["train_loss"] is not None else ""))


def summary(t, status: str, **extra) -> dict:
    """The summary dict, written (with loss.png) to the run directory by rank 0.

    status "finished" | "interrupted" | "diverged"; steps (completed optimizer steps); stop_at (train.stop_at,
    normalised), threshold_step (the first evaluated step that met it: the steps-to-threshold; None if not met)
    and converged (whether it was met; None without a stop_at; a finished run with converged false hit the cap
    train.max_steps below the threshold); final_val_loss (the latest validation, at step final_val_step) and
    best_val_loss; final_train_loss (of the last step); tokens_seen; wall_time_s (from model construction to now,
    summed over resumed launches); n_params (all, tied counted once) and n_params_non_embedding; flops_per_token
    (flops.flops_per_token plus the magnitude gates' flops.gate_flops_per_token); tokens_per_s (this launch's
    training steps without its first one; global under DDP); mfu = tokens_per_s * flops_per_token /
    (matmul_peak_gflops * 1e9 * world_size), the peak the best of every measurement on this machine
    (matmul_peak_source says how many; :func:`.flops.matmul_peak`); variant, preset, seed, device, device_name, dtype, world_size, run_dir
    (= out_dir), checkpoint (the latest complete checkpoint folder); plus message and diverged_at for a diverged run.
    """
    tps = t.throughput.launch_rate()
    peak = None
    if t.info.is_main and tps:
        peak = matmul_peak(t.device, t.cfg.data.cache_dir or default_cache_dir(), DTYPES[t.tc.dtype] or torch.float32)
    ckpt = find_checkpoint(t.run_dir) if t.info.is_main else None
    result = {
        "status": status,
        "steps": t.step,
        "max_steps": t.tc.max_steps,
        "final_val_loss": t.last_val,
        "final_val_accuracy": t.last_acc,
        "final_val_step": t.last_eval_step,
        "best_val_loss": t.best_val,
        "stop_at": None if t.stop_rule is None else str(t.stop_rule),
        "threshold_step": t.threshold_step,
        "converged": None if t.stop_rule is None else t.threshold_step is not None,
        "final_train_loss": t.last_stats.get("train_loss"),
        "tokens_seen": t.tokens,
        "wall_time_s": t.elapsed(),
        "n_params": sum(p.numel() for p in t.model.parameters()),
        "n_params_non_embedding": t.model.num_params(),
        "flops_per_token": t.flops_per_token,
        "tokens_per_s": tps,
        "mfu": mfu(tps or 0.0, t.flops_per_token, peak["gflops"], t.info.world_size) if peak else None,
        "matmul_peak_gflops": peak["gflops"] if peak else None,
        "matmul_peak_source": (f"best of {peak['measurements']} measurements on this machine since {peak['since']}"
                               if peak else None),
        "variant": t.cfg.variant_name,
        "preset": t.cfg.preset,
        "seed": t.tc.seed,
        "device": str(t.device.type),
        "device_name": device_name(t.device),
        "dtype": t.tc.dtype,
        "world_size": t.info.world_size,
        "run_dir": str(t.run_dir),
        "out_dir": str(t.run_dir),  # the same; the name of the config field
        "checkpoint": str(ckpt) if ckpt else None,
        **extra,
    }
    if t.info.is_main:
        write_json(t.run_dir / SUMMARY_FILE, result)
        plot_losses(t.run_dir / METRICS_FILE, t.run_dir / PLOT_FILE, title=f"{t.cfg.variant_name} ({t.run_dir.name})")
    return result
