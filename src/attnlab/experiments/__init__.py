"""Experiments built on the trainer: :func:`compare` (attention variants x seeds, with a statistical report).

* :mod:`.catalog` — named comparisons shipped as TOML (``attnlab compare --experiment NAME``).
* :mod:`.compare` — run the grid of (variant, seed) training runs, resumably.
* :mod:`.stats` — mean, sample std and Welch's t-test (Welch 1947; Satterthwaite 1946).
* :mod:`.report` — report.md, results.json and loss_curves.png from the run directories on disk.
* :mod:`.sweep` — the weight-decay sweep: pseudo-rank and validation loss per lambda (``attnlab rank-sweep``).
"""

from .catalog import Experiment, experiment_names, load_experiment
from .compare import compare, run_config, run_dir, run_state
from .report import write_report
from .stats import Summary, WelchResult, describe, welch_ttest

__all__ = [
    "Experiment",
    "experiment_names",
    "load_experiment",
    "Summary",
    "WelchResult",
    "compare",
    "describe",
    "run_config",
    "run_dir",
    "run_state",
    "welch_ttest",
    "write_report",
]
