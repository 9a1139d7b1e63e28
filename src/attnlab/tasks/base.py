"""What every task shares: the :class:`Task` base, the parameter checks and the printed example.

A task builds each sequence as a *stream* of T + 1 tokens and splits it the usual way for next-token prediction:
``x = stream[:, :T]`` and ``y = stream[:, 1:]``, with ``y`` set to -1 (the model's ``ignore_index``) everywhere
except the answer positions. ``y[:, t]`` is what the model must predict after reading ``x[:, :t + 1]``.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import numpy as np

from ..errors import ConfigError

IGNORE = -1
"""The target at every position that is not an answer (cross-entropy's ``ignore_index``)."""


def check_int(field: str, value, low: int, high: int | None = None, why: str = "") -> None:
    """One-line ConfigError unless ``value`` is an integer in low..high (high None: no upper bound).

    The message names the field as ``data.task.<field>``, the bad value and the allowed range; ``why`` says what
    sets the upper bound when other parameters do (e.g. "the pairs must fit in seq_len + 1 = 65 tokens").
    """
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
        raise ConfigError(f"data.task.{field}={value!r} must be an integer")
    allowed = f"{low}..{high}" if high is not None else f">= {low}"
    if high is not None and high < low:
        raise ConfigError(f"data.task.{field}={value!r} cannot be met: the allowed range {allowed} is empty"
                          f"{'; ' + why if why else ''}")
    if value < low or (high is not None and value > high):
        raise ConfigError(f"data.task.{field}={value!r} is out of range; allowed {allowed}"
                          f"{' (' + why + ')' if why else ''}")


def check_bool(task: str, field: str, value) -> None:
    """One-line ConfigError unless ``value`` is a bool (``true`` or ``false`` in a config)."""
    if not isinstance(value, bool):
        raise ConfigError(f"{task}: {field}={value!r} is not allowed; choose true or false")


def distinct(rng: np.random.Generator, n: int, population: int, k: int) -> np.ndarray:
    """[n, k] int64: for each row, k distinct draws from 0..population-1, in random order."""
    return np.argsort(rng.random((n, population)), axis=1)[:, :k].astype(np.int64)


def sorted_slots(rng: np.random.Generator, n: int, length: int, k: int, width: int = 1) -> np.ndarray:
    """[n, k] int64: for each row, the start positions (sorted) of k non-overlapping blocks of ``width`` tokens
    placed uniformly at random in ``length`` positions (every placement equally likely)."""
    free = length - (width - 1) * k  # choose k of the compressed positions, then stretch each block to `width`
    chosen = np.sort(distinct(rng, n, free, k), axis=1)
    return chosen + (width - 1) * np.arange(k, dtype=np.int64)


def power_law_slots(rng: np.random.Generator, n: int, slots: int, k: int, power: float) -> np.ndarray:
    """[n, k] int64: for each row, k distinct slots of 0..slots-1 in the order they are drawn one after another
    without replacement, slot g with probability proportional to (g + 1)^(power - 1) among those left.

    Gumbel top-k: the k largest of log w_g + G_g (G_g standard Gumbel), in decreasing order, are distributed as
    those successive draws (Vieira 2014; Kool et al. 2019, arXiv:1903.06059)."""
    log_w = (power - 1.0) * np.log(np.arange(1, slots + 1, dtype=np.float64))
    perturbed = log_w + rng.gumbel(size=(n, slots))
    return np.argsort(-perturbed, axis=1, kind="stable")[:, :k].astype(np.int64)


class Task:
    """The interface every task provides (the task classes are frozen dataclasses deriving from it).

    - ``name`` / ``summary``: the registry name and one line for ``attnlab tasks``;
    - ``vocab_size``: token ids are 0..vocab_size-1, special tokens included; ``seq_len``: T, the width of x and y;
    - :meth:`sample` ``(n, rng) -> (x, y)``: int64 [n, T] each; y is -1 off the answer positions;
    - :meth:`roles` ``(x)``: int8 [n, T] position roles for attention measurements, or None if the task has none;
    - :meth:`chance_accuracy`: the accuracy of the best predictor that ignores the context (see its docstring);
    - :meth:`example`: one sequence printed with its targets; :meth:`tiny` is the task at the docstring's sizes.
    """

    name: ClassVar[str]
    summary: ClassVar[str]
    tiny_params: ClassVar[dict]
    """Parameters of the tiny instance the docstring's example prints."""

    seq_len: int

    # ------------------------------------------------------------------------------------------- what a task defines

    @property
    def vocab_size(self) -> int:
        raise NotImplementedError

    def _stream(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(stream int64 [n, T + 1], answer bool [n, T]): answer[:, t] marks that stream[:, t + 1] is an answer."""
        raise NotImplementedError

    def token_name(self, token: int) -> str:
        """A short printable name for one token id (used by :meth:`example`)."""
        raise NotImplementedError

    def chance_accuracy(self) -> float:
        raise NotImplementedError

    # ------------------------------------------------------------------------------------------------- shared API

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """x [n, T] int64 inputs and y [n, T] int64 next-token targets, -1 everywhere except the answer positions
        (``y[:, t]`` is what the model must predict after reading ``x[:, :t + 1]``). Deterministic given rng's
        state: the same state gives the same batch."""
        if not isinstance(n, (int, np.integer)) or isinstance(n, bool) or n < 0:
            raise ValueError(f"n={n!r} must be a non-negative integer (the number of sequences)")
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy.random.Generator (np.random.default_rng(seed)), got {type(rng)}")
        stream, answer = self._stream(int(n), rng)
        x = np.ascontiguousarray(stream[:, :-1], dtype=np.int64)
        y = np.where(answer, stream[:, 1:], IGNORE).astype(np.int64)
        return x, y

    def roles(self, x: np.ndarray) -> np.ndarray | None:
        """int8 [n, T] roles of the positions of x (0 other, 1 unique key, 2 cluster key, 3 query), or None when
        the task defines none (only ``hijack`` does)."""
        return None

    def replace(self, **changes) -> "Task":
        """A copy with some parameters changed (checked again)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def tiny(cls) -> "Task":
        """The task at the tiny sizes its docstring example uses."""
        return cls(**cls.tiny_params)

    def params(self) -> dict:
        """{parameter: value} of this instance (None values included)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def example(self, rng_seed: int = 0) -> str:
        """One sequence drawn with ``np.random.default_rng(rng_seed)``, printed as two aligned rows: ``x`` the
        input tokens and ``y`` the target under each input (``-`` where the target is ignored). The first line
        names the task, its parameters and its chance accuracy. ``type(task).tiny().example()`` is the docstring's
        example."""
        x, y = self.sample(1, np.random.default_rng(rng_seed))
        xs = [self.token_name(int(t)) for t in x[0]]
        ys = ["-" if t == IGNORE else self.token_name(int(t)) for t in y[0]]
        width = [max(len(a), len(b)) for a, b in zip(xs, ys)]
        row = lambda label, cells: (label + " " + " ".join(c.ljust(w) for c, w in zip(cells, width))).rstrip()
        args = ", ".join(f"{k}={v!r}" for k, v in self.params().items())
        return "\n".join([f"{self.name}({args}); chance {self.chance_accuracy():.4f}", row("x", xs), row("y", ys)])
