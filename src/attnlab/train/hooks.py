"""How research measurements reach the trainer: small hooks, so the training loop imports no analysis.

The trainer calls, for every hook in order:

    step_begins(model, record)   before the forward/backward of a step; ``record``: this step's row will be logged
    step_stats(model) -> dict    after that forward/backward, only when ``record``: keys for the step's row
    step_ends(model)             after the forward/backward, always (also when it raised)
    eval_stats(model) -> dict    on rank 0 at every evaluation: keys for the row with the validation loss

A hook writes keys under its own ``prefixes`` (they also go to TensorBoard as scalars). Non-finite values in
``step_stats`` are logged as null. :func:`default_hooks` gives the ones attnlab ships, from the run config:

* :class:`MagnitudeGateHook` (the magnitude write-up): each magnitude gate's statistics of the step's last micro-batch,
  ``mag/L<i>/<stat>``; gates record only on logged steps (recording costs device syncs and one product with Z);
* :class:`MoHHook` (runs when the model has MoH layers): ``moh/aux_loss``, the load-balance loss added
  to the training loss, and per layer ``moh/L<i>/balance`` (L_b) and ``moh/L<i>/h<j>`` (head j's mean weight);
* :class:`RankHook` (the Boneless write-up; ``train.track_rank``): :func:`attnlab.analysis.rank.rank_metrics` at every
  evaluation, ``pseudo_rank/<m>/L<i>`` and ``participation_ratio/<m>/L<i>``.

* :class:`HijackSweepHook` (the magnitude write-up; runs on ``task:hijack`` and ``task:hijack-v2``): at every evaluation, for each
  cell of the task's sweep (a cluster size m, and for hijack-v2 the cluster's kind), the accuracy at the hijack
  query and the attention mass of the retrieval head on the unique binding and on the cluster,
  ``hijack/<cell>/<stat>``.
* :class:`LengthHook` (``train.eval_lengths`` on a task): at every evaluation, the task at each longer sequence
  length L, its other parameters unchanged, ``length/<L>/accuracy`` (length extrapolation).

A study adds its own by passing ``hooks=[MyHook()]`` to :func:`attnlab.train.train`; they run after the defaults.
"""

from __future__ import annotations

from torch import nn

from ..errors import ConfigError

from ..analysis.rank import rank_metrics
from ..analysis.task_mass import at_length, attention_mass, task_accuracy
from ..data.task_source import task_name
from ..tasks import get_task
from ..mechanisms.magnitude.module import magnitude_gates, magnitude_log, record_magnitude_stats
from ..mechanisms.heads.module import moh_log, moh_routers

__all__ = ["TrainHook", "MagnitudeGateHook", "MoHHook", "RankHook", "HijackSweepHook", "LengthHook", "default_hooks"]


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


class MoHHook(TrainHook):
    """Mixture-of-head routing on the logged steps: the load-balance loss and each head's mean weight per layer."""

    prefixes = ("moh/",)

    def step_stats(self, model: nn.Module) -> dict[str, float]:
        return moh_log(model)


class RankHook(TrainHook):
    """Pseudo-rank and participation ratio of every attention weight at each evaluation."""

    prefixes = ("pseudo_rank/", "participation_ratio/")

    def eval_stats(self, model: nn.Module) -> dict[str, float]:
        return rank_metrics(model)


class HijackSweepHook(TrainHook):
    """The magnitude write-up's hijacking measured during training: the task evaluated at each cell of its sweep alone.

    A cell is the task at one cluster size m (``task.sweep(ms)``: for ``hijack`` the m of ``ms`` its capacity
    allows, labelled ``m<m>``; for ``hijack-v2`` also the cluster's kind, e.g. ``exact-m16``, ``synonym-m16``,
    ``mediocre-m16``). For each cell, on ``n`` fixed sequences (the same for every run, model and evaluation:
    seed ``[seed, m]``), :func:`attnlab.analysis.task_mass.attention_mass` gives the accuracy at the hijack query
    (role 3) and the mass of every layer and head on the unique binding and on the cluster's bindings (key and
    value tokens). The *retrieval head* is the (layer, head) that puts the most mass on the unique binding in the
    first cell (the smallest m); its masses in every cell are logged:

        hijack/<cell>/accuracy   exact match at the hijack query
        hijack/<cell>/unique     retrieval head's mass on the unique binding
        hijack/<cell>/cluster    retrieval head's mass on the m cluster bindings
    """

    prefixes = ("hijack/",)

    def __init__(self, task, ms=None, n: int = 256, seed: int = 7):
        self.task, self.n, self.seed = task, n, seed
        self.cells = task.sweep(ms)

    def eval_stats(self, model: nn.Module) -> dict[str, float]:
        masses = {label: attention_mass(model, cell, n=self.n, seed=[self.seed, cell.m])
                  for label, cell in self.cells.items()}
        first = next(iter(masses.values()))["unique_binding"]
        layer, head = divmod(int(first.argmax()), first.shape[1])
        row = {}
        for label, mass in masses.items():
            row[f"hijack/{label}/accuracy"] = mass["accuracy"]
            row[f"hijack/{label}/unique"] = float(mass["unique_binding"][layer, head])
            row[f"hijack/{label}/cluster"] = float(mass["cluster_binding"][layer, head])
        return row


class LengthHook(TrainHook):
    """Length extrapolation: a model trained on sequences of the task's seq_len T, evaluated at longer lengths.

    For each L of ``lengths``, the task with ``seq_len = L`` and every other parameter unchanged (for mqar: the same
    pairs and queries in a longer stream, so the extra tokens are filler the queries must look past), on ``n`` fixed
    sequences (numpy seed ``[seed, L]``, the same for every run and evaluation), read by a copy of the model that
    takes L tokens (:func:`attnlab.analysis.task_mass.at_length`: the same parameters, positions recomputed):

        length/<L>/accuracy   exact match over every answer position
    """

    prefixes = ("length/",)

    def __init__(self, task, lengths, n: int = 512, seed: int = 13):
        self.n, self.seed = n, seed
        self.cells = {}
        for length in lengths:
            if length <= task.seq_len:
                raise ConfigError(f"train.eval_lengths has {length}; each length must exceed the task's "
                                  f"seq_len={task.seq_len} (the training length is evaluated anyway)")
            longer = task.replace(seq_len=length)  # a length the task's parameters do not fit: its one-line error
            if longer.vocab_size != task.vocab_size:
                raise ConfigError(f"task {task.name!r} at seq_len={length} has {longer.vocab_size} tokens, not the "
                                  f"{task.vocab_size} it was trained with; it cannot be evaluated at that length")
            self.cells[length] = longer

    def eval_stats(self, model: nn.Module) -> dict[str, float]:
        return {f"length/{length}/accuracy": task_accuracy(at_length(model, length), task, n=self.n,
                                                            seed=[self.seed, length])
                for length, task in self.cells.items()}


def default_hooks(cfg, model: nn.Module) -> list[TrainHook]:
    """The hooks a run of ``cfg`` (a RunConfig) logs with: the gate hook when ``model`` has magnitude gates, the
    MoH hook when it has MoH routers, the rank hook when ``train.track_rank``, the hijack sweep on a task that defines
    one (``task.sweep``: hijack, hijack-v2), the length hook when ``train.eval_lengths``."""
    hooks: list[TrainHook] = [MagnitudeGateHook()] if magnitude_gates(model) else []
    hooks += [MoHHook()] if moh_routers(model) else []
    name = task_name(cfg.data.source)
    task = None if name is None else get_task(name, cfg.data.task or {})
    if hasattr(task, "sweep"):  # the hijack tasks
        hooks.append(HijackSweepHook(task))
    if cfg.train.eval_lengths:
        if task is None:
            raise ConfigError(f"train.eval_lengths={list(cfg.train.eval_lengths)!r} evaluates a task at other "
                              f"lengths; data.source={cfg.data.source!r} is not a task (use data.source=task:NAME)")
        if cfg.model.pos_encoding == "learned":
            raise ConfigError("train.eval_lengths needs positions that extend beyond the training length; "
                              "model.pos_encoding='learned' has none (use rope, alibi, sinusoidal or none)")
        hooks.append(LengthHook(task, cfg.train.eval_lengths))
    return hooks + ([RankHook()] if cfg.train.track_rank else [])
