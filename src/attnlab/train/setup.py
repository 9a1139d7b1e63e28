"""Everything a launch of training holds, built before the first step: :class:`Trainer`.

The set-up, in order: the config (a new run, or the one saved in a run directory to resume), the process group
under torchrun, the device (with TF32 for float32 on CUDA), the run directory's lock, the data, the model (seeded
with train.seed; train.init_from loads GPT-2 weights), the hooks, the optimizer, the grad scaler and the batch
generator, then the latest checkpoint when resuming (attnlab.train.resume), the run files, and the compiled / DDP
wrappers of the model. The loop (attnlab.train.loop) then reads and moves the state kept here.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from ..atomic import write_text
from ..configio import load_config, save_toml
from ..data import Dataset, load_tokenizer, prepare
from ..data.task_source import task_name
from ..errors import ConfigError
from ..hf.gpt2 import load_gpt2_weights, read_gpt2_config
from ..lock import DirectoryLock
from ..model import GPT
from ..rundir import CONFIG_FILE, METRICS_FILE, RUN_MARKERS, TOKENIZER_FILE, read_metrics
from . import distributed as D
from .config import RunConfig
from .flops import flops_per_token, gate_flops_per_token, matmul_params
from .guards import DivergenceGuard, NonFiniteGuard
from .hooks import TrainHook, default_hooks
from .optim import make_optimizer, skips_on_device
from .report import DTYPES, Throughput
from .resume import restore
from .trackers import check_trackers, close_trackers, open_trackers

__all__ = ["Trainer", "configure_tf32", "load_run_config"]


def load_run_config(run_dir: Path) -> RunConfig:
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"{run_dir} is not a run directory (no {CONFIG_FILE})")
    return load_config(RunConfig, run_dir / CONFIG_FILE)


def configure_tf32(device_type: str, dtype: str) -> bool:
    """TF32 for float32 matmuls and convolutions on CUDA (Ampere and later: ~8x the float32 matmul rate at a 10-bit
    mantissa), as nanoGPT does; the magnitude gate switches it off around its solves (attnlab.mechanisms.magnitude.module.
    ieee_float32). Returns whether it was switched on (float32 runs on CUDA only)."""
    on = device_type == "cuda" and dtype == "float32"
    if on:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return on


def resolve_run(cfg: RunConfig | None, resume) -> tuple[RunConfig, Path, bool]:
    """(config, run directory, resuming?) from train()'s arguments."""
    if resume is None:
        if not isinstance(cfg, RunConfig):
            raise ConfigError(f"train() needs a RunConfig (or resume=RUN_DIR), got {type(cfg).__name__}")
        return cfg, Path(cfg.resolved_out_dir()), False
    run_dir = Path(resume)
    saved = load_run_config(run_dir)
    if cfg is not None:
        if not isinstance(cfg, RunConfig):
            raise ConfigError(f"train() needs a RunConfig or None with resume=, got {type(cfg).__name__}")
        decided = {"vocab_size": saved.model.vocab_size}  # what the data decided (see model_for_data)
        if task_name(saved.data.source) is not None:
            decided["block_size"] = saved.model.block_size
        if cfg.model.replace(**decided) != saved.model:
            raise ConfigError(f"cannot resume {run_dir} with a different [model] than the one it was trained with")
        saved = cfg
    return saved.replace(out_dir=str(run_dir)), run_dir, True


def model_for_data(model, ds):
    """``model`` with what the data decides: vocab_size from the tokenizer, and block_size from a task's sequence
    length (text windows take any block_size: ``ds.seq_len`` is None)."""
    return model.replace(vocab_size=ds.vocab_size, **({"block_size": ds.seq_len} if ds.seq_len is not None else {}))


def model_from_hf(model, init_from: str):
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


def resolve_device(name: str) -> torch.device:
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


class Trainer:
    """One launch of training on one run directory: its set-up (the module docstring), its state, its evaluation."""

    def __init__(self, cfg: RunConfig | None, *, resume=None, quiet: bool = False, hooks: Sequence[TrainHook] = ()):
        self.info = D.dist_info()
        cfg, run_dir, resuming = resolve_run(cfg, resume)
        self.tc = cfg.train
        self.quiet = quiet or not self.info.is_main
        self.trackers = []
        self.lock = None
        check_trackers(self.tc)  # a missing package fails early, on every rank alike
        device = resolve_device(self.tc.device)
        if device.type == "cpu" and self.tc.dtype == "float16":  # it would run, silently and many times slower
            raise ConfigError("train.dtype='float16' on the CPU: its float16 matmuls are slow and need a loss scaler; "
                              "use train.dtype=bfloat16 (CPU autocast) or float32")
        self.rows_slice = D.local_slice(self.tc.batch_size, self.info)  # checked before any process group exists
        self.owns_group = D.init_distributed(self.info, device.type)
        try:
            self.device = D.device_for(self.info, device.type)
            configure_tf32(self.device.type, self.tc.dtype)
            self.run_dir = Path(D.broadcast_object(str(run_dir), self.info))  # ranks agree on a timestamped name
            self._lock_run_dir()
            if not resuming and any((self.run_dir / name).exists() for name in RUN_MARKERS):
                raise ConfigError(f"{self.run_dir} already holds a run; resume it (resume={str(self.run_dir)!r}) "
                                  f"or choose another out_dir")
            D.barrier(self.info)  # every rank has checked before rank 0 writes anything
            self.ds = self._prepare_data(cfg)
            self.cfg = cfg.replace(model=model_for_data(cfg.model, self.ds), out_dir=str(self.run_dir))
            if self.tc.init_from is not None and not resuming:
                self.cfg = self.cfg.replace(model=model_from_hf(self.cfg.model, self.tc.init_from))
            self._check_tokenizer(resuming)
            self._build(hooks)
            if resuming:
                restore(self)
            self._write_run_files(resuming)
            self._wrap_model()
        except BaseException:
            self.close()
            raise

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
        """Model, optimizer, grad scaler, batch generator, guards and the loop's record (seeded as documented)."""
        tc = self.tc
        torch.manual_seed(tc.seed)
        self.model = GPT(self.cfg.model)
        if tc.init_from is not None:  # a resumed run then loads its own checkpoint over these (resume.restore)
            load_gpt2_weights(self.model, tc.init_from.removeprefix("hf:"))
        self.model = self.model.to(self.device)
        self.model.check_token_range = False  # the data's tokenizer has the model's vocabulary: no per-step sync
        self.hooks = [*default_hooks(self.cfg, self.model), *hooks]
        self.hook_prefixes = tuple(prefix for hook in self.hooks for prefix in hook.prefixes)
        for hook in self.hooks:
            hook.step_ends(self.model)  # measurements are switched on for the steps that are logged (loop.measuring)
        if self.info.enabled:  # independent dropout streams per rank (the init above is identical on all)
            torch.manual_seed(tc.seed + self.info.rank)
        self.optimizer = make_optimizer(self.model, tc, self.device.type)
        self.amp_dtype = DTYPES[tc.dtype]
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=tc.dtype == "float16")
        self.gen = torch.Generator().manual_seed(tc.seed)
        # a bad step is skipped on the device by the fused AdamW, unless fp16's GradScaler sets that flag itself
        # or DDP reads every step anyway (its stop vote)
        on_device = skips_on_device(self.optimizer) and not self.scaler.is_enabled() and not self.info.enabled
        self.guard = NonFiniteGuard(on_device, self.device, tc)
        self.divergence = DivergenceGuard(tc)
        self.stop_rule, self.threshold_step = tc.stop_rule, None  # train.stop_at and the step it was first met
        self.stop_agreed = False  # the last step's stop vote (loop.stop_agreed)
        self.step = self.tokens = 0
        self.saved_step = None  # the step of the checkpoint on disk
        self.best_val = self.last_val = self.last_acc = self.last_eval_step = None
        self.last_stats = {}
        self.logged_steps = set()  # the steps with a row in metrics.jsonl (rank 0)
        self.elapsed_before = 0.0  # wall time of the earlier launches (resume.restore)
        self.launch_start = time.perf_counter()
        self.throughput = Throughput()
        self.tokens_per_step = tc.batch_size * tc.grad_accum * self.cfg.model.block_size
        self.flops_per_token = (flops_per_token(matmul_params(self.model), self.cfg.model)
                                + gate_flops_per_token(self.model, self.cfg.model.block_size))

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

    def elapsed(self) -> float:
        """Wall time of the run: the earlier launches' and this one's since model construction."""
        return self.elapsed_before + time.perf_counter() - self.launch_start

    def autocast(self):
        """The forward pass's autocast (train.dtype; float32: off)."""
        return torch.autocast(self.device.type, dtype=self.amp_dtype or torch.float32,
                              enabled=self.amp_dtype is not None)

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
            with self.autocast():
                logits, loss = self.fwd(x, y, answers_only=self.tc.head_at_answers)
            answer = y >= 0
            n = int(answer.sum())
            total += float(loss) * n  # the loss is the mean over this batch's targets: weight batches by them
            count += n
            at_answers = logits if self.tc.head_at_answers else logits[answer]
            correct += int((at_answers.argmax(-1) == y[answer]).sum())
        self.fwd.train()
        if self.info.enabled:
            sums = D.all_reduce(torch.tensor([total, count, correct], dtype=torch.float64, device=self.device),
                                self.info)
            total, count, correct = float(sums[0]), float(sums[1]), float(sums[2])
        return total / count, correct / count
