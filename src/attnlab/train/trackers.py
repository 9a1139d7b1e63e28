"""Experiment trackers beside metrics.jsonl: TensorBoard event files and Weights & Biases, both optional.

Each tracker gets the rows the trainer appends to metrics.jsonl (the scalars: losses, lr, grad norm, tokens/s
and the hooks' measurements) with their step. Resuming continues the same record: TensorBoard purges events a
previous launch logged after the checkpoint, and W&B continues the run whose id is stored in the run directory
(wandb_id.txt).
"""

from __future__ import annotations

import secrets
from pathlib import Path

from ..atomic import write_text
from ..configio import to_dict
from ..errors import ConfigError

SCALARS = ("train_loss", "val_loss", "val_accuracy", "lr", "grad_norm", "tokens_per_s")
WANDB_ID_FILE = "wandb_id.txt"


def _scalars(row: dict, prefixes: tuple[str, ...]) -> dict[str, float]:
    keys = (*SCALARS, *(key for key in row if key.startswith(prefixes))) if prefixes else SCALARS
    return {key: row[key] for key in keys if isinstance(row.get(key), (int, float)) and not isinstance(row[key], bool)}


def _import_tensorboard():
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("train.tensorboard=true needs the tensorboard package: pip install 'attnlab[tensorboard]'") \
            from None
    return SummaryWriter


def _import_wandb():
    try:
        import wandb
    except ImportError:
        raise ConfigError("train.wandb_project needs the wandb package: pip install 'attnlab[wandb]'") from None
    return wandb


class TensorBoardTracker:
    def __init__(self, run_dir: Path, first_step: int):
        writer = _import_tensorboard()  # purge_step drops events a previous launch logged after the checkpoint
        self.writer = writer(log_dir=str(run_dir / "tensorboard"), purge_step=first_step)

    def log(self, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """One W&B run per attnlab run: its id lives in RUN_DIR/wandb_id.txt, so --resume continues it."""

    def __init__(self, run_dir: Path, project: str, mode: str, config: dict, name: str):
        wandb = _import_wandb()
        id_file = run_dir / WANDB_ID_FILE
        run_id = id_file.read_text(encoding="utf-8").strip() if id_file.is_file() else secrets.token_hex(4)
        write_text(id_file, run_id + "\n")
        self.run = wandb.init(project=project, id=run_id, resume="allow", mode=mode, dir=str(run_dir),
                              config=config, name=name)

    def log(self, scalars: dict[str, float], step: int) -> None:
        self.run.log(scalars, step=step)

    def close(self) -> None:
        self.run.finish()


def check_trackers(tc) -> None:
    """Fail early (every rank alike) when a requested tracker's package is missing."""
    if tc.tensorboard:
        _import_tensorboard()
    if tc.wandb_project is not None:
        _import_wandb()


def open_trackers(cfg, run_dir: Path, first_step: int) -> list:
    """The trackers cfg.train asks for, opened in run_dir; first_step: the next step this launch logs."""
    tc, trackers = cfg.train, []
    if tc.tensorboard:
        trackers.append(TensorBoardTracker(run_dir, first_step))
    if tc.wandb_project is not None:
        trackers.append(WandbTracker(run_dir, tc.wandb_project, tc.wandb_mode, to_dict(cfg), run_dir.name))
    return trackers


def log_row(trackers: list, row: dict, prefixes: tuple[str, ...]) -> None:
    """Send a metrics.jsonl row's scalars (the hooks' ones by their prefixes) to every tracker."""
    if trackers:
        scalars = _scalars(row, prefixes)
        for tracker in trackers:
            tracker.log(scalars, row["step"])


def close_trackers(trackers: list) -> None:
    for tracker in trackers:
        tracker.close()
