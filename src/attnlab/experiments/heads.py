"""`attnlab heads RUN_DIR`: per layer, how alike its heads attend (the Jensen-Shannon divergence
between their attention distributions), how much each head matters (the validation loss increase when it is masked
out, Michel et al. 2019, arXiv:1905.10650) and, for MoH runs, the router's usage of each head. The equations are in
attnlab.analysis.heads.

The validation windows are fixed: ``windows`` windows of block_size tokens drawn from the run's validation split by
a generator seeded with ``seed`` (a task run: its first ``windows`` validation sequences), so that two calls give
the same numbers. With ``text``, the JS divergence is computed on that text instead; the knockout losses and the
router usage stay on the validation windows.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..analysis.heads import head_knockout, head_similarity, is_distribution, mean_loss, moh_usage
from ..atomic import write_text
from ..data import prepare
from ..errors import ConfigError, check_number
from ..train import load_run
from .maps import encode_text, panel_figure

KNOCKOUT_BATCH = 8  # validation windows per forward in the knockout


def validation_windows(ds, n: int, block_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, y) [n, block_size]: n fixed windows of the validation split (ds.get_batch with a generator seeded
    ``seed``; a task's get_batch("val") gives its first n validation sequences)."""
    check_number("--windows", n, low=1, integer=True)
    return ds.get_batch("val", n, block_size, torch.Generator().manual_seed(seed))


def _text_ids(tokenizer, text: str, block_size: int) -> torch.Tensor:
    if not text:
        raise ConfigError("--text='' is empty; give at least one token of text to compare the heads on")
    return torch.tensor([encode_text(tokenizer, text, block_size)], dtype=torch.long)


def layer_similarity(model, sequences: torch.Tensor) -> list[torch.Tensor | None]:
    """Per layer, head_similarity of the attention weights on ``sequences`` [N, T], averaged over the N sequences
    (one forward each); None for a layer whose weights are not distributions over keys."""
    sums = None
    for idx in sequences.split(1):
        sims = [head_similarity(w) if is_distribution(w) else None for w in model.attention_maps(idx)]
        sums = sims if sums is None else [None if a is None or s is None else a + s for a, s in zip(sums, sims)]
    return [None if s is None else s / len(sequences) for s in sums]


def mean_off_diagonal(s: torch.Tensor | None) -> float | None:
    n = 0 if s is None else s.shape[0]
    return None if n < 2 else float((s.sum() - s.diagonal().sum()) / (n * (n - 1)))


def format_table(layers: list[dict]) -> str:
    """Per layer: mean off-diagonal JS, the most and the least important head (largest and smallest delta); then,
    for MoH layers, the router's usage."""
    lines = [f"{'layer':>5}  {'mean JS (nats)':>14}  {'most important head (delta)':>28}  "
             f"{'least important head (delta)':>29}"]
    for row in layers:
        d = row["knockout"]
        hi, lo = max(range(len(d)), key=d.__getitem__), min(range(len(d)), key=d.__getitem__)
        js = "n/a" if row["mean_js"] is None else f"{row['mean_js']:.4f}"
        lines.append(f"{row['layer']:>5}  {js:>14}  {f'h{hi} ({d[hi]:+.4f})':>28}  {f'h{lo} ({d[lo]:+.4f})':>29}")
    for row in layers:
        moh = row.get("moh")
        if moh:
            weight = " ".join(f"h{h} {g:.2f}" for h, g in enumerate(moh["weight"]))
            chosen = " ".join(f"h{moh['shared'] + h} {f:.2f}" for h, f in enumerate(moh["selected"]))
            lines.append(f"layer {row['layer']} MoH router (h0..h{moh['shared'] - 1} shared): mean weight {weight}; "
                         f"tokens selecting {chosen}")
    return "\n".join(lines)


def plot_js(layers: list[dict], path: Path, source: str) -> Path:
    """One panel per layer: the [H, H] JS divergences, annotated (a shared colour scale from 0)."""
    fig, axes = panel_figure(len(layers), width=3.4, height=3.2)
    top = max([max(map(max, row["js"])) for row in layers if row["js"] is not None] + [1e-12])
    for ax, row in zip(axes, layers):
        ax.set_title(f"layer {row['layer']}", fontsize=9)
        if row["js"] is None:
            ax.text(0.5, 0.5, "weights are not\ndistributions", ha="center", va="center", transform=ax.transAxes)
            ax.set_axis_off()
            continue
        s = row["js"]
        image = ax.imshow(s, cmap="viridis", vmin=0.0, vmax=top, interpolation="nearest")
        for h in range(len(s)):
            for g in range(len(s)):
                ax.text(g, h, f"{s[h][g]:.3f}", ha="center", va="center", fontsize=7,
                        color="white" if s[h][g] < top / 2 else "black")
        ax.set_xticks(range(len(s)))
        ax.set_yticks(range(len(s)))
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("head", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(f"JS divergence between heads (nats), {source}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    return path


def plot_knockout(layers: list[dict], base_loss: float, path: Path) -> Path:
    """Bars of delta_lh per head, grouped by layer."""
    n_head = len(layers[0]["knockout"])
    fig, (ax,) = panel_figure(1, width=max(5.0, 0.3 * len(layers) * n_head + 2), height=3.4)
    width = 0.8 / n_head
    for h in range(n_head):
        ax.bar([row["layer"] - 0.4 + (h + 0.5) * width for row in layers], [row["knockout"][h] for row in layers],
               width, label=f"head {h}")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks([row["layer"] for row in layers], [f"layer {row['layer']}" for row in layers])
    ax.set_ylabel("loss increase when masked (nats)", fontsize=8)
    ax.set_title(f"head knockout (Michel et al. 2019); base validation loss {base_loss:.4f}", fontsize=9)
    ax.legend(fontsize=7, ncol=min(n_head, 4))
    fig.tight_layout()
    fig.savefig(path)
    return path


def write_heads(run_dir, out_dir=None, text: str | None = None, windows: int = 8, seed: int = 0) -> dict:
    """Compute the head analyses of a run and write heads.json, js.png and knockout.png to out_dir (default
    RUN_DIR/heads). Returns {"report": the JSON's content, "table": the printed table, "paths": the files}."""
    model, tokenizer, cfg = load_run(run_dir)
    block_size = cfg.model.block_size
    js_tokens = None if text is None else _text_ids(tokenizer, text, block_size)  # a bad --text fails first
    x, y = validation_windows(prepare(cfg.data), windows, block_size, seed)
    sims = layer_similarity(model, x if js_tokens is None else js_tokens)
    batches = list(zip(x.split(KNOCKOUT_BATCH), y.split(KNOCKOUT_BATCH)))
    base = mean_loss(model, batches)
    deltas = head_knockout(model, batches)
    usage = moh_usage(model, x)
    layers = []
    for layer, (s, d, u) in enumerate(zip(sims, deltas, usage)):
        row = {"layer": layer, "js": None if s is None else s.tolist(), "mean_js": mean_off_diagonal(s),
               "base_loss": base, "knockout": d.tolist()}
        if u is not None:
            row["moh"] = {"shared": u["shared"], "top_k": u["top_k"], "weight": u["weight"].tolist(),
                          "selected": u["selected"].tolist()}
        layers.append(row)
    source = f"--text ({js_tokens.shape[1]} tokens)" if js_tokens is not None else \
        f"{windows} validation windows of {block_size} tokens"
    report = {"run_dir": str(run_dir), "attention": str(cfg.model.attention), "seed": seed, "windows": windows,
              "block_size": block_size, "js_on": source, "base_loss": base, "layers": layers}
    out = Path(run_dir) / "heads" if out_dir is None else Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [write_text(out / "heads.json", json.dumps(report, indent=1, allow_nan=False) + "\n"),
             plot_js(layers, out / "js.png", source), plot_knockout(layers, base, out / "knockout.png")]
    return {"report": report, "table": format_table(layers), "paths": paths}


def heads_table(reports: dict[str, dict]) -> str:
    """A Markdown table over several runs' heads.json contents {label: report}: per run and layer, the base
    validation loss, the mean off-diagonal JS divergence, each head's knockout delta and, for MoH, the router's mean
    weight of each head (docs/generate.py's HEADS block)."""
    n_head = max(len(row["knockout"]) for r in reports.values() for row in r["layers"])
    heads = " | ".join(f"delta h{h}" for h in range(n_head))
    lines = [f"| run | layer | base loss | mean JS (nats) | {heads} | MoH mean weight per head |",
             "|---|---|---|---|" + "---|" * n_head + "---|"]
    for label, report in reports.items():
        for row in report["layers"]:
            js = "n/a" if row["mean_js"] is None else f"{row['mean_js']:.4f}"
            deltas = " | ".join(f"{d:+.4f}" for d in row["knockout"])
            moh = " ".join(f"{g:.2f}" for g in row["moh"]["weight"]) if row.get("moh") else ""
            lines.append(f"| {label} | {row['layer']} | {row['base_loss']:.4f} | {js} | {deltas} | {moh} |")
    return "\n".join(lines) + "\n"


__all__ = ["validation_windows", "layer_similarity", "format_table", "write_heads", "heads_table"]
