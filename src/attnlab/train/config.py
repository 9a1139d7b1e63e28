"""Training-run configuration: :class:`TrainConfig` (optimisation, evaluation, logging) and :class:`RunConfig`.

A :class:`RunConfig` is the whole run: ``[model]`` (:class:`~attnlab.config.GPTConfig`), ``[data]``
(:class:`~attnlab.data.DataConfig`), ``[train]`` (:class:`TrainConfig`) plus where the run is written. It
round-trips through TOML with :mod:`attnlab.configio`; named presets live in :mod:`attnlab.presets`.
Field names and defaults follow nanoGPT where it has an equivalent (``max_iters`` is ``max_steps`` here).
"""

from __future__ import annotations

import dataclasses
import math
import operator
import re
import time
from dataclasses import dataclass, field

from ..config import GPTConfig
from ..data import DataConfig
from ..errors import ConfigError, check_choice, check_number, closest, strict_fields

DEVICES = ("auto", "cpu", "cuda", "mps")
WANDB_MODES = ("offline", "online", "disabled")
DTYPES = ("float32", "bfloat16", "float16")

STOP_METRICS = {"val_loss": (0.0, math.inf), "val_accuracy": (0.0, 1.0)}
"""The metrics a stop rule may name, each with the range its threshold must lie in (closed)."""
STOP_OPERATORS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt}
_STOP_RULE = re.compile(r"^\s*([A-Za-z_][\w/]*)\s*(>=|<=|>|<)\s*(\S+)\s*$")


@dataclass(frozen=True)
class StopRule:
    """A convergence threshold, parsed from ``train.stop_at`` ("METRIC OP NUMBER", e.g. ``"val_accuracy >= 0.99"``).

    Checked at every evaluation (step 0 included); the run stops at the first evaluation where it holds, and that
    step is the run's steps-to-threshold. ``train.max_steps`` is then the cap: a run that reaches it first without
    meeting the rule is *censored* ("not converged").
    """

    metric: str
    op: str
    threshold: float

    @classmethod
    def parse(cls, text: str) -> "StopRule":
        """The rule in ``text``; a one-line ConfigError for text that does not parse, an unknown metric or a
        threshold outside the metric's range."""
        allowed = ", ".join(STOP_METRICS)
        match = _STOP_RULE.match(text) if isinstance(text, str) else None
        if match is None:
            raise ConfigError(f"train.stop_at={text!r} does not parse; write 'METRIC OP NUMBER' with METRIC one of "
                              f"{allowed} and OP one of {', '.join(STOP_OPERATORS)}, e.g. 'val_accuracy >= 0.99'")
        metric, op, number = match.groups()
        if metric not in STOP_METRICS:
            hint = closest(metric, STOP_METRICS)
            raise ConfigError(f"train.stop_at={text!r} names the unknown metric {metric!r}"
                              f"{f' (did you mean {hint!r}?)' if hint else ''}; allowed: {allowed}")
        try:
            threshold = float(number)
        except ValueError:
            raise ConfigError(f"train.stop_at={text!r}: the threshold {number!r} is not a number") from None
        low, high = STOP_METRICS[metric]
        if not (math.isfinite(threshold) and low <= threshold <= high):
            raise ConfigError(f"train.stop_at={text!r}: the threshold {number} is outside {metric}'s range "
                              f"[{low:g}, {high:g}]")
        return cls(metric, op, threshold)

    def met(self, values: dict) -> bool:
        """Whether the rule holds for ``values`` ({metric: value}; a missing or non-finite value never does)."""
        value = values.get(self.metric)
        return value is not None and math.isfinite(value) and STOP_OPERATORS[self.op](value, self.threshold)

    def __str__(self) -> str:
        return f"{self.metric} {self.op} {self.threshold:g}"


@strict_fields
@dataclass(frozen=True)
class TrainConfig:
    """Optimisation (AdamW, linear warmup then cosine decay to ``min_lr``), evaluation, logging, checkpoints."""

    batch_size: int = 32
    """Sequences per micro-batch (the global micro-batch, split across processes under DDP)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (tokens/step = batch_size * grad_accum * block_size)."""
    max_steps: int = 2000
    """Optimizer steps (nanoGPT's `max_iters`)."""
    lr: float = 1e-3
    """Peak learning rate (after warmup)."""
    min_lr: float = 1e-4
    """Learning rate at the end of the cosine decay."""
    warmup_steps: int = 100
    """Linear warmup from 0 to lr; a warmup longer than the run is cut to the run (max_steps), so a short smoke run of any preset reaches lr at its last step."""
    decay_lr: bool = True
    """Cosine decay from lr to min_lr over the steps after warmup; False: constant lr."""
    decay_steps: int | None = None
    """The step at which the cosine decay reaches min_lr; the run goes on at min_lr after it. Unset: max_steps. Set it
    to a shorter run's max_steps to extend that run past its cap with the same schedule up to it (e.g. a longer
    cap for runs that had not met a stop_at threshold)."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay (not on norms, biases or embeddings)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.99
    """AdamW beta2."""
    grad_clip: float = 1.0
    """Max global gradient norm; 0 disables clipping."""
    eval_interval: int = 250
    """Steps between validation evaluations (also at the end); 0: only at the end."""
    eval_tokens: int = 65536
    """Validation tokens evaluated each time."""
    eval_lengths: tuple[int, ...] = ()
    """Length extrapolation on a task: sequence lengths (each above the task's seq_len) at which the task is also
    evaluated at every evaluation, its other parameters unchanged; logged as `length/<L>/accuracy` (the answer
    accuracy on 512 fixed sequences of length L). Needs a task source and positions that extend (rope,
    alibi, sinusoidal or none). Empty: none."""
    log_interval: int = 10
    """Steps between training-loss log lines."""
    checkpoint_interval: int = 500
    """Steps between checkpoints (also at the end); 0: only at the end."""
    seed: int = 1337
    """Seed of the initialisation, the data order and dropout."""
    device: str = "auto"
    """`"auto"`: cuda if available, else mps, else cpu; or `"cpu"`, `"cuda"`, `"mps"`."""
    dtype: str = "float32"
    """Compute dtype of the forward pass: `"float32"`, or mixed precision with `"bfloat16"` / `"float16"` autocast (`"float16"` on a GPU only: the CPU refuses it, use `"bfloat16"`)."""
    compile: bool = False
    """torch.compile the model."""
    sample_tokens: int = 500
    """Tokens of text generated at the end of the run (samples.txt); 0: none."""
    tensorboard: bool = False
    """Also write TensorBoard event files (needs `pip install tensorboard`)."""
    track_rank: bool = True
    """Log the pseudo-rank and participation ratio of the attention weights at each evaluation."""
    head_at_answers: bool = False
    """Run the output head (and the loss) only at the positions with a target, in training and evaluation: the same
    loss and gradients, without the head's cost at a task's ignored positions (about T / answers times less head
    work per sequence; what makes a vocabulary of 8,192 affordable). Text has a target everywhere: no change. Under
    train.compile the selection has a data-dependent shape, so the compiled graph breaks before the head."""
    divergence_factor: float = 2.0
    """The divergence guard: an evaluation whose validation loss exceeds this factor x the run's first one is bad."""
    divergence_patience: int = 3
    """Stop the run (status "diverged", the last good checkpoint kept) after this many bad evaluations in a row;
    0: never (a non-finite training loss or gradient stops a run regardless)."""
    wandb_project: str | None = None
    """Also log to Weights & Biases under this project (needs `pip install 'attnlab[wandb]'`); the run's id is kept
    in RUN_DIR/wandb_id.txt so that a resumed run continues the same W&B run."""
    wandb_mode: str = "offline"
    """`"offline"` (written under RUN_DIR/wandb, no network; `wandb sync` uploads it later), `"online"` or `"disabled"`."""
    stop_at: str | None = None
    """A convergence threshold, `"METRIC OP NUMBER"` with METRIC `val_loss` or `val_accuracy` (e.g.
    `"val_accuracy >= 0.99"`): checked at each evaluation, the run stops at the first one where it holds (its
    steps-to-threshold, `threshold_step` in summary.json); `max_steps` is then the cap, and a run that reaches it
    first is marked not converged. Unset: train to `max_steps`."""
    init_from: str | None = None
    """`"hf:DIR"`: start from a local Hugging Face GPT-2 directory (fine-tuning). The architecture is the
    checkpoint's (the run's `[model]` keeps only `attention`, `dropout` and a `block_size` up to the checkpoint's
    `n_positions`); the tokenizer must give its vocabulary, e.g. `data.tokenizer=DIR/tokenizer.json`."""

    def __post_init__(self):
        for name in ("batch_size", "grad_accum", "max_steps", "eval_tokens", "log_interval"):
            check_number(f"train.{name}", getattr(self, name), low=1, integer=True)
        for name in ("warmup_steps", "eval_interval", "checkpoint_interval", "sample_tokens", "seed",
                     "divergence_patience"):
            check_number(f"train.{name}", getattr(self, name), low=0, integer=True)
        check_number("train.lr", self.lr, low=0.0, low_open=True)
        check_number("train.min_lr", self.min_lr, low=0.0)
        check_number("train.weight_decay", self.weight_decay, low=0.0)
        check_number("train.grad_clip", self.grad_clip, low=0.0)
        check_number("train.divergence_factor", self.divergence_factor, low=1.0, low_open=True)
        for name in ("beta1", "beta2"):
            check_number(f"train.{name}", getattr(self, name), low=0.0)
            if not getattr(self, name) < 1.0:
                raise ConfigError(f"train.{name}={getattr(self, name)!r} must be < 1")
        for name in ("lr", "min_lr", "weight_decay", "grad_clip"):
            if not math.isfinite(getattr(self, name)):
                raise ConfigError(f"train.{name}={getattr(self, name)!r} must be a finite number")
        for name in ("decay_lr", "compile", "tensorboard", "track_rank", "head_at_answers"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"train.{name}={getattr(self, name)!r} must be true or false")
        check_choice("train.device", self.device, DEVICES)
        check_choice("train.dtype", self.dtype, DTYPES)
        check_choice("train.wandb_mode", self.wandb_mode, WANDB_MODES)
        if self.wandb_project is not None and not (isinstance(self.wandb_project, str) and self.wandb_project):
            raise ConfigError(f"train.wandb_project={self.wandb_project!r} must be a non-empty string or unset")
        if self.init_from is not None and not (isinstance(self.init_from, str) and self.init_from.startswith("hf:")
                                               and len(self.init_from) > 3):
            raise ConfigError(f"train.init_from={self.init_from!r} must be 'hf:DIR' (a local Hugging Face GPT-2 "
                              f"directory) or unset")
        if not isinstance(self.eval_lengths, (list, tuple)):
            raise ConfigError(f"train.eval_lengths={self.eval_lengths!r} must be a list of sequence lengths")
        for length in self.eval_lengths:
            check_number("train.eval_lengths[]", length, low=1, integer=True)
        if len(set(self.eval_lengths)) != len(self.eval_lengths):
            raise ConfigError(f"train.eval_lengths={list(self.eval_lengths)!r} repeats a length")
        if self.stop_at is not None:
            StopRule.parse(self.stop_at)  # a bad rule is a one-line ConfigError here, before any training
        if self.min_lr > self.lr:
            raise ConfigError(f"train.min_lr={self.min_lr!r} must be <= train.lr={self.lr!r}")
        if self.decay_steps is not None:
            check_number("train.decay_steps", self.decay_steps, low=1, integer=True)
            if self.decay_steps <= self.warmup_steps:
                raise ConfigError(f"train.decay_steps={self.decay_steps!r} must be > train.warmup_steps="
                                  f"{self.warmup_steps!r} (the decay starts after the warmup), or unset")

    @property
    def stop_rule(self) -> StopRule | None:
        """``stop_at`` parsed (None when unset)."""
        return None if self.stop_at is None else StopRule.parse(self.stop_at)

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes)


@strict_fields
@dataclass(frozen=True)
class RunConfig:
    """One training run: model, data, training schedule and output directory.

    ``model.vocab_size`` is overwritten at run time with the tokenizer's vocabulary size, so it is not
    checked against ``data`` here.
    """

    model: GPTConfig = field(default_factory=GPTConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    out_dir: str | None = None  # None: runs/<timestamp>-<variant>
    preset: str | None = None  # the preset this config started from (informational)

    def __post_init__(self):
        from ..configio import from_dict  # tables given as plain dicts are accepted and converted

        for name, cls in (("model", GPTConfig), ("data", DataConfig), ("train", TrainConfig)):
            value = getattr(self, name)
            if isinstance(value, dict):
                object.__setattr__(self, name, from_dict(cls, value, name))
            elif not isinstance(value, cls):
                raise ConfigError(f"{name}={value!r} must be a {cls.__name__} (a [{name}] table)")
        for name in ("out_dir", "preset"):
            value = getattr(self, name)
            if value is not None and not (isinstance(value, str) and value):
                raise ConfigError(f"{name}={value!r} must be a non-empty string or unset")

    @property
    def variant_name(self) -> str:
        """The attention variant's name, or "custom" for an explicit AttentionConfig table."""
        attn = self.model.attention
        return attn if isinstance(attn, str) else "custom"

    def resolved_out_dir(self, now: float | None = None) -> str:
        """``out_dir``, or ``runs/<YYYYmmdd-HHMMSS>-<variant>`` when it is unset."""
        if self.out_dir is not None:
            return self.out_dir
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
        return f"runs/{stamp}-{self.variant_name}"

    def replace(self, **changes) -> "RunConfig":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        from ..configio import to_dict

        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict) -> "RunConfig":
        from ..configio import from_dict

        return from_dict(cls, data)


__all__ = ["TrainConfig", "RunConfig", "StopRule", "STOP_METRICS", "DEVICES", "DTYPES"]
