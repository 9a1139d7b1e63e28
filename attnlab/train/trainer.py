"""The training loop: :func:`train` a :class:`~attnlab.train.config.RunConfig`, then :func:`load_run` / :func:`sample`.

A run directory holds::

    config.toml      the resolved RunConfig (model.vocab_size from the tokenizer, out_dir = this directory)
    tokenizer.json   a copy of the tokenizer (sampling needs no data cache)
    metrics.jsonl    one JSON object per logged step (see _Trainer._row)
    checkpoint/      model.safetensors + state.pt + meta.json, replaced atomically (see .checkpoint)
    loss.png         train and validation loss against step
    samples.txt      train.sample_tokens tokens sampled from the final model (seeded with train.seed)
    summary.json     status ("finished" | "interrupted" | "diverged"), losses, throughput, MFU, ...
    tensorboard/     TensorBoard event files (only with train.tensorboard = true)
    wandb/, wandb_id.txt   the Weights & Biases run and its id (only with train.wandb_project; attnlab.train.trackers)

Magnitude gates (the magnitude write-up; model.attention with magnitude != "off", e.g. magnitude-causal): every row of a step
that trained also carries, per attention layer i (0 = the first block), the gate's stats from the forward pass of
that step (its last micro-batch; rank 0's under DDP), under flat keys "mag/L<i>/<stat>" (also TensorBoard scalars):

    mag/L<i>/t                 t of Z = exp(-t ||k_j - k_l||^2 / d) used in that forward pass (before the update)
    mag/L<i>/magnitude_over_n  |X| / N of the layer's whole key set (mean over batch and heads), in (0, 1]
    mag/L<i>/residual          largest relative residual ||1 - (Z + eps I) mu|| / ||1|| (CG: truncation error;
                               Cholesky: rounding)
    mag/L<i>/mu_min, mu_max    smallest and largest weight the gate read (mu_j, w_j or M_ij with j <= i)
    mag/L<i>/jitter            largest diagonal jitter a failed Cholesky needed (0 normally)
    mag/L<i>/gate_mean         mean gate value (magnitude_apply="values")
    mag/L<i>/prior_floored     fraction of the weights read that sit at the logit prior's floor ("logits")

Pseudo-rank (the Boneless write-up; train.track_rank, on by default): every row with a validation loss also carries
attnlab.analysis.rank.rank_metrics of the model at that step: "pseudo_rank/<m>/L<i>" (fraction of singular values
holding 95% of the squared-singular-value energy) and "participation_ratio/<m>/L<i>" for m in q, k, v, o, qk
(W_q W_k' per head, averaged), plus ".../<m>/mean" over layers. Matrices a variant does not have (identity Q/K)
are absent. Cost: one small SVD per matrix per evaluation (milliseconds at the cpu preset).

Both reach the trainer as hooks (:mod:`attnlab.train.hooks`: MagnitudeGateHook, RankHook), not as imports. The
gates record only on the steps that are logged (the hook switches MagnitudeGate.record_stats on for those steps
and off otherwise), so the other steps pay no device syncs and no residual product.

Steps are counted from 1: step k is the k-th optimizer update, made with learning rate ``lr_at(k)``; the
metrics row of step k describes the model *after* that update. Step 0 is the untrained model (one validation
row, when train.eval_interval > 0).

Determinism: ``torch.manual_seed(train.seed)`` before the model is built (initialisation, dropout) and a
dedicated ``torch.Generator`` seeded with train.seed draws the training batches; validation uses fixed windows.
On CPU the same config gives bit-identical losses. A checkpoint stores everything the rest of the run depends on
(weights, optimizer and grad-scaler state, batch-generator and RNG states, step, tokens, best val loss), so a
resumed run continues bit-for-bit as if it had never stopped.

Convergence: with train.stop_at (e.g. "val_accuracy >= 0.99", :class:`~attnlab.train.config.StopRule`) the run
stops at the first evaluation that meets the rule, with status "finished"; summary.json gives that step as
threshold_step (the steps-to-threshold) and converged = true. A run that reaches train.max_steps first is finished
with converged = false: its levels are those of a run that had not reached the threshold. The learning-rate
schedule is the one of train.max_steps either way, so a rule never changes the steps before it is met.

Stopping: the first Ctrl-C (SIGINT) or SIGTERM asks the loop to stop at the end of the current step; it then
saves a checkpoint and returns with status "interrupted". A second one raises KeyboardInterrupt at once; a
KeyboardInterrupt that lands in the middle of a step rolls the step back (batch generator and RNG restored,
gradients dropped), so the saved checkpoint is still a consistent step boundary.
"""

from __future__ import annotations

import contextlib
import json
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from ..atomic import write_text
from ..configio import load_config, save_toml
from ..data import Dataset, default_cache_dir, load_tokenizer, prepare
from ..data.task_source import task_name
from ..errors import ConfigError
from ..hf.gpt2 import load_gpt2_weights, read_gpt2_config
from ..lock import DirectoryLock
from ..model import GPT
from ..rundir import (CONFIG_FILE, METRICS_FILE, PLOT_FILE, RUN_MARKERS, SAMPLES_FILE, SUMMARY_FILE, TOKENIZER_FILE,
                      read_metrics)
from . import distributed as D
from .checkpoint import WEIGHTS, find_checkpoint, load_checkpoint, load_weights, save_checkpoint
from .config import RunConfig
from .hooks import TrainHook, default_hooks
from .flops import device_name, flops_per_token, gate_flops_per_token, matmul_params, matmul_peak_gflops, mfu
from .optim import lr_at, make_optimizer, set_lr
from .plots import plot_losses
from .trackers import check_trackers, close_trackers, log_row, open_trackers

__all__ = ["train", "load_run", "load_model", "sample", "generate_text", "TrainingDiverged"]

SAMPLE_TEMPERATURE = 0.8
SAMPLE_TOP_K = 200
_DTYPES = {"float32": None, "bfloat16": torch.bfloat16, "float16": torch.float16}


class TrainingDiverged(RuntimeError):
    """The training loss (or gradient norm) became NaN or infinite. One-line message; summary.json says
    "diverged" and the last good checkpoint is left untouched."""


class _Diverged(Exception):
    def __init__(self, step: int, what: str, value: float, lr: float, why: str = ""):
        super().__init__(step, what, value, lr)
        self.step, self.what, self.value, self.lr, self.why = step, what, value, lr, why


# ============================================================================================ public API


def train(cfg: RunConfig | None = None, *, resume: str | Path | None = None, quiet: bool = False,
          hooks: Sequence[TrainHook] = (), _after_step: Callable[[int], None] | None = None) -> dict:
    """Train ``cfg`` (or continue the run in directory ``resume``) and return the summary dict.

    With ``resume=DIR`` the config is DIR/config.toml and training continues from DIR's latest complete
    checkpoint (from scratch in DIR if it has none). ``cfg`` may then be None; if given, its model must match
    the saved one and its other settings (e.g. a larger train.max_steps) replace the saved ones. Otherwise the
    run directory is ``cfg.resolved_out_dir()``, which must not already hold a run.

    Returns the summary (also written to summary.json). Ctrl-C saves a checkpoint and returns with status
    "interrupted"; a NaN/inf loss raises :class:`TrainingDiverged` after writing summary.json.
    ``quiet=True`` prints nothing. Under ``torchrun`` every rank calls this; only rank 0 writes files.
    ``hooks``: measurements logged besides :func:`attnlab.train.hooks.default_hooks` (:mod:`attnlab.train.hooks`).
    ``_after_step(step)`` is an internal hook called after each completed step (tests raise
    KeyboardInterrupt from it to simulate Ctrl-C).
    """
    trainer = _Trainer(cfg, resume=resume, quiet=quiet, hooks=hooks)
    try:
        return trainer.run(_after_step)
    finally:
        trainer.close()


def load_run(run_dir: str | Path, device: str | torch.device = "cpu") -> tuple[GPT, object, RunConfig]:
    """(model in eval mode with the latest checkpoint's weights, tokenizer, RunConfig) of a run directory.

    Does not touch the global RNG state. ConfigError if ``run_dir`` is not a run or has no checkpoint yet.
    """
    run_dir = Path(run_dir)
    cfg = _load_run_config(run_dir)
    tokenizer_path = run_dir / TOKENIZER_FILE
    if not tokenizer_path.is_file():
        raise ConfigError(f"{run_dir} has no {TOKENIZER_FILE}; it is not a complete run directory")
    tokenizer = load_tokenizer(tokenizer_path)
    folder = find_checkpoint(run_dir)
    if folder is None:
        raise ConfigError(f"{run_dir} has no checkpoint yet (train it, or resume it, first)")
    with torch.random.fork_rng(devices=[]):
        model = GPT(cfg.model)
    load_weights(model, folder / WEIGHTS)
    return model.to(device).eval(), tokenizer, cfg


def load_model(path) -> tuple[GPT, str]:
    """(model in eval mode, what it is) from a run directory (:func:`load_run`) or a Hugging Face GPT-2 directory
    (config.json with model_type "gpt2": attnlab.GPT.from_hf_gpt2)."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{path} not found (expected a run directory or a Hugging Face GPT-2 directory)")
    hf_config = path / "config.json"
    if hf_config.is_file():
        try:
            model_type = json.loads(hf_config.read_text(encoding="utf-8")).get("model_type")
        except (OSError, ValueError, AttributeError):
            raise ConfigError(f"{hf_config} is not a readable JSON config") from None
        if model_type != "gpt2":
            raise ConfigError(f"{hf_config} has model_type={model_type!r}; only Hugging Face 'gpt2' is supported")
        return GPT.from_hf_gpt2(path).eval(), "Hugging Face GPT-2"
    return load_run(path)[0], "attnlab run"


def sample(run_dir: str | Path, prompt: str = "\n", max_new_tokens: int = 500, temperature: float = 0.8,
           top_k: int | None = 200, seed: int = 0) -> str:
    """Text sampled from a run's latest checkpoint after ``prompt``: the ``max_new_tokens`` generated tokens
    decoded by the run's tokenizer (the prompt itself is not repeated). Reproducible for a given ``seed``."""
    model, tokenizer, _ = load_run(run_dir)
    return generate_text(model, tokenizer, prompt, max_new_tokens, temperature, top_k, seed)


@torch.no_grad()
def generate_text(model: GPT, tokenizer, prompt: str, max_new_tokens: int, temperature: float = 0.8,
                  top_k: int | None = 200, seed: int = 0) -> str:
    """Decode ``max_new_tokens`` tokens sampled from ``model`` after ``prompt`` (own seeded generator)."""
    if not isinstance(prompt, str) or not prompt:
        raise ConfigError("the prompt must be a non-empty string (e.g. '\\n')")
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as e:
        raise ConfigError(f"cannot encode the prompt: {e}") from None
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        idx = torch.tensor([ids], dtype=torch.long, device=device)
        out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    finally:
        model.train(was_training)
    return tokenizer.decode(out[0, len(ids):].tolist())


# ============================================================================================ helpers


def _load_run_config(run_dir: Path) -> RunConfig:
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    return load_config(RunConfig, run_dir / CONFIG_FILE)


def _model_for_data(model, ds):
    """``model`` with what the data decides: vocab_size from the tokenizer, and block_size from a task's sequence
    length (text windows take any block_size: ``ds.seq_len`` is None)."""
    return model.replace(vocab_size=ds.vocab_size, **({"block_size": ds.seq_len} if ds.seq_len is not None else {}))


def _model_from_hf(model, init_from: str):
    """The architecture of train.init_from's GPT-2 directory, keeping the run's attention, dropout and block_size
    (at most the checkpoint's n_positions); the data's vocabulary must be the checkpoint's."""
    path = init_from.removeprefix("hf:")
    arch = read_gpt2_config(path, model.attention)
    if model.block_size > arch.block_size:
        raise ConfigError(f"model.block_size={model.block_size} exceeds the n_positions={arch.block_size} of {path}")
    if model.vocab_size != arch.vocab_size:
        raise ConfigError(f"the data's tokenizer has {model.vocab_size} tokens and {path} has {arch.vocab_size}; "
                          f"use its tokenizer: data.tokenizer={path}/tokenizer.json")
    return arch.replace(block_size=model.block_size, dropout=model.dropout)


def _resolve(cfg: RunConfig | None, resume) -> tuple[RunConfig, Path, bool]:
    """(config, run directory, resuming?) from train()'s arguments."""
    if resume is None:
        if not isinstance(cfg, RunConfig):
            raise ConfigError(f"train() needs a RunConfig (or resume=RUN_DIR), got {type(cfg).__name__}")
        return cfg, Path(cfg.resolved_out_dir()), False
    run_dir = Path(resume)
    saved = _load_run_config(run_dir)
    if cfg is not None:
        if not isinstance(cfg, RunConfig):
            raise ConfigError(f"train() needs a RunConfig or None with resume=, got {type(cfg).__name__}")
        decided = {"vocab_size": saved.model.vocab_size}  # what the data decided (see _model_for_data)
        if task_name(saved.data.source) is not None:
            decided["block_size"] = saved.model.block_size
        if cfg.model.replace(**decided) != saved.model:
            raise ConfigError(f"cannot resume {run_dir} with a different [model] than the one it was trained with")
        saved = cfg
    return saved.replace(out_dir=str(run_dir)), run_dir, True


def configure_tf32(device_type: str, dtype: str) -> bool:
    """TF32 for float32 matmuls and convolutions on CUDA (Ampere and later: ~8x the float32 matmul rate at a 10-bit
    mantissa), as nanoGPT does; the magnitude gate switches it off around its solves (attnlab.mechanisms.magnitude.module.
    ieee_float32). Returns whether it was switched on (float32 runs on CUDA only)."""
    on = device_type == "cuda" and dtype == "float32"
    if on:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return on


def _resolve_device(name: str) -> torch.device:
    """train.device -> torch.device ("auto": cuda, else mps, else cpu); ConfigError if unavailable."""
    mps = getattr(torch.backends, "mps", None)
    has_mps = bool(mps and mps.is_available())
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "mps" if has_mps else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device='cuda' but no CUDA device is available; use train.device=cpu or auto")
    if name == "mps" and not has_mps:
        raise ConfigError("train.device='mps' but MPS is not available; use train.device=cpu or auto")
    return torch.device(name)


def _finite_or_none(value):
    return value if isinstance(value, (int, float)) and math.isfinite(value) else None


def _write_json(path: Path, data: dict) -> None:
    """Atomic JSON write (non-finite floats become null)."""
    clean = {k: (_finite_or_none(v) if isinstance(v, float) else v) for k, v in data.items()}
    write_text(path, json.dumps(clean, indent=2) + "\n")


def _rng_state(device: torch.device) -> dict:
    """The torch CPU RNG state and, on CUDA, the device's RNG state."""
    state = {"cpu": torch.get_rng_state(), "cuda": None}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["cpu"])
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(state["cuda"], device)


# ============================================================================================ the trainer


class _Trainer:
    """One launch of training on one run directory (see the module docstring for the life cycle)."""

    def __init__(self, cfg: RunConfig | None, *, resume=None, quiet: bool = False, hooks: Sequence[TrainHook] = ()):
        self.info = D.dist_info()
        cfg, run_dir, resuming = _resolve(cfg, resume)
        self.tc = cfg.train
        self.quiet = quiet or not self.info.is_main
        self.trackers = []
        self.lock = None
        self.signals = {}
        check_trackers(self.tc)  # a missing package fails early, on every rank alike
        device = _resolve_device(self.tc.device)
        self.rows_slice = D.local_slice(self.tc.batch_size, self.info)  # checked before any process group exists
        self.owns_group = D.init_distributed(self.info, device.type)
        try:
            self.device = D.device_for(self.info, device.type)
            configure_tf32(self.device.type, self.tc.dtype)
            self.run_dir = Path(D.broadcast_object(str(run_dir), self.info))  # ranks agree on a timestamped name
            self._lock_run_dir()
            self._check_run_dir(resuming)
            self.ds = self._prepare_data(cfg)
            self.cfg = cfg.replace(model=_model_for_data(cfg.model, self.ds), out_dir=str(self.run_dir))
            if self.tc.init_from is not None and not resuming:
                self.cfg = self.cfg.replace(model=_model_from_hf(self.cfg.model, self.tc.init_from))
            self._check_tokenizer(resuming)
            self._build(hooks)
            if resuming:
                self._restore()
            self._write_run_files(resuming)
            self._wrap_model()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------------------------------ set-up

    def _lock_run_dir(self) -> None:
        """One writer per run directory (rank 0 holds run_dir/.lock); a second process stops with one line."""
        error = None
        if self.info.is_main:
            try:
                self.lock = DirectoryLock(self.run_dir, what="training run").acquire()
            except ConfigError as e:
                error = str(e)
        error = D.broadcast_object(error, self.info)  # every rank stops alike
        if error:
            raise ConfigError(error)

    def _check_run_dir(self, resuming: bool) -> None:
        if not resuming and any((self.run_dir / name).exists() for name in RUN_MARKERS):
            raise ConfigError(
                f"{self.run_dir} already holds a run; resume it (resume={str(self.run_dir)!r}) "
                f"or choose another out_dir"
            )
        D.barrier(self.info)  # every rank has checked before rank 0 writes anything

    def _prepare_data(self, cfg: RunConfig) -> Dataset:
        """prepare() the data; under DDP rank 0 fills the cache first and the others then read it."""
        ds = prepare(cfg.data) if self.info.is_main else None
        D.barrier(self.info)
        return ds if ds is not None else prepare(cfg.data)

    def _check_tokenizer(self, resuming: bool) -> None:
        saved = self.run_dir / TOKENIZER_FILE
        if resuming and saved.is_file() and load_tokenizer(saved).to_json() != self.ds.tokenizer.to_json():
            raise ConfigError(
                f"the data now gives a different tokenizer than {saved}; cannot resume (was [data] changed?)"
            )

    def _build(self, hooks: Sequence[TrainHook]) -> None:
        """Model, optimizer, grad scaler, batch generator, bookkeeping state (seeded as documented)."""
        tc = self.tc
        torch.manual_seed(tc.seed)
        self.model = GPT(self.cfg.model)
        if tc.init_from is not None:  # a resumed run then loads its own checkpoint over these (_restore)
            load_gpt2_weights(self.model, tc.init_from.removeprefix("hf:"))
        self.model = self.model.to(self.device)
        self.model.check_token_range = False  # the data's tokenizer has the model's vocabulary: no per-step sync
        self.hooks = [*default_hooks(self.cfg, self.model), *hooks]
        self.hook_prefixes = tuple(prefix for hook in self.hooks for prefix in hook.prefixes)
        for hook in self.hooks:
            hook.step_ends(self.model)  # measurements are switched on for the steps that are logged (_train_step)
        if self.info.enabled:  # independent dropout streams per rank (the init above is identical on all)
            torch.manual_seed(tc.seed + self.info.rank)
        self.optimizer = make_optimizer(self.model, tc, self.device.type)
        self.amp_dtype = _DTYPES[tc.dtype]
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=tc.dtype == "float16")
        self.gen = torch.Generator().manual_seed(tc.seed)
        self.step = self.tokens = 0
        self.saved_step = None  # the step of the checkpoint on disk
        self.best_val = self.last_val = self.last_acc = self.last_eval_step = None
        self.first_val, self.bad_evals = None, 0  # the divergence guard (_watch_divergence)
        self.stop_rule, self.threshold_step = tc.stop_rule, None  # train.stop_at and the step it was first met
        self.last_stats = {}
        self.elapsed_before = 0.0
        self.launch_start = time.perf_counter()
        self.launch_all = [0, 0.0]  # tokens, seconds of this launch's steps
        self.launch_warm = [0, 0.0]  # the same without the launch's first step (one-off costs)
        self.window_tokens, self.window_time = 0, 0.0
        self.phase = "idle"
        self.stop_requested = self.stop_agreed = False
        self.snapshot = None
        self.bad_step = torch.zeros((), dtype=torch.long, device=self.device)  # first non-finite step (0: none)
        self.tokens_per_step = tc.batch_size * tc.grad_accum * self.cfg.model.block_size
        self.flops_per_token = (flops_per_token(matmul_params(self.model), self.cfg.model)
                                + gate_flops_per_token(self.model, self.cfg.model.block_size))

    def _restore(self) -> None:
        """Load the latest complete checkpoint of the run directory (none: start from scratch in it)."""
        folder = find_checkpoint(self.run_dir)
        if folder is None:
            return
        state = load_checkpoint(folder, self.model, map_location="cpu")
        self.optimizer.load_state_dict(state["optimizer"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.gen.set_state(state["batch_generator"])
        rng = state["rng"]
        _set_rng_state(rng[self.info.rank] if len(rng) == self.info.world_size else rng[0], self.device)
        self.step = self.saved_step = int(state["step"])
        self.tokens = int(state["tokens"])
        self.best_val, self.last_val = state.get("best_val_loss"), state.get("last_val_loss")
        self.last_acc = state.get("last_val_accuracy")
        self.last_eval_step = state.get("last_eval_step")
        self.first_val = state.get("first_val_loss")
        self.threshold_step = state.get("threshold_step")
        self.last_stats = state.get("last_stats") or {}
        self.elapsed_before = float(state.get("elapsed_s", 0.0))

    def _write_run_files(self, resuming: bool) -> None:
        """config.toml, tokenizer.json, metrics.jsonl (cut back to the checkpoint's step when resuming)."""
        if self.info.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            save_toml(self.cfg, self.run_dir / CONFIG_FILE)
            write_text(self.run_dir / TOKENIZER_FILE, self.ds.tokenizer.to_json())
            rows = {}
            for row in read_metrics(self.run_dir / METRICS_FILE) if resuming else []:
                if row["step"] <= self.step:
                    rows.setdefault(row["step"], row)
            self.logged_steps = set(rows)
            write_text(self.run_dir / METRICS_FILE, "".join(json.dumps(r) + "\n" for r in rows.values()))
            self.trackers = open_trackers(self.cfg, self.run_dir, self.step + 1)
        D.barrier(self.info)

    def _wrap_model(self) -> None:
        """self.model (plain GPT, for saving and sampling) -> self.fwd (compiled?) -> self.ddp (DDP-wrapped?)."""
        self.model.train()
        self.fwd = torch.compile(self.model) if self.tc.compile else self.model
        self.ddp = self.fwd
        if self.info.enabled:
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.ddp = nn.parallel.DistributedDataParallel(self.fwd, device_ids=ids)

    def close(self) -> None:
        close_trackers(self.trackers)
        self.trackers = []
        D.shutdown_distributed(self.owns_group)
        if self.lock is not None:
            self.lock.release()
            self.lock = None

    # ------------------------------------------------------------------------------------------ schedule

    def _eval_due(self, k: int) -> bool:
        ei = self.tc.eval_interval
        return k == self.tc.max_steps or (ei > 0 and k % ei == 0)

    def _row_due(self, k: int) -> bool:
        return k % self.tc.log_interval == 0 or self._eval_due(k)

    def _checkpoint_due(self, k: int) -> bool:
        ci = self.tc.checkpoint_interval
        return k > 0 and (k == self.tc.max_steps or (ci > 0 and k % ci == 0))

    # ------------------------------------------------------------------------------------------ one step

    def _autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                              enabled=self.amp_dtype is not None)

    def _next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """This rank's slice of the next global micro-batch (every rank draws the same global batch)."""
        x, y = self.ds.get_batch("train", self.tc.batch_size, self.cfg.model.block_size, self.gen)
        x, y = x[self.rows_slice], y[self.rows_slice]
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True), y.pin_memory().to(self.device, non_blocking=True)
        return x.to(self.device), y.to(self.device)

    def _take_snapshot(self) -> None:
        """What a step changes before its update: restored if the step is interrupted."""
        self.snapshot = (self.gen.get_state(), _rng_state(self.device))

    def _rollback(self) -> None:
        self.gen.set_state(self.snapshot[0])
        _set_rng_state(self.snapshot[1], self.device)
        self.optimizer.zero_grad(set_to_none=True)

    def _forward_backward(self) -> torch.Tensor:
        """grad_accum micro-batches, each loss scaled by 1/grad_accum; returns their mean loss (detached)."""
        ga = self.tc.grad_accum
        total = torch.zeros((), device=self.device)
        for micro in range(ga):
            x, y = self._next_batch()
            no_sync = self.info.enabled and micro < ga - 1
            with self.ddp.no_sync() if no_sync else contextlib.nullcontext():
                with self._autocast():
                    _, loss = self.ddp(x, y)
                self.scaler.scale(loss / ga).backward()
            total += loss.detach().float()
        return total / ga

    def _grad_norm(self) -> torch.Tensor:
        """Global gradient norm before clipping (a 0-d tensor, not read); clips to train.grad_clip when > 0."""
        self.scaler.unscale_(self.optimizer)
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        if self.tc.grad_clip > 0:
            return nn.utils.clip_grad_norm_(params, self.tc.grad_clip)
        return nn.utils.get_total_norm([p.grad for p in params])

    @property
    def _skips_on_device(self) -> bool:
        """Whether a non-finite step is skipped by the fused AdamW kernel itself (its found_inf flag), so that the
        loss and the gradient norm are read on the host only at logging, evaluation and checkpoint steps. Not under
        fp16's GradScaler (which sets found_inf itself) nor DDP (whose stop vote is read every step anyway)."""
        return bool(self.optimizer.defaults.get("fused")) and not self.scaler.is_enabled() and not self.info.enabled

    def _check_finite(self) -> None:
        """Raise _Diverged for the first step whose loss or gradient norm was not finite (its update was skipped)."""
        step = int(self.bad_step)  # the one host read of these checks
        if step:
            raise _Diverged(step, "training loss or gradient norm", float("nan"), lr_at(step, self.tc),
                            " (not finite; that step's update and any later non-finite one were skipped)")

    def _train_step(self) -> dict:
        """Take step self.step + 1; raises _Diverged (before updating anything) on a non-finite loss."""
        k = self.step + 1
        lr = lr_at(k, self.tc)
        set_lr(self.optimizer, lr)
        start = time.perf_counter()
        self._take_snapshot()
        self.phase = "step"
        record = self._row_due(k)
        for hook in self.hooks:
            hook.step_begins(self.model, record)
        try:
            loss = self._forward_backward()
        finally:
            for hook in self.hooks:
                hook.step_ends(self.model)
        read = record or self._eval_due(k) or self._checkpoint_due(k) or k >= self.tc.max_steps
        if self._skips_on_device:  # no host read of the loss or the norm unless this step is logged or saved
            self.stop_agreed = self.stop_requested
            grad_norm = self._grad_norm()
            bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
            self.bad_step = torch.where(bad & (self.bad_step == 0), k, self.bad_step)
            if read or self.stop_agreed:  # before this step's update, as on the host-checked path
                self._check_finite()
            self.phase = "update"
            self.optimizer.found_inf = bad.to(torch.float32)  # the fused kernel leaves params and state alone
            self.optimizer.step()
            loss_value, grad_norm = (float(loss), float(grad_norm)) if read else (None, None)
        else:
            reduced = D.all_reduce(torch.stack([loss, torch.tensor(float(self.stop_requested), device=self.device)]),
                                   self.info)
            loss_value = float(reduced[0]) / self.info.world_size
            self.stop_agreed = bool(reduced[1] > 0)
            if not math.isfinite(loss_value):
                raise _Diverged(k, "training loss", loss_value, lr)
            grad_norm = float(self._grad_norm())
            if not self.scaler.is_enabled() and not math.isfinite(grad_norm):
                raise _Diverged(k, "gradient norm", grad_norm, lr)
            self.phase = "update"
            self.scaler.step(self.optimizer)
            self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.step, self.tokens = k, self.tokens + self.tokens_per_step
        self.phase = "bookkeeping"
        elapsed = time.perf_counter() - start
        if self.launch_all[1] > 0:  # the first step of a launch pays one-off costs (allocations, compilation)
            self.launch_warm[0] += self.tokens_per_step
            self.launch_warm[1] += elapsed
        self.launch_all[0] += self.tokens_per_step
        self.launch_all[1] += elapsed
        self.window_tokens += self.tokens_per_step
        self.window_time += elapsed
        stats = {"train_loss": loss_value, "lr": lr, "grad_norm": grad_norm, "step_time_s": elapsed}
        return {**stats, **{key: v for hook in self.hooks for key, v in hook.step_stats(self.model).items()}} \
            if record else stats

    # ------------------------------------------------------------------------------------------ evaluation

    @torch.no_grad()
    def evaluate(self) -> tuple[float, float]:
        """(mean validation loss, accuracy) over the targets of train.eval_tokens tokens (fixed windows; batches
        shared out over ranks). Targets of -1 (a task's non-answer positions) count in neither; accuracy is exact
        match of the argmax (next-token accuracy on text, answer accuracy on a task)."""
        self.fwd.eval()
        total, count, correct = 0.0, 0, 0
        batches = self.ds.val_batches(self.tc.eval_tokens, self.tc.batch_size, self.cfg.model.block_size)
        for i, (x, y) in enumerate(batches):
            if i % self.info.world_size != self.info.rank:
                continue
            x, y = x.to(self.device), y.to(self.device)
            with self._autocast():
                logits, loss = self.fwd(x, y)
            answer = y >= 0
            n = int(answer.sum())
            total += float(loss) * n  # the loss is the mean over this batch's targets: weight batches by them
            count += n
            correct += int((logits.argmax(-1) == y)[answer].sum())
        self.fwd.train()
        if self.info.enabled:
            sums = D.all_reduce(torch.tensor([total, count, correct], dtype=torch.float64, device=self.device),
                                self.info)
            total, count, correct = float(sums[0]), float(sums[1]), float(sums[2])
        return total / count, correct / count

    # ------------------------------------------------------------------------------------------ bookkeeping

    def _bookkeeping(self, k: int, stats: dict) -> None:
        """After step k: validation, the metrics row, TensorBoard, checkpoint — whichever are due."""
        self.phase = "bookkeeping"
        self.last_stats = stats
        val = None
        if self._eval_due(k):
            val, self.last_acc = self.evaluate()
            self.last_val, self.last_eval_step = val, k
            if math.isfinite(val) and (self.best_val is None or val < self.best_val):
                self.best_val = val
            self._watch_divergence(val)
            if self.stop_rule and self.threshold_step is None and self.stop_rule.met(
                    {"val_loss": val, "val_accuracy": self.last_acc}):
                self.threshold_step = k
        if self._row_due(k) or val is not None:
            self._log_row(k, stats, val)
        if self._checkpoint_due(k) and self.saved_step != k and not self.bad_evals:  # no checkpoint of a bad state
            self._save()
        if self.tc.divergence_patience and self.bad_evals >= self.tc.divergence_patience:
            raise _Diverged(k, "validation loss", val, lr_at(k, self.tc),
                            f", above {self.tc.divergence_factor:g} x its first value {self.first_val:.4f} for "
                            f"{self.bad_evals} evaluations in a row")
        self.phase = "idle"

    def _watch_divergence(self, val: float) -> None:
        """Count the evaluations in a row whose loss exceeds divergence_factor x the run's first one (NaN too)."""
        if self.first_val is None:
            self.first_val = val
        elif not val <= self.tc.divergence_factor * self.first_val:
            self.bad_evals += 1
        else:
            self.bad_evals = 0

    def _row(self, k: int, stats: dict, val: float | None) -> dict:
        """A metrics.jsonl row: step, tokens seen, train loss of step k (mean over its micro-batches and ranks),
        val loss (null unless evaluated), lr used by step k, gradient norm before clipping, throughput; with
        hooks also the keys they measured in the step (e.g. "mag/L<i>/<stat>", see the module docstring)."""
        tps = self.window_tokens / self.window_time if self.window_time > 0 else stats.get("tokens_per_s")
        measured = {key: _finite_or_none(value) for key, value in stats.items() if key.startswith(self.hook_prefixes)}
        return {
            "step": k,
            "tokens": self.tokens,
            "train_loss": stats.get("train_loss"),
            "val_loss": val,
            "val_accuracy": self.last_acc if val is not None else None,
            "lr": stats.get("lr", lr_at(k, self.tc)),
            "grad_norm": _finite_or_none(stats.get("grad_norm")),
            "tokens_per_s": tps,
            "step_time_s": stats.get("step_time_s"),
            **measured,
        }

    def _log_row(self, k: int, stats: dict, val: float | None) -> None:
        row = self._row(k, stats, val)
        self.last_stats = {**stats, "tokens_per_s": row["tokens_per_s"]}
        self.window_tokens, self.window_time = 0, 0.0
        if not self.info.is_main:
            return
        if val is not None:  # e.g. the Boneless write-up: how the weights' pseudo-rank evolves (RankHook)
            for hook in self.hooks:
                row.update(hook.eval_stats(self.model))
        with open(self.run_dir / METRICS_FILE, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")
        self.logged_steps.add(k)
        log_row(self.trackers, row, self.hook_prefixes)
        if val is not None:
            self._print(f"step {k}: val loss {val:.4f}" + (
                f", train loss {row['train_loss']:.4f}" if row["train_loss"] is not None else ""))

    def _save(self) -> None:
        """Checkpoint the current step boundary (collective under DDP: gathers every rank's RNG state)."""
        rng = D.gather_objects(_rng_state(self.device), self.info)
        if self.info.is_main:
            state = {
                "format": 1,
                "step": self.step,
                "tokens": self.tokens,
                "optimizer": self.optimizer.state_dict(),
                "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else None,
                "batch_generator": self.gen.get_state(),
                "rng": rng,
                "world_size": self.info.world_size,
                "best_val_loss": self.best_val,
                "last_val_loss": self.last_val,
                "last_val_accuracy": self.last_acc,
                "last_eval_step": self.last_eval_step,
                "first_val_loss": self.first_val,
                "threshold_step": self.threshold_step,
                "last_stats": self.last_stats,
                "elapsed_s": self._elapsed(),
            }
            save_checkpoint(self.run_dir, self.model, state, {"tokens": self.tokens})
        self.saved_step = self.step
        D.barrier(self.info)

    # ------------------------------------------------------------------------------------------ the loop

    def run(self, after_step: Callable[[int], None] | None = None) -> dict:
        """Train to train.max_steps (or until stopped); returns the summary."""
        self._install_signals()
        bar = self._progress_bar()
        status = "finished"
        try:
            self._catch_up()
            while self._training_left() and not self._should_stop():
                stats = self._train_step()
                self._bookkeeping(self.step, stats)
                bar.update(1)
                if stats["train_loss"] is not None:  # read on the host at logged steps only (_skips_on_device)
                    tok_s = self.tokens_per_step / max(stats["step_time_s"], 1e-9)
                    bar.set_postfix(loss=f"{stats['train_loss']:.4f}", tok_s=f"{tok_s:.0f}", refresh=False)
                if after_step is not None:
                    after_step(self.step)
            if self._training_left():
                status = "interrupted"
        except KeyboardInterrupt:
            status = "interrupted"
            if self.phase == "step":
                self._rollback()
        except _Diverged as d:
            bar.close()
            self._diverged(d)
        finally:
            self._restore_signals()
            bar.close()
        return self._finish(status)

    def _training_left(self) -> bool:
        """Below the step cap and the stop rule (train.stop_at) not met yet."""
        return self.step < self.tc.max_steps and self.threshold_step is None

    def _catch_up(self) -> None:
        """Step 0 validation on a fresh run; after a resume, redo a row the interruption left unwritten."""
        k = self.step
        due = (k == 0 and self.tc.eval_interval > 0) or (k > 0 and self._row_due(k))
        if due and self.info.is_main:
            due = k not in self.logged_steps
        if D.broadcast_object(due, self.info):
            self._bookkeeping(k, self.last_stats if k else {})

    def _should_stop(self) -> bool:
        return self.stop_agreed if self.info.enabled else self.stop_requested

    def _finish(self, status: str) -> dict:
        """Save (unless already saved at this step), samples, plot and summary; returns the summary."""
        if self.phase != "update" and self.saved_step != self.step:
            self._save()
        if self.info.is_main and status == "finished" and self.tc.sample_tokens > 0:
            text = generate_text(self.model, self.ds.tokenizer, self.ds.prompt, self.tc.sample_tokens,
                                 SAMPLE_TEMPERATURE, SAMPLE_TOP_K, self.tc.seed)
            write_text(self.run_dir / SAMPLES_FILE, text)
        return self._summary(status)  # the caller (CLI) reports summary["checkpoint"] when interrupted

    def _diverged(self, d: _Diverged) -> None:
        """Write summary.json (status "diverged") without saving a checkpoint, then raise TrainingDiverged."""
        self._rollback()
        ckpt = find_checkpoint(self.run_dir)
        message = (
            f"training diverged at step {d.step}: the {d.what} is {d.value:.6g}{d.why} (lr {d.lr:.3g}); "
            f"the last good checkpoint ({ckpt or 'none saved yet'}) is untouched; "
            f"try a lower train.lr, more train.warmup_steps or train.grad_clip > 0"
        )
        self._summary("diverged", message=message, diverged_at=d.step)
        raise TrainingDiverged(message)

    # ------------------------------------------------------------------------------------------ outputs

    def _elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.launch_start

    def _summary(self, status: str, **extra) -> dict:
        """The summary dict, written (with loss.png) to the run directory by rank 0.

        status "finished" | "interrupted" | "diverged"; steps (completed optimizer steps); stop_at (train.stop_at,
        normalised), threshold_step (the first evaluated step that met it: the steps-to-threshold; None if not met)
        and converged (whether it was met; None without a stop_at; a finished run with converged false hit the cap
        train.max_steps below the threshold); final_val_loss (the
        latest validation, at step final_val_step) and best_val_loss; final_train_loss (of the last step);
        tokens_seen; wall_time_s (from model construction to now, summed over resumed launches); n_params (all,
        tied counted once) and n_params_non_embedding; flops_per_token (flops.flops_per_token plus the
        magnitude gates' flops.gate_flops_per_token);
        tokens_per_s (this launch's training steps without its first one; global under DDP); mfu =
        tokens_per_s * flops_per_token / (matmul_peak_gflops * 1e9 * world_size); variant, preset, seed, device,
        device_name, dtype, world_size, run_dir (= out_dir), checkpoint (the latest complete checkpoint folder); plus
        message and diverged_at for a diverged run.
        """
        tokens, seconds = self.launch_warm if self.launch_warm[1] > 0 else self.launch_all
        tps = tokens / seconds if seconds > 0 else None
        peak = None
        if self.info.is_main and tps:
            peak = matmul_peak_gflops(self.device, self.cfg.data.cache_dir or default_cache_dir(),
                                      _DTYPES[self.tc.dtype] or torch.float32)
        ckpt = find_checkpoint(self.run_dir) if self.info.is_main else None
        summary = {
            "status": status,
            "steps": self.step,
            "max_steps": self.tc.max_steps,
            "final_val_loss": self.last_val,
            "final_val_accuracy": self.last_acc,
            "final_val_step": self.last_eval_step,
            "best_val_loss": self.best_val,
            "stop_at": None if self.stop_rule is None else str(self.stop_rule),
            "threshold_step": self.threshold_step,
            "converged": None if self.stop_rule is None else self.threshold_step is not None,
            "final_train_loss": self.last_stats.get("train_loss"),
            "tokens_seen": self.tokens,
            "wall_time_s": self._elapsed(),
            "n_params": sum(p.numel() for p in self.model.parameters()),
            "n_params_non_embedding": self.model.num_params(),
            "flops_per_token": self.flops_per_token,
            "tokens_per_s": tps,
            "mfu": mfu(tps or 0.0, self.flops_per_token, peak or 0.0, self.info.world_size) if peak else None,
            "matmul_peak_gflops": peak,
            "variant": self.cfg.variant_name,
            "preset": self.cfg.preset,
            "seed": self.tc.seed,
            "device": str(self.device.type),
            "device_name": device_name(self.device),
            "dtype": self.tc.dtype,
            "world_size": self.info.world_size,
            "run_dir": str(self.run_dir),
            "out_dir": str(self.run_dir),  # the same; the name of the config field
            "checkpoint": str(ckpt) if ckpt else None,
            **extra,
        }
        if self.info.is_main:
            _write_json(self.run_dir / SUMMARY_FILE, summary)
            plot_losses(self.run_dir / METRICS_FILE, self.run_dir / PLOT_FILE,
                        title=f"{self.cfg.variant_name} ({self.run_dir.name})")
        return summary

    def _print(self, text: str) -> None:
        if not self.quiet:
            from tqdm import tqdm

            tqdm.write(text, file=sys.stderr)

    def _progress_bar(self):
        from tqdm import tqdm

        if not self.quiet:
            n = sum(p.numel() for p in self.model.parameters())
            self._print(f"training {self.cfg.variant_name} ({n / 1e6:.2f}M parameters) on "
                        f"{device_name(self.device)} x{self.info.world_size} -> {self.run_dir}")
        return tqdm(total=self.tc.max_steps, initial=self.step, unit="step", disable=self.quiet,
                    dynamic_ncols=True, file=sys.stderr)

    # ------------------------------------------------------------------------------------------ signals

    def _install_signals(self) -> None:
        """SIGINT / SIGTERM: first one -> stop after this step; second one -> KeyboardInterrupt now."""
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self.signals[sig] = signal.signal(sig, self._on_signal)

    def _restore_signals(self) -> None:
        for sig, handler in self.signals.items():
            signal.signal(sig, handler)
        self.signals = {}

    def _on_signal(self, signum, frame) -> None:
        if self.stop_requested and self.phase != "update":
            raise KeyboardInterrupt
        if not self.stop_requested:
            self._print("stopping after this step and saving a checkpoint (press Ctrl-C again to stop at once)")
        self.stop_requested = True
