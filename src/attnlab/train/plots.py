"""Loss curves as PNG images (matplotlib's object API with the Agg canvas: no pyplot global state, no display)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..atomic import atomic_path
from ..rundir import read_metrics

__all__ = ["plot_losses"]


def _series(rows: Iterable[dict], key: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return [s for s, _ in pairs], [v for _, v in pairs]


def plot_losses(rows: Iterable[dict] | str | Path, out_path: str | Path, title: str | None = None) -> Path:
    """Plot train and validation loss against step from metrics rows (or a metrics.jsonl path) to a PNG."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = read_metrics(rows) if isinstance(rows, (str, Path)) else list(rows)
    fig = Figure(figsize=(7, 4.5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for key, label, style in (("train_loss", "train", "-"), ("val_loss", "val", "o-")):
        steps, values = _series(rows, key)
        if steps:
            ax.plot(steps, values, style, label=label, markersize=3)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats/token)")
    ax.grid(alpha=0.3)
    if title:
        ax.set_title(title)
    if ax.get_lines():
        ax.legend()
    fig.tight_layout()
    with atomic_path(out_path) as tmp:
        fig.savefig(tmp, format="png")
    return Path(out_path)
