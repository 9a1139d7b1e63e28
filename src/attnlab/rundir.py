"""The files of a run directory and of a comparison directory, and their readers: one home for the contract that
the trainer writes and compare, report and the rank sweep read.

A run directory (``attnlab train``)::

    config.toml       the resolved RunConfig            tokenizer.json    the run's tokenizer
    metrics.jsonl     one JSON row per logged step      summary.json      final numbers and status
    checkpoint/       weights + training state          loss.png          samples.txt
    .lock             one writer at a time (attnlab.lock)

A comparison directory (``attnlab compare``): ``compare.toml`` (the grid), ``<variant>/seed<k>/`` run
directories, ``logs/``, and the report's ``report.md``, ``results.json``, ``loss_curves.png`` (and on task:hijack
``hijack_accuracy.png``, ``hijack_mass.png``). A rank sweep
(``attnlab rank-sweep``): ``sweep.toml`` and ``wd<lambda>/seed<k>/`` run directories.

Readers never raise on a run that is still being written: a missing or half-written file reads as nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

CONFIG_FILE = "config.toml"
TOKENIZER_FILE = "tokenizer.json"
METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "summary.json"
SAMPLES_FILE = "samples.txt"
PLOT_FILE = "loss.png"
CHECKPOINT_DIR = "checkpoint"
RUN_MARKERS = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE, CHECKPOINT_DIR)  # any of them: a run lives here
SHIPPED_RUN_FILES = (CONFIG_FILE, METRICS_FILE, SUMMARY_FILE)  # what `attnlab report --export` copies
SHIPPED_RUN_GLOBS = ("swap-*.json",)  # and these, when a run has them (attnlab swap: evaluations with another attention)
DONE_STATUSES = ("finished", "diverged")  # summary.json statuses of a run that is over (kept, never retrained)

COMPARE_SPEC_FILE = "compare.toml"
SWEEP_SPEC_FILE = "sweep.toml"
LOGS_DIR = "logs"
REPORT_FILE = "report.md"
RESULTS_FILE = "results.json"
CURVES_FILE = "loss_curves.png"
DELTA_CURVES_FILE = "loss_delta.png"  # each variant's loss minus the baseline's, ±1 standard error
ACCURACY_CURVES_FILE = "accuracy_curves.png"  # runs that logged val_accuracy (a task): accuracy against steps
HIJACK_ACCURACY_FILE = "hijack_accuracy.png"  # a comparison on task:hijack: accuracy against the cluster size m
HIJACK_MASS_FILE = "hijack_mass.png"  # and the retrieval head's attention mass against m
LENGTH_ACCURACY_FILE = "length_accuracy.png"  # runs with train.eval_lengths: accuracy against the sequence length

__all__ = [
    "CONFIG_FILE", "TOKENIZER_FILE", "METRICS_FILE", "SUMMARY_FILE", "SAMPLES_FILE", "PLOT_FILE", "CHECKPOINT_DIR",
    "RUN_MARKERS", "SHIPPED_RUN_FILES", "SHIPPED_RUN_GLOBS", "DONE_STATUSES", "COMPARE_SPEC_FILE", "SWEEP_SPEC_FILE", "LOGS_DIR", "REPORT_FILE",
    "RESULTS_FILE", "CURVES_FILE", "ACCURACY_CURVES_FILE", "HIJACK_ACCURACY_FILE", "HIJACK_MASS_FILE", "LENGTH_ACCURACY_FILE",
    "comparison_run_dir", "sweep_run_dir", "read_metrics", "read_summary",
]


def comparison_run_dir(out_dir, variant: str, seed: int) -> Path:
    """The run directory of (variant, seed) inside a comparison: ``out_dir/<variant>/seed<k>``."""
    return Path(out_dir) / variant / f"seed{seed}"


def sweep_run_dir(out_dir, weight_decay: float, seed: int) -> Path:
    """The run directory of (weight decay lambda, seed) inside a rank sweep: ``out_dir/wd<lambda>/seed<k>``
    (wd0/seed0, wd0.1/seed0, wd1/seed3)."""
    return Path(out_dir) / f"wd{weight_decay:g}" / f"seed{seed}"


def read_metrics(path: str | Path) -> list[dict]:
    """The rows of a run's metrics.jsonl (``path`` is the run directory or the file itself).

    Rows that do not parse, or have no integer step (a half-written last line of a killed run), are skipped.
    """
    path = Path(path)
    if path.is_dir():
        path = path / METRICS_FILE
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    rows = []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int) and not isinstance(row["step"], bool):
            rows.append(row)
    return rows


def read_summary(run_dir: str | Path) -> dict | None:
    """``run_dir/summary.json`` as a dict, or None when it is missing or unreadable (a run killed mid-write)."""
    try:
        data = json.loads((Path(run_dir) / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
