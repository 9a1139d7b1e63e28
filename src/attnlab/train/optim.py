"""The optimiser: AdamW with weight decay on weight matrices only, and the learning-rate schedule.

Weight decay (decoupled, Loshchilov & Hutter 2019) is applied to every trainable >= 2-D parameter that is not
an embedding table: the matrices that do the model's work, whether they sit in an ``nn.Linear`` or are held
directly (low-rank factors, identity-initialised projections). LayerNorm gains, biases, scalar gains and
embeddings (the token embedding, which is also the tied output head, and learned position embeddings) are not
decayed: shrinking them towards zero only fights the normalisation or removes information about rare tokens.

The schedule (:func:`lr_at`) is a linear warmup from 0 to ``lr`` followed by a cosine decay to ``min_lr``
(Loshchilov & Hutter 2017, "SGDR", without restarts), the schedule of GPT-3 (Brown et al. 2020, appendix B).

:func:`skip_step_if_not_finite` is the one place that relies on a private contract of torch (the fused AdamW's
``found_inf`` attribute); tests/test_trainer_guards.py checks that contract against the installed torch.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from .config import TrainConfig

__all__ = ["lr_at", "split_params", "param_groups", "make_optimizer", "set_lr", "skips_on_device",
           "skip_step_if_not_finite"]


def lr_at(step: int, cfg: TrainConfig) -> float:
    """Learning rate of optimizer step ``step`` (1-based: step k is the k-th update; lr_at(0) = 0).

    With W = min(warmup_steps, max_steps) (a warmup longer than the run is cut to it), S = decay_steps if set,
    else max_steps, η = lr, η_min = min_lr::

        k < W:            η · k / W                                          (linear warmup from 0)
        W <= k <= S:      η_min + ½ (η − η_min) (1 + cos(π (k − W) / (S − W)))   (cosine decay)
        k > S:            η_min

    so ``lr_at(W) == lr`` and ``lr_at(S) == min_lr``. With ``decay_lr=False`` the rate stays η after warmup.
    """
    warmup = min(cfg.warmup_steps, cfg.max_steps)
    total = cfg.max_steps if cfg.decay_steps is None else cfg.decay_steps
    if step < warmup:
        return cfg.lr * step / warmup
    if not cfg.decay_lr or total <= warmup:
        return cfg.lr
    progress = min(1.0, (step - warmup) / (total - warmup))
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


def split_params(model: nn.Module) -> tuple[list[tuple[str, nn.Parameter]], list[tuple[str, nn.Parameter]]]:
    """(decay, no_decay): named trainable parameters, each parameter exactly once.

    ``decay`` holds every >= 2-D parameter that is not an embedding table (``nn.Embedding`` or learned
    positions; the tied ``lm_head.weight`` *is* ``wte.weight``, so it counts as an embedding) or a set of points
    (the landmarks of a MagnitudeGate with the lowrank solver: decay would pull them to the origin, away from the
    keys). Everything else is ``no_decay``. A parameter shared by several modules is listed once, under its first
    name.
    """
    from ..nn import LearnedPositions
    from ..mechanisms.magnitude.module import magnitude_gates

    embedding_ids = {id(m.weight) for m in model.modules() if isinstance(m, (nn.Embedding, LearnedPositions))}
    embedding_ids |= {id(g.landmarks) for g in magnitude_gates(model) if g.landmarks is not None}
    decay, no_decay = [], []
    for name, p in model.named_parameters():  # named_parameters() already yields a shared parameter once
        if p.requires_grad:
            (decay if p.dim() >= 2 and id(p) not in embedding_ids else no_decay).append((name, p))
    return decay, no_decay


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """The two AdamW parameter groups: Linear weights with ``weight_decay``, the rest with none."""
    decay, no_decay = split_params(model)
    return [
        {"params": [p for _, p in decay], "weight_decay": weight_decay},
        {"params": [p for _, p in no_decay], "weight_decay": 0.0},
    ]


def make_optimizer(model: nn.Module, cfg: TrainConfig, device_type: str = "cpu") -> torch.optim.AdamW:
    """AdamW over :func:`param_groups` (the fused kernel on CPU and CUDA: ~4x faster than the foreach one on the
    `cpu` preset's CPU, and :func:`skip_step_if_not_finite` lets the trainer skip a non-finite step without a host
    read); the lr is set every step from :func:`lr_at`."""
    extra = {"fused": True} if device_type in ("cpu", "cuda") else {}
    return torch.optim.AdamW(
        param_groups(model, cfg.weight_decay), lr=lr_at(0, cfg), betas=(cfg.beta1, cfg.beta2), **extra
    )


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def skips_on_device(optimizer: torch.optim.Optimizer) -> bool:
    """Whether :func:`skip_step_if_not_finite` can skip a step of ``optimizer`` on the device (a fused AdamW)."""
    return bool(optimizer.defaults.get("fused"))


def skip_step_if_not_finite(optimizer: torch.optim.Optimizer, bad: torch.Tensor) -> None:
    """``optimizer.step()``, made a no-op on the device when ``bad`` (a 0-d bool tensor) is true: no host read.

    This relies on a private contract of torch's fused Adam/AdamW (``fused=True``, CPU and CUDA kernels), the one
    ``torch.amp.GradScaler.step`` uses for fp16: when the optimizer has an attribute ``found_inf`` (a 0-d float32
    tensor), ``step()`` passes it to the fused kernel, which leaves the parameters and both moments alone where it
    is nonzero, and then subtracts it from every step count (so the count does not move either). Where it is zero
    the step is an ordinary one. Like GradScaler, the attribute is set just before the step and removed after it.
    tests/test_trainer_guards.py fails if the installed torch no longer keeps this contract.
    """
    if not skips_on_device(optimizer):
        raise ValueError("skip_step_if_not_finite needs a fused AdamW (make_optimizer on cpu or cuda)")
    optimizer.found_inf = bad.to(torch.float32)  # 1.0 when bad: the kernel skips the update, 0.0: a normal step
    try:
        optimizer.step()
    finally:
        del optimizer.found_inf
