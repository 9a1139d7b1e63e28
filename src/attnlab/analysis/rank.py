"""Singular spectra and pseudo-rank of attention weights (the Boneless write-up, "A discussion on low rank attention weights").

Matrices, in the x W convention (x a row vector; W = nn.Linear.weight', same singular values), per layer:

    q, k, v   W_q [C, H d], W_k [C, Hkv d], W_v [C, Hkv d]   (all heads together; with GQA/MQA K and V are narrower)
    o         W_o [H d, C]
    qk        W_q^h W_k^g(h)' [C, C] per query head h, g(h) = h // (H / Hkv): the bilinear form of head h's logits
              x_i W_q^h W_k^h' x_j' (Kobayashi, Akram & von Oswald 2024, "Weight decay induces low-rank attention
              layers", study W_K' W_Q). Its rank is at most d, so its spectrum is its top d singular values,
              computed exactly from thin QR factors: W_q^h = Q_a R_a, W_k^g = Q_b R_b => svd(W_q^h W_k^g') =
              svd(R_a R_b') (Q_a, Q_b have orthonormal columns). The logit scale (1/sqrt(d)) multiplies every
              singular value alike and is left out; biases are left out; with RoPE this is the offset-0 form.
Projections other than nn.Linear enter as the linear map they compute (:func:`effective_weight`).

Each spectrum s_1 >= ... >= s_n (n = min of the matrix's two sizes; n = d for qk) gives

    pseudo-rank  = k* / n,  k* = min{k : sum_{i<=k} s_i^2 >= 0.95 sum_i s_i^2}
                 the smallest fraction of singular values holding 95% of the *energy* (squared singular values,
                 the squared Frobenius norm): by Eckart-Young, the best rank-k* approximation has relative
                 squared Frobenius error <= 5%. (The plain sum of s_i is not used.)
    participation ratio  PR = (sum_i s_i^2)^2 / sum_i s_i^4   (Gao, Trautmann, Yu, Santhanam, Ryu, Shenoy &
                 Ganguli 2017, "A theory of multineuronal dimensionality, dynamics and measurement", with
                 eigenvalues lambda_i = s_i^2 of W'W); 1 <= PR <= rank, PR = k for k equal singular values.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from ..atomic import atomic_path, write_text
from ..errors import ConfigError

try:  # Q/K/V projection modules (the Boneless write-up steps 5-6, MLA); older trees have plain nn.Linear only
    from ..mechanisms.projections.module import Residual as _Residual
except ImportError:  # pragma: no cover
    _Residual = None

__all__ = ["MATRICES", "attention_layers", "effective_weight", "layer_matrices", "qk_head_spectra",
           "singular_spectra", "pseudo_rank", "participation_ratio", "spectrum_stats", "rank_metrics",
           "rank_rows", "format_rank_table", "plot_spectra", "rank_report"]

MATRICES = ("q", "k", "v", "o", "qk")
STATS = ("pseudo_rank", "participation_ratio")  # the metric names of rank_metrics
MASS = 0.95


def attention_layers(model: nn.Module) -> list[nn.Module]:
    """The attnlab.nn.Attention modules of a model in order (wrappers such as DDP or torch.compile are fine)."""
    from ..nn import Attention

    return [m for m in model.modules() if isinstance(m, Attention)]


def effective_weight(proj: nn.Module | None, n_in: int) -> torch.Tensor | None:
    """The linear map x -> proj(x) without its bias, as W [in, out] (float64, x W convention), or None.

    nn.Linear and any module with a 2-D ``weight`` (identity-initialised, low-rank W = B A): weight';
    nn.Identity (Q/K/V = x): I; attnlab.mechanisms.projections.module.Residual (proj(x) + x): W + I.
    """
    if proj is None:
        return None
    if isinstance(proj, nn.Identity):
        return torch.eye(n_in, dtype=torch.float64)
    if _Residual and isinstance(proj, _Residual):
        inner = effective_weight(proj.proj, n_in)
        return None if inner is None else inner + torch.eye(n_in, dtype=torch.float64)
    w = getattr(proj, "weight", None)
    if isinstance(w, torch.Tensor) and w.dim() == 2:
        return w.detach().double().cpu().T
    return None


def layer_matrices(attn: nn.Module) -> dict[str, torch.Tensor]:
    """{"q": W_q [C, H d], "k", "v", "o": W_o [H d, C]} of one attention layer (float64, x W convention) from
    :func:`effective_weight`. With MLA's latent K/V (k = RMSNorm(x W_dkv) W_uk) the linear part
    W_k = W_dkv diag(gain) W_uk is used, i.e. up to the per-token 1/RMS factor. A projection that is no linear
    map (or absent) is left out; so is W_o when it is the identity (out_proj=False)."""
    c = attn.n_head * attn.head_dim
    out = {}
    for m, name in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj"), ("o", "out_proj")):
        if m == "o" and isinstance(getattr(attn, name, None), nn.Identity):
            continue
        w = effective_weight(getattr(attn, name, None), c)
        if w is not None:
            out[m] = w
    latent = getattr(attn, "kv_latent", None)
    if latent is not None and all(hasattr(latent, a) for a in ("down", "norm", "up_k", "up_v")):
        gain = getattr(latent.norm, "weight", None)
        down = effective_weight(latent.down, c)
        down = down * gain.detach().double().cpu() if gain is not None else down  # W_dkv diag(gain)
        out["k"], out["v"] = down @ effective_weight(latent.up_k, 0), down @ effective_weight(latent.up_v, 0)
    return out


def qk_head_spectra(w_q: torch.Tensor, w_k: torch.Tensor, n_head: int, n_kv_head: int) -> torch.Tensor:
    """Singular values [H, d] of W_q^h W_k^g(h)' for every query head h (module docstring), via thin QR."""
    c = w_q.shape[0]
    d = w_q.shape[1] // n_head
    wq = w_q.reshape(c, n_head, d).transpose(0, 1)  # [H, C, d]: W_q^h
    wk = w_k.reshape(c, n_kv_head, d).transpose(0, 1).repeat_interleave(n_head // n_kv_head, dim=0)  # W_k^g(h)
    r_a, r_b = torch.linalg.qr(wq).R, torch.linalg.qr(wk).R  # W = Q R, R [H, d, d]
    return torch.linalg.svdvals(r_a @ r_b.transpose(-1, -2))  # svd(W_q^h W_k^h') = svd(R_a R_b')


def singular_spectra(model: nn.Module) -> list[dict[str, torch.Tensor]]:
    """Per layer: {"q", "k", "v", "o": singular values [n] (descending, float64), "qk": [H, d] per head}."""
    out = []
    for attn in attention_layers(model):
        mats = layer_matrices(attn)
        spectra = {m: torch.linalg.svdvals(w) for m, w in mats.items()}
        if "q" in mats and "k" in mats:
            spectra["qk"] = qk_head_spectra(mats["q"], mats["k"], attn.n_head, attn.n_kv_head)
        out.append(spectra)
    return out


def pseudo_rank(s, mass: float = MASS):
    """k*/n: the smallest fraction of singular values s [..., n] whose squared sum reaches ``mass`` of the total
    squared sum (module docstring; the order of s does not matter). 0 for an all-zero spectrum. A float for 1-D
    input, else a tensor over the leading dimensions."""
    s = torch.as_tensor(s, dtype=torch.float64)
    energy = torch.sort(s * s, dim=-1, descending=True).values  # s_i^2, largest first
    total = energy.sum(-1, keepdim=True)
    cum = energy.cumsum(-1)
    reached = cum >= mass * total - 1e-12 * total  # sum_{i<=k} s_i^2 >= mass sum s_i^2 (up to rounding)
    k = torch.where(total[..., 0] > 0, reached.float().argmax(-1) + 1, 0)  # first k that reaches it
    frac = k.double() / s.shape[-1]
    return float(frac) if frac.dim() == 0 else frac


def participation_ratio(s):
    """(sum s_i^2)^2 / sum s_i^4 over the last dimension (0 for an all-zero spectrum); float for 1-D input."""
    e = torch.as_tensor(s, dtype=torch.float64) ** 2
    num, den = e.sum(-1) ** 2, (e * e).sum(-1)
    pr = torch.where(den > 0, num / torch.where(den > 0, den, 1.0), 0.0)
    return float(pr) if pr.dim() == 0 else pr


def spectrum_stats(s, mass: float = MASS) -> dict:
    """pseudo_rank, participation_ratio and n of one spectrum [n], or their means over heads for [H, n]."""
    s = torch.as_tensor(s, dtype=torch.float64)
    pr_, part = pseudo_rank(s, mass), participation_ratio(s)
    mean = lambda x: float(torch.as_tensor(x, dtype=torch.float64).mean())  # noqa: E731 (a float stays float64)
    return {"pseudo_rank": mean(pr_), "participation_ratio": mean(part), "n": s.shape[-1]}


def rank_metrics(model: nn.Module, mass: float = MASS, per_layer: bool = True) -> dict[str, float]:
    """Flat metrics for a training log. For m in q, k, v, o, qk (qk: mean over heads):

        pseudo_rank/{m}/L{i}, participation_ratio/{m}/L{i}   layer i (with per_layer)
        pseudo_rank/{m}/mean, participation_ratio/{m}/mean   mean over layers
    """
    out, sums = {}, {}
    with torch.no_grad():
        spectra = singular_spectra(model)
    for i, layer in enumerate(spectra):
        for m, s in layer.items():
            stats = spectrum_stats(s, mass)
            for key in STATS:
                if per_layer:
                    out[f"{key}/{m}/L{i}"] = stats[key]
                sums.setdefault((key, m), []).append(stats[key])
    for (key, m), values in sums.items():
        out[f"{key}/{m}/mean"] = sum(values) / len(values)
    return out


def rank_rows(spectra: list[dict], mass: float = MASS) -> list[dict]:
    """One row per (layer, matrix): layer, matrix, n, k (singular values holding the mass), pseudo_rank, PR."""
    rows = []
    for i, layer in enumerate(spectra):
        for m in MATRICES:
            if m in layer:
                stats = spectrum_stats(layer[m], mass)
                rows.append({"layer": i, "matrix": m, **stats, "k": stats["pseudo_rank"] * stats["n"],
                             "heads": layer[m].shape[0] if layer[m].dim() == 2 else None})
    return rows


def format_rank_table(rows: list[dict], mass: float = MASS) -> str:
    """Markdown table of :func:`rank_rows` (k is a mean over heads for qk)."""
    lines = [f"| layer | matrix | n | k ({mass:.0%} energy) | pseudo-rank k/n | participation ratio | PR/n |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        name = r["matrix"] + (f" (mean of {r['heads']} heads)" if r["heads"] else "")
        lines.append(f"| {r['layer']} | {name} | {r['n']} | {r['k']:.1f} | {r['pseudo_rank']:.3f} | "
                     f"{r['participation_ratio']:.2f} | {r['participation_ratio'] / r['n']:.3f} |")
    return "\n".join(lines)


def plot_spectra(spectra: list[dict], path, title: str | None = None, mass: float = MASS) -> Path:
    """Top row: s_i / s_1 against i / n (log scale), one line per layer (qk: mean over heads of the normalised
    spectra); bottom row: the cumulative energy fraction, with the ``mass`` line that defines the pseudo-rank."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    present = [m for m in MATRICES if any(m in layer for layer in spectra)]
    fig = Figure(figsize=(3.2 * max(1, len(present)), 6), dpi=80)
    FigureCanvasAgg(fig)
    for col, m in enumerate(present):
        top = fig.add_subplot(2, len(present), col + 1)
        bottom = fig.add_subplot(2, len(present), len(present) + col + 1)
        for i, layer in enumerate(spectra):
            if m not in layer:
                continue
            s = layer[m].reshape(-1, layer[m].shape[-1])
            s = s / s[:, :1].clamp_min(1e-300)  # s_i / s_1 per head
            e = (s * s).cumsum(-1) / (s * s).sum(-1, keepdim=True).clamp_min(1e-300)
            n = s.shape[-1]
            xs = (torch.arange(1, n + 1) / n).numpy()
            top.semilogy(xs, s.mean(0).clamp_min(1e-12).numpy(), label=f"layer {i}")
            bottom.plot(xs, e.mean(0).numpy())
        top.set_title(f"W_{m}" if m != "qk" else "W_q^h W_k^h' (per head)")
        bottom.axhline(mass, color="k", ls="--", lw=0.8)
        bottom.set_xlabel("i / n")
        if col == 0:
            top.set_ylabel("s_i / s_1")
            bottom.set_ylabel("cumulative energy")
            top.legend(fontsize=7)
        for ax in (top, bottom):
            ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.subplots_adjust(left=0.07, right=0.98, bottom=0.08, top=0.9, wspace=0.3, hspace=0.25)  # tight_layout is slow here
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")
    return Path(path)


def rank_report(model: nn.Module, out_dir, mass: float = MASS, *, source: str = "model", kind: str = "") -> dict:
    """Spectra of ``model``'s attention weights: writes rank.md (the table), rank.json (rows, metrics, spectra) and
    spectra.png into ``out_dir``; ``source`` and ``kind`` name what was measured (a path, "attnlab run").
    Returns {"rows", "metrics", "table", "out_dir", "kind"}. Loading a checkpoint is the caller's
    (:func:`attnlab.train.load_model`)."""
    with torch.no_grad():
        spectra = singular_spectra(model)
    if not spectra:
        raise ConfigError(f"{source}: the model has no attention layers with Linear projections")
    out_dir = Path(out_dir)
    rows = rank_rows(spectra, mass)
    table = format_rank_table(rows, mass)
    metrics = rank_metrics(model, mass)
    write_text(out_dir / "rank.md", f"# Attention spectra of {source} ({kind})\n\n{table}\n")
    dump = {"path": str(source), "kind": kind, "mass": mass, "rows": rows, "metrics": metrics,
            "spectra": [{m: s.tolist() for m, s in layer.items()} for layer in spectra]}
    write_text(out_dir / "rank.json", json.dumps(dump) + "\n")
    plot_spectra(spectra, out_dir / "spectra.png", title=f"{Path(source).name} ({kind})", mass=mass)
    return {"rows": rows, "metrics": metrics, "table": table, "out_dir": str(out_dir), "kind": kind}
