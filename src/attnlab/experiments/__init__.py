"""Experiments built on the trainer: :func:`compare` (attention variants x seeds, with a statistical report).

* :mod:`.catalog` — named comparisons shipped as TOML (``attnlab compare --experiment NAME``).
* :mod:`.grid` — run the grid of (variant, seed) training runs, resumably.
* :mod:`.stats` — mean, sample std and Welch's t-test (Welch 1947; Satterthwaite 1946).
* :mod:`.report` — report.md, results.json and loss_curves.png from the run directories on disk.
* :mod:`.sweep` — the weight-decay sweep: pseudo-rank and validation loss per lambda (``attnlab rank-sweep``).

Names load on first use (:mod:`attnlab.lazy`), so listing the catalog does not import the trainer.
"""

from ..lazy import lazy_exports

_HOMES = {"Experiment": ".catalog", "experiment_names": ".catalog", "load_experiment": ".catalog",
          **dict.fromkeys(("compare", "run_config", "run_dir", "run_state"), ".grid"),
          "write_report": ".report",
          **dict.fromkeys(("Summary", "WelchResult", "describe", "welch_ttest"), ".stats")}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
