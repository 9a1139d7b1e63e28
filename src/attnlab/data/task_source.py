"""A synthetic task (:mod:`attnlab.tasks`) as a data source: ``data.source = "task:<name>"``, its parameters in
``data.task`` (e.g. ``data.task.n_pairs=16``), trained and evaluated by the ordinary trainer.

:class:`TaskDataset` has the interface of :class:`attnlab.data.Dataset` that the trainer uses (``get_batch``,
``val_batches``, ``val_windows``, ``tokenizer``, ``vocab_size``), plus ``seq_len`` (the model's block_size is the
task's sequence length) and ``prompt`` (what the end-of-run sample continues). Every window is one task sequence;
targets off the answer positions are -1 (the model's ignore_index), so loss and accuracy count answers only.

Seeding: a training batch draws one 62-bit seed from the trainer's ``torch.Generator`` and generates from
``numpy.random.default_rng([TRAIN_STREAM, seed])``, so the batch sequence is resumed exactly with the generator's
state. Validation sequences come from a fixed stream (``[VAL_STREAM, k]`` for the k-th batch of ``VAL_BATCH``
sequences), the same for every run of the same task settings, and independent of training (another seed
sequence entropy).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ConfigError, check_number
from ..tasks import get_task
from .tokenizers import TaskTokenizer

TASK_PREFIX = "task:"
TRAIN_STREAM, VAL_STREAM = 1, 0
VAL_BATCH = 64  # validation sequences are generated in blocks of this many, each block from its own seed


def task_name(source: str) -> str | None:
    """The task's name of a ``data.source`` (``"task:mqar"`` -> ``"mqar"``), or None for a text source."""
    return source[len(TASK_PREFIX):] if source.startswith(TASK_PREFIX) else None


@dataclass(frozen=True, eq=False)
class TaskDataset:
    """Sequences of ``task`` (an attnlab.tasks task instance); see the module docstring."""

    task: object
    tokenizer: TaskTokenizer

    @classmethod
    def build(cls, name: str, params: dict) -> TaskDataset:
        task = get_task(name, params)
        return cls(task, TaskTokenizer(task.vocab_size, name))

    @property
    def vocab_size(self) -> int:
        return self.task.vocab_size

    @property
    def seq_len(self) -> int:
        return self.task.seq_len

    @property
    def prompt(self) -> str:
        """The first validation sequence up to (and including) its first answer position's input."""
        x, y = self.task.sample(1, np.random.default_rng([VAL_STREAM, 0]))
        answers = np.flatnonzero(y[0] >= 0)
        return self.tokenizer.decode(x[0, : (answers[0] + 1 if len(answers) else x.shape[1])])

    def _check_block(self, block_size: int) -> None:
        if block_size != self.seq_len:
            raise ConfigError(f"model.block_size={block_size} differs from the sequence length {self.seq_len} of task "
                              f"{self.tokenizer.task!r}; a task run's block_size is its seq_len")

    def get_batch(self, split: str, batch_size: int, block_size: int, generator: torch.Generator):
        """(x, y) int64 tensors [batch_size, seq_len]: fresh training sequences ("train"), or the first
        ``batch_size`` validation sequences ("val")."""
        check_number("batch_size", batch_size, low=1, integer=True)
        self._check_block(block_size)
        if split == "val":
            return next(self.val_batches(batch_size * self.seq_len, batch_size, block_size))
        seed = int(torch.randint(2**62, (1,), generator=generator))
        x, y = self.task.sample(batch_size, np.random.default_rng([TRAIN_STREAM, seed]))
        return torch.from_numpy(np.asarray(x, dtype=np.int64)), torch.from_numpy(np.asarray(y, dtype=np.int64))

    def val_windows(self, n_tokens: int | None, block_size: int) -> int:
        """How many validation sequences cover ``n_tokens`` tokens: ``n_tokens // seq_len``, at least one
        (``None``: one block of VAL_BATCH)."""
        self._check_block(block_size)
        if n_tokens is None:
            return VAL_BATCH
        check_number("n_tokens", n_tokens, low=1, integer=True)
        return max(1, n_tokens // self.seq_len)

    def val_batches(self, n_tokens: int | None, batch_size: int, block_size: int) -> Iterator[tuple]:
        """The fixed validation sequences, in batches of ``batch_size`` (the last one may be smaller)."""
        check_number("batch_size", batch_size, low=1, integer=True)
        n = self.val_windows(n_tokens, block_size)
        blocks = [self.task.sample(VAL_BATCH, np.random.default_rng([VAL_STREAM, k]))
                  for k in range(-(-n // VAL_BATCH))]
        x = np.concatenate([b[0] for b in blocks])[:n].astype(np.int64)
        y = np.concatenate([b[1] for b in blocks])[:n].astype(np.int64)
        for i in range(0, n, batch_size):
            yield torch.from_numpy(x[i : i + batch_size]), torch.from_numpy(y[i : i + batch_size])


__all__ = ["TASK_PREFIX", "TaskDataset", "task_name"]
