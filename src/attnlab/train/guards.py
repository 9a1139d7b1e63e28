"""The guards that stop a run whose training went bad, each with a one-line message.

* The non-finite guard (every step, :class:`NonFiniteGuard`): a NaN or infinite training loss or gradient norm stops
  the run before that step's update. With a fused AdamW (and neither fp16's GradScaler nor DDP), the loss and the
  norm are read on the host only at the steps that are logged, evaluated or saved, the last step, and when
  stopping: a bad step in between is skipped on the device (:func:`attnlab.train.optim.skip_step_if_not_finite`),
  later steps train, and the next read stops the run naming the first bad step.
* The divergence guard (every evaluation, :class:`DivergenceGuard`): the validation loss above
  train.divergence_factor x the run's first one for train.divergence_patience evaluations in a row (0: off).

Both raise :class:`Diverged`; the loop then writes summary.json with status "diverged", leaves the last good
checkpoint as it is, and raises :class:`TrainingDiverged`.
"""

from __future__ import annotations

import math

import torch

from ..errors import TrainingDiverged  # noqa: F401  (raised by the loop; its home is attnlab.errors)
from .config import TrainConfig
from .optim import lr_at

__all__ = ["TrainingDiverged", "Diverged", "NonFiniteGuard", "DivergenceGuard", "diverged_message"]


class Diverged(Exception):
    """Raised inside the loop by a guard: the step it happened at, what went bad, its value, the lr, and why."""

    def __init__(self, step: int, what: str, value: float, lr: float, why: str = ""):
        super().__init__(step, what, value, lr)
        self.step, self.what, self.value, self.lr, self.why = step, what, value, lr, why


def diverged_message(d: Diverged, checkpoint) -> str:
    """The one line of TrainingDiverged and summary.json's message."""
    return (f"training diverged at step {d.step}: the {d.what} is {d.value:.6g}{d.why} (lr {d.lr:.3g}); "
            f"the last good checkpoint ({checkpoint or 'none saved yet'}) is untouched; "
            f"try a lower train.lr, more train.warmup_steps or train.grad_clip > 0")


class NonFiniteGuard:
    """The training loss and gradient norm of every step are finite, or the run stops (see the module docstring).

    ``on_device``: bad steps are flagged on the device (no host read) and skipped by the fused AdamW.
    """

    def __init__(self, on_device: bool, device: torch.device, tc: TrainConfig):
        self.on_device = on_device
        self.tc = tc
        self.first_bad = torch.zeros((), dtype=torch.long, device=device)  # first non-finite step (0: none)

    def flag(self, k: int, loss: torch.Tensor, grad_norm: torch.Tensor) -> torch.Tensor:
        """Whether step k is bad (a 0-d bool tensor, not read), remembering the first bad step on the device."""
        bad = ~(torch.isfinite(loss) & torch.isfinite(grad_norm))
        self.first_bad = torch.where(bad & (self.first_bad == 0), k, self.first_bad)  # keep an earlier one
        return bad

    def raise_if_flagged(self) -> None:
        """Raise Diverged for the first flagged step (its update, and any later bad one, were skipped)."""
        step = int(self.first_bad)  # the one host read of the flags
        if step:
            raise Diverged(step, "training loss or gradient norm", float("nan"), lr_at(step, self.tc),
                           " (not finite; that step's update and any later non-finite one were skipped)")

    def check(self, k: int, loss: float, grad_norm: float, scaled: bool) -> None:
        """Host values of step k: raise Diverged if the loss, or the gradient norm, is not finite. With fp16
        (``scaled``) an infinite norm is the GradScaler's business: it skips that step and lowers its scale."""
        if not math.isfinite(loss):
            raise Diverged(k, "training loss", loss, lr_at(k, self.tc))
        if not scaled and not math.isfinite(grad_norm):
            raise Diverged(k, "gradient norm", grad_norm, lr_at(k, self.tc))


class DivergenceGuard:
    """Counts the evaluations in a row whose loss exceeds divergence_factor x the run's first one (NaN too)."""

    def __init__(self, tc: TrainConfig, first: float | None = None):
        self.tc = tc
        self.first = first  # the run's first validation loss (saved in the checkpoint)
        self.bad = 0  # bad evaluations in a row (not saved: a checkpoint is never taken of a bad state)

    def watch(self, val: float) -> None:
        """Take a validation loss (checked against the patience by :meth:`raise_if_diverged`, once it is logged)."""
        if self.first is None:
            self.first = val
        elif not val <= self.tc.divergence_factor * self.first:  # also true for NaN
            self.bad += 1
        else:
            self.bad = 0

    def raise_if_diverged(self, k: int, val: float | None) -> None:
        """Raise Diverged after divergence_patience bad evaluations in a row (the last one at step k)."""
        if self.tc.divergence_patience and self.bad >= self.tc.divergence_patience:
            raise Diverged(k, "validation loss", val, lr_at(k, self.tc),
                           f", above {self.tc.divergence_factor:g} x its first value {self.first:.4f} for "
                           f"{self.bad} evaluations in a row")
