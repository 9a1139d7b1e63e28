"""``attnlab sweep KEY=V1,V2,...``: one comparison per value of a setting, and the best value per variant.

Papers tune a setting per architecture and report the best run (Zoology, arXiv:2312.04927, sweeps the learning rate
and plots the best of the sweep for each model); a fair comparison does the same for every variant. A sweep runs
:func:`attnlab.experiments.grid.compare` once per value, each an ordinary (resumable) comparison directory::

    out_dir/<KEY>=<value>/    compare.toml, <variant>/seed<k>/, report.md, results.json
    out_dir/sweep.md          per variant and value: the metric (mean ± std over seeds); the best value per variant;
                              then every run: its status, steps, threshold step and metric (unfinished runs too)
    out_dir/sweep.json        the same numbers

``attnlab report OUT_DIR`` on a sweep directory rewrites sweep.md and sweep.json from what it holds now
(:func:`write_sweep_report`; the key and values are read from the ``<KEY>=<value>`` folder names).

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
from ..rundir import COMPARE_SPEC_FILE
from .grid import compare
from .report import collect_runs, load_spec
from .stats import describe
from .verdict import better, metric_value

__all__ = ["find_sweep", "parse_sweep", "sweep", "sweep_results", "sweep_table", "write_sweep_report"]


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
    return write_sweep_report(out_dir, key, values)


def find_sweep(out_dir) -> tuple[str, list[str]] | None:
    """(key, values) of a sweep directory from its ``<KEY>=<value>`` comparison folders (each with a
    compare.toml), values in numeric order where they are numbers; None when ``out_dir`` holds none."""
    folders = [d.name for d in Path(out_dir).glob("*=*") if (d / COMPARE_SPEC_FILE).is_file()]
    keys = {name.partition("=")[0] for name in folders}
    if not folders:
        return None
    if len(keys) > 1:
        raise ConfigError(f"{out_dir}: comparison folders of more than one key ({', '.join(sorted(keys))}); a sweep "
                          f"directory holds one")

    def order(value: str):
        try:
            return (0, float(value), value)
        except ValueError:
            return (1, 0.0, value)

    return keys.pop(), sorted((name.partition("=")[2] for name in folders), key=order)


def write_sweep_report(out_dir, key: str | None = None, values: list[str] | None = None) -> Path:
    """Write sweep.md and sweep.json in ``out_dir`` from the runs on disk (key and values found from the folder
    names when not given); returns sweep.md."""
    out_dir = Path(out_dir)
    if key is None or values is None:
        found = find_sweep(out_dir)
        if found is None:
            raise ConfigError(f"{out_dir}: no sweep here (no <KEY>=<value> folder with a compare.toml)")
        key, values = found
    results = sweep_results(out_dir, key, values)
    write_text(out_dir / "sweep.json", json.dumps(results, indent=2) + "\n")
    path = out_dir / "sweep.md"
    write_text(path, sweep_table(results))
    return path


def sweep_results(out_dir, key: str, values: list[str]) -> dict:
    """{"key", "values", "metric", "better", "variants": [{"variant", "by_value": {value: Summary dict},
    "best": value | None}], "runs": [{"value", "variant", "seed", "status", "steps", "threshold_step",
    "converged", "metric", "evaluated_at"}]} from the comparison directories on disk. The summaries count the finished runs; "runs"
    lists every run of every comparison, unfinished ones with their last logged step and metric."""
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
    runs = [{"value": value, "variant": r.variant, "seed": r.seed, "status": r.status,
             "steps": r.summary.get("steps"), "threshold_step": r.summary.get("threshold_step"),
             "converged": r.summary.get("converged"), "metric": metric_value(r, metric),
             "evaluated_at": max(r.curve) if r.curve else None}
            for value in values for r in records[value]]
    return {"key": key, "values": list(values), "metric": metric, "better": direction, "variants": rows,
            "runs": runs}


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
    if results.get("runs"):
        lines += ["", f"Every run: its status, its steps (the threshold step where it met its stop rule; a "
                      f"finished run at its cap without meeting it is not converged) and {metric} at its last "
                      f"evaluation (the step it was evaluated at), an unfinished run's included.", "",
                  f"| variant | {key} | seed | status | steps | {metric}{' (%)' if pct else ''} | evaluated at |",
                  "|---|---|---|---|---|---|---|"]
        for run in results["runs"]:
            status = run["status"]
            if status == "finished" and run["converged"] is False:
                status = "finished, not converged"
            elif status == "finished" and run["converged"]:
                status = "finished, met its threshold"
            elif status != "finished" and run["converged"] is not True:
                status += ", not converged"
            steps = run["threshold_step"] if run["threshold_step"] is not None else run["steps"]
            value = "n/a" if run["metric"] is None else fmt(run["metric"])
            lines.append(f"| {run['variant']} | {run['value']} | {run['seed']} | {status} | "
                         f"{'n/a' if steps is None else steps} | {value} | {run['evaluated_at'] if run['evaluated_at'] is not None else 'n/a'} |")
    return "\n".join(lines) + "\n"

