"""`attnlab maps RUN_DIR`: attention-map heatmaps per layer and head, and the magnitude gates per key, as PNGs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from ..analysis.maps import attention_pictures
from ..data.task_source import TaskDataset, task_name
from ..errors import ConfigError
from ..train import load_run

MAX_LABELS = 48  # token labels on the axes up to this many tokens; beyond, positions only


def _tokens(run_dir, text: str | None, seed: int):
    """(model, idx [1, T], token labels): the text encoded by the run's tokenizer, or one sequence of the run's
    task (seeded) when no text is given."""
    model, tokenizer, cfg = load_run(run_dir)
    name = task_name(cfg.data.source)
    task = None if name is None else TaskDataset.build(name, cfg.data.task).task
    if text is None and task is None:
        raise ConfigError(f"{run_dir} was trained on {cfg.data.source!r}: give the tokens to look at with --text")
    if text is None:
        ids = task.sample(1, np.random.default_rng(seed))[0][0].tolist()
    else:
        ids = encode_text(tokenizer, text, cfg.model.block_size)
    if task is not None:  # the task's own names (k3, v0, ...)
        labels = [task.token_name(i) for i in ids]
    else:
        labels = [tokenizer.decode([i]) for i in ids]
        labels = [repr(s)[1:-1] if s.isspace() or not s.isprintable() else s for s in labels]
    return model, torch.tensor([ids], dtype=torch.long), labels


def encode_text(tokenizer, text: str, block_size: int) -> list[int]:
    """The token ids of --text; a one-line ConfigError when it cannot be encoded or does not fit 1..block_size."""
    try:
        ids = tokenizer.encode(text)
    except ValueError as e:
        raise ConfigError(f"cannot encode --text: {e}") from None
    if not ids or len(ids) > block_size:
        raise ConfigError(f"--text gives {len(ids)} tokens; allowed 1..{block_size} (the block size)")
    return ids


def panel_figure(n_panels: int, width: float = 3.6, height: float = 3.4):
    """A matplotlib Figure (no pyplot) with n_panels axes, at most 4 a row, each width x height inches."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    cols = min(n_panels, 4)
    rows = -(-n_panels // cols)
    fig = Figure(figsize=(width * cols, height * rows), dpi=110)
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(rows, cols, i + 1) for i in range(n_panels)]


def _label(ax, labels, rows=True):
    if len(labels) <= MAX_LABELS:
        ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=6)
        if rows:
            ax.set_yticks(range(len(labels)), labels, fontsize=6)


def _heatmaps(mats, titles, labels, suptitle, path, vmin=0.0):
    fig, axes = panel_figure(len(mats))
    for ax, mat, title in zip(axes, mats, titles):
        image = ax.imshow(mat, cmap="viridis", vmin=vmin, interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("key", fontsize=8)
        ax.set_ylabel("query", fontsize=8)
        _label(ax, labels)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path


def _per_key(picture, labels, suptitle, path):
    fig, axes = panel_figure(picture.gates.shape[0])
    for head, ax in enumerate(axes):
        positions = np.arange(len(labels))
        ax.bar(positions, picture.gates[head].numpy(), color="tab:blue", alpha=0.7, label=picture.applied_as)
        ax.plot(positions, picture.magnitude[head].numpy(), "o", color="tab:red", markersize=3, label="weight w_j")
        ax.set_title(f"K/V head {head}", fontsize=9)
        ax.set_xlabel("key", fontsize=8)
        _label(ax, labels, rows=False)
        ax.legend(fontsize=7)
    fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_maps(run_dir, out_dir=None, text: str | None = None, seed: int = 0) -> list[Path]:
    """PNG files in out_dir (default RUN_DIR/maps): layer<L>_attention.png (one heatmap per head of p_ij) and, for
    magnitude layers, layer<L>_gates.png (per key: the gates as bars and the weights w_j as dots; prefix form: a
    heatmap of g_ij per K/V head). Returns the paths written."""
    model, idx, labels = _tokens(run_dir, text, seed)
    out = Path(run_dir) / "maps" if out_dir is None else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for layer, picture in enumerate(attention_pictures(model, idx)):
        weights = picture.weights.float()
        paths.append(_heatmaps(weights.numpy(), [f"head {h}" for h in range(weights.shape[0])], labels,
                               f"layer {layer}: attention weights p_ij", out / f"layer{layer}_attention.png"))
        if picture.gates is None:
            continue
        suptitle = f"layer {layer}: magnitude {picture.applied_as} of each key"
        if picture.gates.dim() == 2:  # per key
            paths.append(_per_key(picture, labels, suptitle, out / f"layer{layer}_gates.png"))
        else:  # per (i, j): the prefix form
            gates = picture.gates.float()
            paths.append(_heatmaps(gates.numpy(), [f"K/V head {h}" for h in range(gates.shape[0])], labels,
                                   suptitle + " inside each query's prefix", out / f"layer{layer}_gates.png",
                                   vmin=None))
    return paths
