"""Training: :func:`train` a :class:`RunConfig` into a run directory; :func:`load_run` / :func:`sample` read it back.

See :mod:`attnlab.train.trainer` for the run-directory layout, :mod:`attnlab.train.checkpoint` for the atomic
checkpoint format, :mod:`attnlab.train.optim` for AdamW groups and the learning-rate schedule and
:mod:`attnlab.train.flops` for the MFU estimate.
"""

from .checkpoint import find_checkpoint, load_checkpoint, save_checkpoint
from .config import DEVICES, DTYPES, RunConfig, TrainConfig
from .flops import flops_per_token, matmul_params, matmul_peak_gflops, mfu
from .optim import lr_at, make_optimizer, param_groups, split_params
from ..rundir import read_metrics
from .plots import plot_losses
from .trainer import TrainingDiverged, generate_text, load_model, load_run, sample, train

__all__ = [
    "DEVICES",
    "DTYPES",
    "RunConfig",
    "TrainConfig",
    "TrainingDiverged",
    "find_checkpoint",
    "flops_per_token",
    "generate_text",
    "load_checkpoint",
    "load_model",
    "load_run",
    "lr_at",
    "make_optimizer",
    "matmul_params",
    "matmul_peak_gflops",
    "mfu",
    "param_groups",
    "plot_losses",
    "read_metrics",
    "sample",
    "save_checkpoint",
    "split_params",
    "train",
]
