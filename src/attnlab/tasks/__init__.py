"""Synthetic tasks: seeded, deterministic generators of token sequences with an answer mask.

Each task is a frozen dataclass whose fields are its parameters (each checked, with a one-line
:class:`~attnlab.errors.ConfigError` naming ``data.task.<field>``, the bad value and the allowed range). A task
draws ``x, y = task.sample(n, rng)``: int64 [n, T] inputs and next-token targets, with ``y = -1`` (the model's
``ignore_index``) everywhere except the answer positions, so the loss and the accuracy count only the answers.
Accuracy is exact match per answer position (argmax == target), averaged over the answer positions;
``task.chance_accuracy()`` is what a model that ignores the context reaches.

=================  ==========================================================================================
``mqar``           multi-query associative recall (Zoology, arXiv:2312.04927)
``induction``      a random sequence repeated; the second copy is scored (Olsson et al. 2022, arXiv:2209.11895)
``selective-copy`` copy the symbols scattered among blanks (MAD, arXiv:2403.17844)
``noisy-recall``   recall in a stream of pairs with noise tokens between them (MAD, arXiv:2403.17844)
``hijack``         recall a marked binding against m unmarked copies of its key (the magnitude write-up, docs/sources.md#magnitude-attention)
``hijack-v2``      the same with unmarked bindings in training, exact or near-synonym clusters, distinct filler
=================  ==========================================================================================

Pure numpy; imports only :mod:`attnlab.errors`.
"""

from __future__ import annotations

import dataclasses

from ..errors import unknown_name
from .base import IGNORE, Task
from .copying import Induction, SelectiveCopy
from .hijack import Hijack
from .hijack_v2 import HijackV2
from .recall import MQAR, NoisyRecall

TASKS: dict[str, type] = {cls.name: cls for cls in (MQAR, Induction, SelectiveCopy, NoisyRecall, Hijack, HijackV2)}
"""The registry: task name -> task class, in a stable order."""


def task_names() -> list[str]:
    """The registered task names, in registry order."""
    return list(TASKS)


def get_task(name: str, params: dict | None = None) -> Task:
    """The task ``name`` with ``params`` (a dict of its fields; missing ones take their defaults).

    An unknown name or parameter, or a value out of range, raises a one-line ConfigError.
    """
    if name not in TASKS:
        raise unknown_name("task", name, TASKS)
    cls = TASKS[name]
    params = dict(params or {})
    fields = [f.name for f in dataclasses.fields(cls)]
    for key in params:
        if key not in fields:
            raise unknown_name(f"{name} parameter", key, fields)
    return cls(**params)


__all__ = ["TASKS", "task_names", "get_task", "Task", "IGNORE", "MQAR", "Induction", "SelectiveCopy",
           "NoisyRecall", "Hijack", "HijackV2"]
