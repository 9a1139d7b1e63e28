"""The comparison plots: validation loss (or accuracy) per variant with a band over seeds, and each variant's loss
minus the baseline's. Records are attnlab.experiments.report.RunRecord (variant, usable, curve, accuracy_curve, and
summary and not_converged for a stop rule's outcome)."""

from __future__ import annotations

import math
from pathlib import Path

from .figures import is_current, save_figure
from .stats import curve_summary

def _mean_band(curves: list[dict]):
    """x (tokens, else steps), mean and std (ddof=1; None for one curve) over the steps all curves share; a curve
    is {step: (tokens, loss)} or {step: value} (x is then the step)."""
    stats = curve_summary(curves)
    first = curves[0]
    xs = [first[s][0] if isinstance(first[s], tuple) and first[s][0] is not None else s for s in stats]
    return xs, [st.mean for st in stats.values()], [st.std for st in stats.values()]


ZOOM_FROM = 0.2  # the loss plots' y-range covers the points from this fraction of the x-range on


def zoomed_limits(series: list[tuple[list, list]], start: float = ZOOM_FROM, pad: float = 0.05):
    """(low, high) y-limits covering every (x, y) point whose x lies in the last 1 - start of the x-range, padded
    by ``pad`` of the span: the early, steep part of a loss curve (step 0 at ln(vocab)) must not set the y-axis and
    flatten the region where variants differ. None when no point qualifies."""
    xs = [x for xs_, _ in series for x in xs_]
    if not xs:
        return None
    cut = min(xs) + start * (max(xs) - min(xs))
    ys = [y for xs_, ys_ in series for x, y in zip(xs_, ys_) if x >= cut and y is not None and math.isfinite(y)]
    if not ys:
        return None
    low, high = min(ys), max(ys)
    margin = pad * (high - low) if high > low else max(abs(high) * 0.01, 1e-6)
    return low - margin, high + margin


def _axes():
    """A figure and its one axes (no pyplot: no global backend state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _x_label(records: list) -> str:
    """Loss curves are drawn against tokens when the runs logged them, else against steps."""
    return "tokens seen" if any(r.curve and next(iter(r.curve.values()))[0] is not None for r in records) else "step"


def _save(fig, ax, path, key: str | None) -> Path:
    """The legend goes beside the axes, where it cannot cover a curve; the PNG carries ``key``
    (:mod:`.figures`)."""
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    return save_figure(fig, path, key, bbox_inches="tight")


def _not_converged(runs: list) -> str:
    """", k not converged" for runs with a stop rule that hit their cap without meeting it (else "")."""
    k = sum(r.not_converged for r in runs)
    return f", {k} not converged" if k else ""


def _plot_curves(records: list, variants: list[str], path, accuracy: bool, key: str | None) -> Path | None:
    """A mean line and a ±1 std band per variant over its finished seeds: the validation loss against tokens, or
    the validation accuracy (%) against steps; bands are clipped to the metric's range (0-100%, loss >= 0). Runs
    that stop at a threshold (train.stop_at) end at different steps, so a mean over them would stop with the first:
    each seed is then drawn as its own line, and the legend counts the runs that hit their cap without converging.
    Returns ``path`` (left as it is when it is current for ``key``), or None (nothing written) when no finished
    run logged the quantity."""
    if is_current(path, key):
        return Path(path)
    low_end, high_end = (0.0, 100.0) if accuracy else (0.0, math.inf)
    fig, ax = _axes()
    drawn, series = False, []
    for variant in variants:
        runs = [r for r in records if r.variant == variant and r.usable]
        curves = [{s: 100 * a for s, a in r.accuracy_curve.items()} if accuracy else r.curve for r in runs]
        curves = [c for c in curves if c]
        if not curves:
            continue
        label = f"{variant} (n={len(curves)}{_not_converged(runs)})"
        if any(r.summary.get("stop_at") for r in runs):
            color = None
            for i, curve in enumerate(curves):
                xs, ys, _ = _mean_band([curve])
                (line,) = ax.plot(xs, ys, linewidth=1, alpha=0.8, color=color, label=label if i == 0 else None)
                color = line.get_color()
                series.append((xs, ys))
            drawn = True
            continue
        xs, mean, std = _mean_band(curves)
        if not xs:
            continue
        (line,) = ax.plot(xs, mean, marker="o", markersize=3, label=label)
        series.append((xs, mean))
        if len(curves) > 1:
            lo = [max(m - s, low_end) for m, s in zip(mean, std)]
            hi = [min(m + s, high_end) for m, s in zip(mean, std)]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            series += [(xs, lo), (xs, hi)]
        drawn = True
    if not drawn:
        return None
    limits = None if accuracy else zoomed_limits(series)
    if limits is not None:
        ax.set_ylim(*limits)
    ax.set_xlabel("step" if accuracy else _x_label(records))
    quantity = "validation accuracy (%)" if accuracy else "validation loss"
    ax.set_ylabel(quantity)
    zoom = f" (y-axis from {ZOOM_FROM:.0%} of the run on)" if limits is not None else ""
    ax.set_title(f"{quantity[0].upper()}{quantity[1:]}: mean ± 1 std over seeds{zoom}", fontsize=10)
    if accuracy:
        ax.set_ylim(-2, 102)
    return _save(fig, ax, path, key)


def plot_loss_curves(records: list, variants: list[str], path, key: str | None = None) -> Path | None:
    """Validation loss vs tokens: a mean line and a ±1 std band per variant over its finished seeds.

    Returns ``path``, or None (nothing written) when no finished run has a validation loss. With ``key`` (the
    :func:`.figures.inputs_key` of the inputs), a current PNG at ``path`` is left alone.
    """
    return _plot_curves(records, variants, path, accuracy=False, key=key)


def plot_accuracy_curves(records: list, variants: list[str], path, key: str | None = None) -> Path | None:
    """Validation accuracy (%) vs step (the learning curves of a task): a mean line and a ±1 std band per variant.

    Returns ``path``, or None (nothing written) when no finished run logged an accuracy; ``key`` as for
    :func:`plot_loss_curves`.
    """
    return _plot_curves(records, variants, path, accuracy=True, key=key)


def loss_deltas(records: list, variants: list[str], baseline: str) -> dict[str, tuple[list, list, list]]:
    """{variant: (x, delta, se)} at the evaluations every finished seed of both shares: delta = mean loss of the
    variant minus the baseline's, se = sqrt(s_v^2 / n_v + s_b^2 / n_b) (the standard error of a difference of two
    means, as in Welch's test; None where either side has one seed)."""
    def curves(variant):
        return [r.curve for r in records if r.variant == variant and r.usable and r.curve]

    base = curves(baseline)
    out = {}
    if not base:
        return out
    for variant in variants:
        mine = curves(variant)
        if variant == baseline or not mine:
            continue
        ours, theirs = curve_summary(mine), curve_summary(base)
        steps = [s for s in ours if s in theirs]
        if not steps:
            continue
        first = mine[0]
        xs = [first[s][0] if first[s][0] is not None else s for s in steps]
        delta = [ours[s].mean - theirs[s].mean for s in steps]
        se = [None if ours[s].std is None or theirs[s].std is None
              else math.sqrt(ours[s].std ** 2 / ours[s].n + theirs[s].std ** 2 / theirs[s].n) for s in steps]
        out[variant] = (xs, delta, se)
    return out


def plot_loss_deltas(records: list, variants: list[str], baseline: str, path, key: str | None = None) -> Path | None:
    """Each variant's validation loss minus the baseline's against tokens, with a ±1 standard-error band
    (:func:`loss_deltas`) and the zero line; y zoomed as the loss plot. Returns ``path``, or None (nothing
    written) when no variant shares evaluations with a finished baseline run; ``key`` as for
    :func:`plot_loss_curves`."""
    deltas = loss_deltas(records, variants, baseline)
    if not deltas:
        return None
    if is_current(path, key):
        return Path(path)
    fig, ax = _axes()
    series = []
    for variant, (xs, delta, se) in deltas.items():
        (line,) = ax.plot(xs, delta, marker="o", markersize=3, label=variant)
        series.append((xs, delta))
        if all(e is not None for e in se):
            lo, hi = [d - e for d, e in zip(delta, se)], [d + e for d, e in zip(delta, se)]
            ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)
            series += [(xs, lo), (xs, hi)]
    ax.axhline(0.0, color="black", linewidth=0.8)
    limits = zoomed_limits(series + [(xs, [0.0] * len(xs)) for xs, _ in series])  # the zero line stays in view
    if limits is not None:
        ax.set_ylim(*limits)
    ax.set_xlabel(_x_label(records))
    ax.set_ylabel(f"validation loss minus {baseline}'s")
    ax.set_title(f"Loss relative to {baseline}: mean difference ± 1 standard error", fontsize=10)
    return _save(fig, ax, path, key)
