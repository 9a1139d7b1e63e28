"""``attnlab sweep KEY=V1,V2,...``: one comparison per value of a setting, and the best value per variant.

Papers tune a setting per architecture and report the best run (Zoology, arXiv:2312.04927, sweeps the learning rate
and plots the best of the sweep for each model); a fair comparison does the same for every variant. A sweep runs
:func:`attnlab.experiments.compare.compare` once per value, each an ordinary (resumable) comparison directory::

    out_dir/<KEY>=<value>/    compare.toml, <variant>/seed<k>/, report.md, results.json
    out_dir/sweep.md          per variant and value: the metric (mean ± std over seeds); the best value per variant
    out_dir/sweep.json        the same numbers

The metric is the comparison's primary metric when one is declared, else the final validation accuracy on a task
and the final validation loss on text. The best value is the one with the best mean (highest accuracy, lowest
loss); with few seeds, neighbouring values within a standard deviation of it are as good, which the table shows.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import write_text
from ..configio import apply_overrides
from ..errors import ConfigError
from .compare import compare
from .report import collect_runs, load_spec
from .stats import describe
from .verdict import better, metric_value

__all__ = ["parse_sweep", "sweep", "sweep_results", "sweep_table"]


def parse_sweep(text: str) -> tuple[str, list[str]]:
    """``"train.lr=1e-3,3e-3"`` -> ("train.lr", ["1e-3", "3e-3"]); a one-line ConfigError otherwise."""
    key, sep, values = text.partition("=") if isinstance(text, str) else ("", "", "")
    items = [v.strip() for v in values.split(",")]
    if not sep or not key.strip() or not all(items) or len(items) < 2 or len(set(items)) < len(items):
        raise ConfigError(f"--set {text!r}: write KEY=V1,V2,... with a dotted config key and two or more distinct "
                          f"values, e.g. train.lr=1e-3,3e-3,1e-2")
    return key.strip(), items


def _value_dir(out_dir: Path, key: str, value: str) -> Path:
    return out_dir / f"{key}={value}"


def sweep(base, key: str, values: list[str], variants: list[str], seeds: list[int], out_dir, *, primary=None,
          jobs: int = 1, threads=None, quiet: bool = False, train_fn=None) -> Path:
    """Run one comparison of ``variants`` x ``seeds`` per value of ``key`` (``base`` with ``key=value``), then
    write sweep.md and sweep.json in ``out_dir``; returns sweep.md. Each value's config is checked before any run
    starts, so a bad value fails at once."""
    out_dir = Path(out_dir)
    configs = [(value, apply_overrides(base, [f"{key}={value}"])) for value in values]
    for value, cfg in configs:
        compare(cfg, variants, seeds, _value_dir(out_dir, key, value), primary=primary, jobs=jobs, threads=threads,
                quiet=quiet, train_fn=train_fn)
    results = sweep_results(out_dir, key, values)
    write_text(out_dir / "sweep.json", json.dumps(results, indent=2) + "\n")
    path = out_dir / "sweep.md"
    write_text(path, sweep_table(results))
    return path


def sweep_results(out_dir, key: str, values: list[str]) -> dict:
    """{"key", "values", "metric", "better", "variants": [{"variant", "by_value": {value: Summary dict},
    "best": value | None}]} from the comparison directories on disk."""
    out_dir = Path(out_dir)
    specs = {v: load_spec(_value_dir(out_dir, key, v)) for v in values}
    first = specs[values[0]]
    metric = first.get("primary")
    records = {v: collect_runs(_value_dir(out_dir, key, v), spec["variants"], spec["seeds"])
               for v, spec in specs.items()}
    if metric is None:
        task = str(first["base"].get("data", {}).get("source", "")).startswith("task:")
        metric = "val_accuracy" if task else "val_loss"
    direction = better(metric)
    rows = []
    for variant in first["variants"]:
        by_value = {}
        for value in values:
            runs = [r for r in records[value] if r.variant == variant and r.usable]
            by_value[value] = describe([x for r in runs if (x := metric_value(r, metric)) is not None]).to_dict()
        means = {v: s["mean"] for v, s in by_value.items() if s["mean"] is not None}
        best = (max if direction == "higher" else min)(means, key=means.get) if means else None
        rows.append({"variant": variant, "by_value": by_value, "best": best})
    return {"key": key, "values": list(values), "metric": metric, "better": direction, "variants": rows}


def sweep_table(results: dict) -> str:
    """sweep.md: the metric per variant and value (mean ± std over finished seeds, the best value in bold), then
    the best value of each variant."""
    key, values, metric = results["key"], results["values"], results["metric"]
    pct = "accuracy" in metric
    fmt = (lambda x: f"{100 * x:.2f}") if pct else (lambda x: f"{x:.4f}")
    lines = [f"# Sweep of {key}", "", f"{metric}{' (%)' if pct else ''}, {results['better']} is better: mean ± std "
             "over the finished seeds of each comparison; the best mean of each variant in bold.", "",
             "| variant | " + " | ".join(f"{key}={v}" for v in values) + " | best |",
             "|---|" + "---|" * (len(values) + 1)]
    for row in results["variants"]:
        cells = []
        for value in values:
            s = row["by_value"][value]
            text = "n/a" if s["mean"] is None else fmt(s["mean"]) + ("" if s["std"] is None else f" ± {fmt(s['std'])}")
            text += f" (n={s['n']})"
            cells.append(f"**{text}**" if value == row["best"] else text)
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + f" | {row['best'] or 'n/a'} |")
    return "\n".join(lines) + "\n"

