"""Length extrapolation in a comparison: the task's answer accuracy at the training length T and at longer lengths.

Runs trained with ``train.eval_lengths`` log ``length/<L>/accuracy`` at every evaluation
(:class:`attnlab.train.hooks.LengthHook`: the same task with seq_len = L on fixed sequences, read by the trained
parameters). This module reads the last evaluation of every usable run (where it met its threshold, or at the cap)
and gives, per variant and length,

    accuracy   mean ± std over seeds (%), and against the baseline the paired difference over the seeds both
               finished (seed i of both saw the same data and initialisation draws): Student's paired t-test, with
               Holm's adjustment over every (variant, length) test of the comparison

with T's column the run's own validation accuracy, as a Markdown table and a plot of accuracy against the length (a
line per variant, a ±1 std band). A mechanism that keeps its accuracy as L grows resists the dilution that a longer
context brings; one that drops does not, at the length where it drops.
"""

from __future__ import annotations

import re
from pathlib import Path

from ..rundir import LENGTH_ACCURACY_FILE
from .stats import describe, holm, paired_ttest

__all__ = ["length_plot_link", "length_results", "length_table", "plot_lengths", "train_length"]

_KEY = re.compile(r"^length/(\d+)/accuracy$")


def _values(records, variant: str, length: int | None) -> dict[int, float]:
    """{seed: accuracy} of the variant's usable runs at ``length`` (None: the run's own validation accuracy)."""
    out = {}
    for r in records:
        if r.variant != variant or not r.usable:
            continue
        value = r.final_val_accuracy if length is None else r.diagnostics.get(f"length/{length}/accuracy")
        if value is not None:
            out[r.seed] = value
    return out


def train_length(spec: dict) -> int | None:
    """The task's sequence length T in a comparison's spec (compare.toml; None on text)."""
    from ..data.task_source import task_name
    from ..tasks import get_task

    data = spec["base"].get("data", {})
    name = task_name(data.get("source", ""))
    return None if name is None else get_task(name, data.get("task") or {}).seq_len


def length_results(records, variants: list[str], spec: dict) -> dict | None:
    """{"baseline", "train_length", "lengths", "n_tests", "variants": [{"variant", "n", "at": {L: {"accuracy":
    summary, "paired": test or None, "difference": mean paired difference or None, "p_holm"}}}]} from the usable
    runs' last ``length/`` diagnostics (L = "T" for the training length); None when no run logged any."""
    lengths = sorted({int(k.group(1)) for r in records for d in r.diagnostics if (k := _KEY.match(d))})
    if not lengths:
        return None
    base, rows, tests = variants[0], [], []
    for v in variants:
        at = {}
        for length in [None, *lengths]:
            mine, theirs = _values(records, v, length), _values(records, base, length)
            cell = {"accuracy": describe(list(mine.values())).to_dict(), "paired": None, "difference": None}
            shared = sorted(mine.keys() & theirs.keys())
            if v != base and len(shared) >= 2:
                a, b = [mine[s] for s in shared], [theirs[s] for s in shared]
                cell["paired"] = {"n": len(shared), **paired_ttest(a, b).to_dict()}
                cell["difference"] = sum(x - y for x, y in zip(a, b)) / len(shared)
                tests.append(cell)
            at["T" if length is None else str(length)] = cell
        rows.append({"variant": v, "n": at["T"]["accuracy"]["n"], "at": at})
    for cell, adjusted in zip(tests, holm([c["paired"]["p"] for c in tests])):
        cell["p_holm"] = adjusted
    return {"baseline": base, "train_length": train_length(spec), "lengths": lengths,
            "n_tests": sum(c["paired"]["p"] is not None for c in tests), "variants": rows}


def _pct(d: dict) -> str:
    if d["mean"] is None:
        return "n/a"
    return f"{100 * d['mean']:.1f}" + ("" if d["std"] is None else f" ± {100 * d['std']:.1f}")


def _cell(cell: dict) -> str:
    text = _pct(cell["accuracy"])
    test = cell["paired"]
    if test is None:
        return text
    p = test["p"]
    diff = f"{100 * cell['difference']:+.1f}"
    return f"{text} ({diff}; " + ("p n/a" if p is None else f"p {p:.2g}; Holm {cell['p_holm']:.2g}") + ")"


def length_table(length: dict, heading: str = "##") -> list[str]:
    """Markdown: accuracy per variant at the training length and at each longer one, with the paired difference
    against the baseline in points, its p and Holm's adjustment over the family."""
    base, t = length["baseline"], length["train_length"]
    cols = ["T" if t is None else f"T = {t}"] + [f"L = {n}" for n in length["lengths"]]
    return [f"{heading} Length extrapolation: accuracy at longer lengths", "",
            "Answer accuracy (%) at each run's last evaluation, mean ± std over seeds: at the training length (the "
            "validation accuracy) and on fixed sequences of the same task at each longer length L. In brackets the "
            f"mean paired difference from {base} over the seeds both finished, in points, Student's paired p, and "
            f"Holm's adjustment over all {length['n_tests']} such tests of the comparison.", "",
            "| variant | seeds | " + " | ".join(cols) + " |", "|---|---" + "|---" * len(cols) + "|",
            *(f"| {row['variant']} | {row['n']} | " + " | ".join(_cell(c) for c in row["at"].values()) + " |"
              for row in length["variants"]), ""]


def length_plot_link(length: dict | None) -> list[str]:
    """The report's Markdown lines that show the plot (none without length results)."""
    return ["", "## Length extrapolation plot", "", f"![accuracy against the length]({LENGTH_ACCURACY_FILE})"] \
        if length else []


def plot_lengths(length: dict | None, out_dir) -> Path | None:
    """length_accuracy.png in ``out_dir``: accuracy (%) against the sequence length, a line per variant with a ±1 std
    band, the length on a log2 axis; drawn only when missing or stale (its own key, :func:`.figures.inputs_key`).
    Without length results, a stale PNG is removed and None returned."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .figures import inputs_key, is_current, save_figure
    from .hijack_report import band_line

    path = Path(out_dir) / LENGTH_ACCURACY_FILE
    if not length:
        path.unlink(missing_ok=True)  # a stale plot would contradict the report
        return None
    key = inputs_key(length, drawn_by=(plot_lengths, band_line))
    if is_current(path, key):
        return path
    t = length["train_length"]
    xs = [t] + length["lengths"] if t is not None else length["lengths"]
    fig = Figure(figsize=(7.5, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for row in length["variants"]:
        cells = [c["accuracy"] for name, c in row["at"].items() if t is not None or name != "T"]
        band_line(ax, xs, cells, f"{row['variant']} (n={row['n']})")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("sequence length" + ("" if t is None else f" (trained at {t})"))
    ax.set_ylabel("answer accuracy (%)")
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    legend = ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
    fig.suptitle("length extrapolation: mean ± 1 std over seeds")
    save_figure(fig, path, key, bbox_inches="tight", bbox_extra_artists=[legend])
    return path
