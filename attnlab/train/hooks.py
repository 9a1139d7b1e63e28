"""How research measurements reach the trainer: small hooks, so the training loop imports no analysis.

The trainer calls, for every hook in order:

    step_begins(model, record)   before the forward/backward of a step; ``record``: this step's row will be logged
    step_stats(model) -> dict    after that forward/backward, only when ``record``: keys for the step's row
    step_ends(model)             after the forward/backward, always (also when it raised)
    eval_stats(model) -> dict    on rank 0 at every evaluation: keys for the row with the validation loss

A hook writes keys under its own ``prefixes`` (they also go to TensorBoard as scalars). Non-finite values in
``step_stats`` are logged as null. :func:`default_hooks` gives the two attnlab ships, from the run config:

* :class:`MagnitudeGateHook` (seed 000): each magnitude gate's statistics of the step's last micro-batch,
  ``mag/L<i>/<stat>``; gates record only on logged steps (recording costs device syncs and one product with Z);
* :class:`RankHook` (seed 001; ``train.track_rank``): :func:`attnlab.analysis.rank.rank_metrics` at every
  evaluation, ``pseudo_rank/<m>/L<i>`` and ``participation_ratio/<m>/L<i>``.

A study adds its own by passing ``hooks=[MyHook()]`` to :func:`attnlab.train.train`; they run after the defaults.
"""

from __future__ import annotations

from torch import nn

from ..analysis.rank import rank_metrics
from ..nn.gates import magnitude_gates, magnitude_log, record_magnitude_stats

__all__ = ["TrainHook", "MagnitudeGateHook", "RankHook", "default_hooks"]


class TrainHook:
    """The interface, with do-nothing defaults: override what the measurement needs."""

    prefixes: tuple[str, ...] = ()

    def step_begins(self, model: nn.Module, record: bool) -> None:
        pass

    def step_stats(self, model: nn.Module) -> dict[str, float]:
        return {}

    def step_ends(self, model: nn.Module) -> None:
        pass

    def eval_stats(self, model: nn.Module) -> dict[str, float]:
        return {}


class MagnitudeGateHook(TrainHook):
    """The magnitude gates' statistics (t, |X|/N, residual, mu range, jitter, mean gate) on the logged steps."""

    prefixes = ("mag/",)

    def step_begins(self, model: nn.Module, record: bool) -> None:
        record_magnitude_stats(model, record)

    def step_stats(self, model: nn.Module) -> dict[str, float]:
        return magnitude_log(model)

    def step_ends(self, model: nn.Module) -> None:
        record_magnitude_stats(model, False)


class RankHook(TrainHook):
    """Pseudo-rank and participation ratio of every attention weight at each evaluation."""

    prefixes = ("pseudo_rank/", "participation_ratio/")

    def eval_stats(self, model: nn.Module) -> dict[str, float]:
        return rank_metrics(model)


def default_hooks(cfg, model: nn.Module) -> list[TrainHook]:
    """The hooks a run of ``cfg`` (a RunConfig) logs with: the gate hook when ``model`` has magnitude gates,
    the rank hook when ``train.track_rank``."""
    hooks: list[TrainHook] = [MagnitudeGateHook()] if magnitude_gates(model) else []
    return hooks + ([RankHook()] if cfg.train.track_rank else [])
