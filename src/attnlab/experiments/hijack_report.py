"""The hijack sweep of a comparison on ``task:hijack`` or ``task:hijack-v2``: accuracy and attention mass against
the cluster size m.

Every hijack run logs, at each evaluation, ``hijack/<cell>/accuracy``, ``/unique`` and ``/cluster``
(:class:`attnlab.train.hooks.HijackSweepHook`: the accuracy at the hijack query on fixed sequences with exactly m
cluster copies, and the retrieval head's attention mass on the unique binding and on the cluster); a cell is
``m<m>`` for hijack and ``<kind>-m<m>`` for hijack-v2 (kind: exact, synonym or mediocre clusters). This module
reads the last evaluation of every finished run and gives, per variant and cell,

    accuracy      mean ± std over seeds (%), Welch's test against the baseline and Holm's adjustment over every
                  such test of the comparison
    unique mass   mean ± std of the retrieval head's mass on the unique binding
    cluster mass  mean ± std of its mass on the m cluster bindings

as Markdown tables and two plots (accuracy against m, masses against m; a line per variant, a ±1 std band).
The magnitude write-up's hypothesis predicts that as m grows the softmax forms lose accuracy and mass to the cluster while the
magnitude forms keep both (docs/studies/capability-hijack-v1.md).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..rundir import HIJACK_ACCURACY_FILE as ACCURACY_FILE
from ..rundir import HIJACK_MASS_FILE as MASS_FILE
from .stats import describe, holm, mean_std_text, welch_ttest

__all__ = ["cell_key", "hijack_protocol", "hijack_results", "hijack_summary", "hijack_tables", "plot_hijack"]

_KEY = re.compile(r"^hijack/(?:([a-z]+)-)?m(\d+)/(accuracy|unique|cluster)$")
MASSES = ("unique", "cluster")  # the retrieval head's mass on the unique binding, on the cluster
STATS = ("accuracy", *MASSES)
KINDS = ("", "exact", "synonym", "mediocre")  # hijack's cells have no kind; hijack-v2's name the cluster's kind
KIND_TITLES = {"": "", "exact": " (exact clusters: one token repeated)",
               "synonym": " (near-synonym clusters: each copy its own spelling)",
               "mediocre": " (mediocre clusters: synonyms against a target spelled as the query)"}


def cell_key(kind: str, m: int) -> str:
    """The key of a sweep cell in the results: ``"16"`` for hijack's m = 16, ``"exact-16"`` for hijack-v2's."""
    return f"{kind}-{m}" if kind else str(m)


def _metric(kind: str, m: int, stat: str) -> str:
    return f"hijack/{kind + '-' if kind else ''}m{m}/{stat}"


def hijack_results(records, variants: list[str]) -> dict | None:
    """{"baseline", "ms", "kinds", "cells": [(kind, m)], "variants": [{"variant", "n", "m": {cell key: {stat:
    summary, "welch": ..., "p_holm": ...}}}]} from the usable runs' last ``hijack/`` diagnostics; None when no run
    logged any. The first variant is the baseline; Holm's adjustment runs over every (variant, cell) accuracy test
    against it."""
    found = {(k.group(1) or "", int(k.group(2))) for r in records for d in r.diagnostics if (k := _KEY.match(d))}
    if not found:
        return None
    cells = sorted(found, key=lambda c: (KINDS.index(c[0]) if c[0] in KINDS else len(KINDS), c[1]))
    values = {v: {(c, s): [r.diagnostics[_metric(*c, s)] for r in records if r.variant == v and r.usable
                           and _metric(*c, s) in r.diagnostics] for c in cells for s in STATS} for v in variants}
    base = variants[0]
    rows, tests = [], []
    for v in variants:
        per_cell = {}
        for c in cells:
            cell = {s: describe(values[v][c, s]).to_dict() for s in STATS}
            cell["welch"] = None if v == base else welch_ttest(values[v][c, "accuracy"],
                                                               values[base][c, "accuracy"]).to_dict()
            if cell["welch"] is not None:
                tests.append(cell)
            per_cell[cell_key(*c)] = cell
        rows.append({"variant": v, "n": len(values[v][cells[0], "accuracy"]), "m": per_cell})
    for cell, adjusted in zip(tests, holm([c["welch"]["p"] for c in tests])):
        cell["p_holm"] = adjusted
    kinds = list(dict.fromkeys(kind for kind, _ in cells))
    return {"baseline": base, "ms": sorted({m for _, m in cells}), "kinds": kinds, "cells": [list(c) for c in cells],
            "n_tests": len([c for c in tests if c["welch"]["p"] is not None]), "variants": rows}


def _pct(d: dict) -> str:
    if d["mean"] is None:
        return "n/a"
    return f"{100 * d['mean']:.1f}" + ("" if d["std"] is None else f" ± {100 * d['std']:.1f}")


def _accuracy_cell(cell: dict) -> str:
    """"mean ± std" in %, and Welch's p against the baseline (with Holm's adjustment where computed)."""
    p = None if cell["welch"] is None else cell["welch"]["p"]
    holm_p = cell.get("p_holm")
    return _pct(cell["accuracy"]) + ("" if p is None else f" (p {p:.2g}" + (
        "" if holm_p is None else f"; Holm {holm_p:.2g}") + ")")


def _cells_of(hijack: dict, kind: str) -> list[int]:
    return [m for k, m in hijack.get("cells", [("", m) for m in hijack["ms"]]) if k == kind]


def hijack_tables(hijack: dict, heading: str = "##") -> list[str]:
    """Markdown: accuracy at the hijack query per variant and cell (with Welch's p against the baseline and Holm's
    adjustment over the family), a table per kind of cluster; then the retrieval head's mass on the unique binding
    and on the cluster."""
    base, lines = hijack["baseline"], []
    for kind in hijack.get("kinds", [""]):
        ms = _cells_of(hijack, kind)
        lines += [f"{heading} Hijack sweep: accuracy at the hijack query against the cluster size m{KIND_TITLES[kind]}",
                  "", "Exact match at the final query on fixed sequences with exactly m cluster copies (the same "
                  f"sequences for every run), in %: mean ± std over seeds, and Welch's p against {base} at the same m"
                  f"; Holm's adjustment over all {hijack.get('n_tests', 0)} such tests of the comparison.", "",
                  "| variant | seeds | " + " | ".join(f"m = {m}" for m in ms) + " |", "|---|---" + "|---" * len(ms) + "|"]
        for row in hijack["variants"]:
            cells = [_accuracy_cell(row["m"][cell_key(kind, m)]) for m in ms]
            lines.append(f"| {row['variant']} | {row['n']} | " + " | ".join(cells) + " |")
        lines.append("")
    kind = hijack.get("kinds", [""])[0]
    ms = _cells_of(hijack, kind)
    lines += [f"{heading} Hijack sweep: where the retrieval head looks{KIND_TITLES[kind]}", "",
              "The retrieval head is the (layer, head) with the most attention mass on the unique binding (its key "
              "and value tokens) at the smallest m; its mass at the hijack query on the unique binding / on the m "
              "cluster bindings, mean ± std over seeds. A value gate scales the values after these weights and is "
              "not in them; a logit prior is.", "",
              "| variant | " + " | ".join(f"m = {m}: unique / cluster" for m in ms) + " |",
              "|---" + "|---" * len(ms) + "|"]
    for row in hijack["variants"]:
        cells = [" / ".join(mean_std_text(row["m"][cell_key(kind, m)][stat], ".3f") for stat in MASSES) for m in ms]
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def hijack_summary(parts: list[tuple[str, dict]]) -> str:
    """One Markdown table over the parts of a hijack experiment, ``[(part name, its report results)]``: per variant
    (the baseline once, from the first part) its part, the accuracy at the hijack query at each m > 0 (mean ± std
    over seeds, Welch's p against the baseline of its own part) and its tokens/s over that baseline's (each part's
    runs shared the machine with each other, not with the other parts' runs)."""
    ms = [m for m in parts[0][1]["hijack"]["ms"] if m > 0]
    lines = ["| variant | part | " + " | ".join(f"m = {m}" for m in ms) + " | tokens/s vs baseline |",
             "|---|---" + "|---" * len(ms) + "|---|"]
    seen = set()
    for name, results in parts:
        hijack = results["hijack"]
        speed = {v["variant"]: v["tokens_per_s_mean"] for v in results["variants"]}
        for row in hijack["variants"]:
            if row["variant"] in seen:
                continue
            seen.add(row["variant"])
            cells = [_accuracy_cell(row["m"][str(m)]) for m in ms]
            ratio = speed.get(row["variant"]), speed.get(hijack["baseline"])
            ratio = "n/a" if None in ratio else f"{ratio[0] / ratio[1]:.2f}x"
            lines.append(f"| {row['variant']} | {name} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines) + "\n"


def hijack_protocol(fixed: tuple[str, list], mixed: list[tuple[str, list]]) -> str:
    """One Markdown table that checks one training protocol against another, e.g. a fixed cluster size against m
    drawn per sequence: ``fixed`` and each of ``mixed`` are (experiment name, its run records). Per variant of
    ``fixed``, up to three rows of accuracy at the hijack query at every m (in %): its ``fixed`` runs, the runs of the
    ``mixed`` part that trained that variant with the same seeds, and all that part's seeds (mean ± std) when it
    has more; "not run" and "n/a" where no part trained the variant or a run logged no sweep."""
    def runs(records, variant, seeds=None):
        return [r for r in records if r.variant == variant and r.usable and (seeds is None or r.seed in seeds)]

    def cell(rs, m):
        return _pct(describe([r.diagnostics[f"hijack/m{m}/accuracy"] for r in rs
                              if f"hijack/m{m}/accuracy" in r.diagnostics]).to_dict())

    name, records = fixed
    ms = sorted({int(k.group(2)) for r in records for d in r.diagnostics if (k := _KEY.match(d)) and not k.group(1)})
    lines = ["| variant | trained as | seeds | " + " | ".join(f"m = {m}" for m in ms) + " |",
             "|---|---|---" + "|---" * len(ms) + "|"]
    for variant in dict.fromkeys(r.variant for r in records):
        own = runs(records, variant)
        seeds = sorted(r.seed for r in own)
        part, other = next(((n, rs) for n, rs in mixed if runs(rs, variant)), (None, []))
        same, every = runs(other, variant, set(seeds)), runs(other, variant)
        rows = [(name, own), (part, same)] + ([(part, every)] if len(every) > len(same) else [])
        for i, (label, rs) in enumerate(rows):
            seed_text = ", ".join(str(r.seed) for r in sorted(rs, key=lambda r: r.seed)) or "none"
            lines.append(f"| {variant if i == 0 else ''} | {label or 'not run'} | {seed_text} | "
                         + " | ".join(cell(rs, m) for m in ms) + " |")
    return "\n".join(lines) + "\n"


def band_line(ax, xs, cells, label, **style):
    """A mean line and a ±1 std band, in % (cells hold fractions), the band clipped to 0-100%."""
    pts = [(x, 100 * c["mean"], None if c["std"] is None else 100 * c["std"]) for x, c in zip(xs, cells)
           if c["mean"] is not None]
    if not pts:
        return
    x, mean, std = zip(*pts)
    (line,) = ax.plot(x, mean, marker="o", markersize=3, label=label, **style)
    if all(s is not None for s in std):
        ax.fill_between(x, [max(a - b, 0.0) for a, b in zip(mean, std)], [min(a + b, 100.0) for a, b in zip(mean, std)],
                        color=line.get_color(), alpha=0.15, linewidth=0)


def plot_hijack(hijack: dict, out_dir, key: str | None = None) -> list[Path]:
    """hijack_accuracy.png (accuracy against m) and hijack_mass.png (unique and cluster mass against m), in %, a
    line per variant with a ±1 std band, a row of panels per kind of cluster; m on a symmetric-log axis so that 0
    shows; the legend beside the panels. With ``key`` (:func:`.figures.inputs_key`), a current PNG is left alone.
    Returns the paths (written or current)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .figures import is_current, save_figure

    kinds, out_dir, paths = hijack.get("kinds", [""]), Path(out_dir), []
    for name, stats in ((ACCURACY_FILE, ("accuracy",)), (MASS_FILE, MASSES)):
        paths.append(out_dir / name)
        if is_current(out_dir / name, key):
            continue
        width = 7.5 if len(stats) == 1 else 12
        fig = Figure(figsize=(width, 4.5 * len(kinds)), dpi=120)
        FigureCanvasAgg(fig)
        legend = None
        for i, kind in enumerate(kinds):
            ms = _cells_of(hijack, kind)
            for k, stat in enumerate(stats):
                ax = fig.add_subplot(len(kinds), len(stats), i * len(stats) + k + 1)
                for row in hijack["variants"]:
                    band_line(ax, ms, [row["m"][cell_key(kind, m)][stat] for m in ms], f"{row['variant']} (n={row['n']})",
                          linestyle="--" if "logits" in row["variant"] else "-")
                ax.set_xscale("symlog", linthresh=1)
                ax.set_xticks(ms, [str(m) for m in ms])
                ax.set_xlabel(f"cluster size m{' (' + kind + ')' if kind else ' (copies of the target key)'}")
                ax.set_ylabel({"accuracy": "accuracy at the hijack query (%)",
                               "unique": "mass on the unique binding (%)",
                               "cluster": "mass on the cluster (%)"}[stat])
                ax.set_ylim(-2, 102)
                ax.grid(alpha=0.3)
                if k == len(stats) - 1 and i == 0:
                    legend = ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)
        fig.suptitle("hijack: mean ± 1 std over seeds" + ("" if len(stats) == 1 else "; the retrieval head's "
                                                          "attention mass at the hijack query"))
        save_figure(fig, out_dir / name, key, bbox_inches="tight", bbox_extra_artists=[legend] if legend else None)
    return paths
