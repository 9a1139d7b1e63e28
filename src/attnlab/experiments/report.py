"""The report of a comparison, built from the run directories on disk alone (so it can be regenerated).

:func:`write_report` reads ``out_dir/compare.toml`` and every ``<variant>/seed<k>/{summary.json,metrics.jsonl}``
and writes ``results.json`` (:func:`compute_results`), the plots (:mod:`.plots`: ``loss_curves.png``, ``loss_delta.png``) and
``report.md`` (:func:`render_markdown`).

Statistics use only *finished* runs with a finite final validation loss. Diverged, interrupted and missing
runs are counted and listed, never averaged in.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

from ..analysis.rank import MATRICES as _RANK_WEIGHTS
from ..analysis.rank import STATS as RANK_STATS
from ..atomic import write_text
from ..configio import load_toml
from ..errors import ConfigError
from ..rundir import (ACCURACY_CURVES_FILE, COMPARE_SPEC_FILE, CURVES_FILE, DELTA_CURVES_FILE, DONE_STATUSES, REPORT_FILE,
                      RESULTS_FILE, SHIPPED_RUN_FILES, SHIPPED_RUN_GLOBS, read_metrics, read_summary)
from ..rundir import comparison_run_dir as run_dir
from . import hijack_report, plots
from .figures import inputs_key
from .hijack_report import ACCURACY_FILE, MASS_FILE, hijack_results, hijack_tables, plot_hijack
from .length_report import length_plot_link, length_results, length_table, plot_lengths
from .plots import plot_accuracy_curves, plot_loss_curves, plot_loss_deltas
from .stats import curve_summary, describe, welch_ttest
from .stats import mean_std_text as _mean_std
from .verdict import (convergence_results, converged_primary_results, not_converged_note, primary_results,
                      verdict_tables)

__all__ = ["RunRecord", "collect_runs", "compute_results", "export_comparison", "load_curve", "plot_accuracy_curves",
           "plot_loss_curves", "read_results", "render_markdown", "results_tables", "write_report"]


# ------------------------------------------------------------------------------------------------ reading runs


@dataclass
class RunRecord:
    """One (variant, seed) run as found on disk.

    ``status``: the summary's status ("finished", "diverged", "interrupted"), "incomplete" (a directory
    without a summary) or "missing". ``curve``: {step: (tokens, val_loss)} from metrics.jsonl;
    ``accuracy_curve``: {step: val_accuracy} at the evaluations that logged one.
    ``diagnostics``: the latest weight and gate statistics in metrics.jsonl (see :func:`diagnostics_of`).
    """

    variant: str
    seed: int
    path: Path
    status: str
    summary: dict = field(default_factory=dict)
    curve: dict = field(default_factory=dict)
    diagnostics: dict = field(default_factory=dict)
    accuracy_curve: dict = field(default_factory=dict)

    @property
    def final_val_loss(self) -> float | None:
        """The summary's final_val_loss, else the last validation loss logged; None if neither is finite."""
        value = self.summary.get("final_val_loss")
        if value is None and self.curve:
            value = self.curve[max(self.curve)][1]
        return float(value) if _finite(value) else None

    @property
    def final_val_accuracy(self) -> float | None:
        """The summary's final_val_accuracy (answer accuracy on a task, next-token accuracy on text), if finite."""
        value = self.summary.get("final_val_accuracy")
        return float(value) if _finite(value) else None

    @property
    def not_converged(self) -> bool:
        """The run had a stop rule (train.stop_at) and reached its step cap without meeting it."""
        return self.summary.get("converged") is False

    @property
    def usable(self) -> bool:
        """Counts in the statistics: finished with a finite final validation loss."""
        return self.status == "finished" and self.final_val_loss is not None


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def load_curve(path: Path, rows: list[dict] | None = None) -> dict[int, tuple[float | None, float]]:
    """{step: (tokens, val_loss)} of the evaluated steps in ``path/metrics.jsonl`` (or of ``rows``).

    A step logged twice (re-run after a resume) keeps its last value.
    """
    curve = {}
    for row in read_metrics(path) if rows is None else rows:
        if _finite(row.get("val_loss")) and isinstance(row.get("step"), int):
            tokens = row.get("tokens")
            curve[row["step"]] = (tokens if _finite(tokens) else None, float(row["val_loss"]))
    return dict(sorted(curve.items()))


def load_accuracy_curve(rows: list[dict]) -> dict[int, float]:
    """{step: val_accuracy} of the evaluation rows of metrics.jsonl that logged a finite accuracy (the last value
    of a step logged twice)."""
    curve = {row["step"]: float(row["val_accuracy"]) for row in rows
             if _finite(row.get("val_accuracy")) and isinstance(row.get("step"), int)}
    return dict(sorted(curve.items()))


# per-layer magnitude statistics (``mag/L<i>/<stat>``, logged by the gates) are reduced over layers like this
_MAG_REDUCE = {"t": "mean", "magnitude_over_n": "mean", "gate_mean": "mean", "prior_floored": "mean",
               "residual": "max", "jitter": "max", "mu_min": "min", "mu_max": "max"}


def diagnostics_of(row: dict) -> dict:
    """The weight and gate statistics of one metrics row, one number per name.

    ``pseudo_rank/<w>/mean`` and ``participation_ratio/<w>/mean`` (means over layers, logged at evaluations by
    ``train.track_rank``) are kept as they are; the magnitude gates' ``mag/L<i>/<stat>`` become ``mag/<stat>``:
    the mean over layers of t, |X|/N and the mean gate, the largest solve residual and jitter, the smallest mu_min
    and the largest mu_max; the hijack sweep's ``hijack/...`` and length extrapolation's ``length/...`` as they are.
    """
    out, per_layer = {}, {}
    for key, value in row.items():
        if not _finite(value):
            continue
        parts = key.split("/")
        if (parts[0] in RANK_STATS and parts[-1] == "mean") or parts[0] in ("hijack", "length"):
            out[key] = float(value)
        elif len(parts) == 3 and parts[0] == "mag" and parts[1].startswith("L") and parts[2] in _MAG_REDUCE:
            per_layer.setdefault(parts[2], []).append(float(value))
    for stat, values in per_layer.items():
        how = _MAG_REDUCE[stat]
        out[f"mag/{stat}"] = sum(values) / len(values) if how == "mean" else (min if how == "min" else max)(values)
    return out


def _last_diagnostics(rows: list[dict]) -> dict:
    """The latest value of each diagnostic (ranks are logged at evaluations, gate statistics at log steps;
    a finished run's last row has both)."""
    latest = {}
    for row in rows:
        latest.update(diagnostics_of(row))
    return latest


def collect_runs(out_dir, variants, seeds) -> list[RunRecord]:
    """A :class:`RunRecord` per (variant, seed), in variant-major order."""
    records = []
    for variant in variants:
        for seed in seeds:
            path = run_dir(out_dir, variant, seed)
            summary = read_summary(path)
            if summary is not None:
                status = str(summary.get("status", "incomplete"))
            else:
                status = "incomplete" if path.exists() else "missing"
            rows = read_metrics(path)
            records.append(RunRecord(variant, seed, path, status, summary or {}, load_curve(path, rows),
                                     _last_diagnostics(rows), load_accuracy_curve(rows)))
    return records


# ------------------------------------------------------------------------------------------------------ numbers


def _settings(spec: dict) -> dict:
    """The settings shared by every run, with the token budget spelled out."""
    base = spec.get("base", {})
    model, train, data = base.get("model", {}), base.get("train", {}), base.get("data", {})
    steps, batch = train.get("max_steps"), train.get("batch_size")
    block, accum = model.get("block_size"), train.get("grad_accum", 1)
    per_step = batch * block * accum if None not in (batch, block, accum) else None
    return {
        "preset": base.get("preset"),
        "variants": list(spec["variants"]),
        "seeds": list(spec["seeds"]),
        "max_steps": steps,
        "batch_size": batch,
        "block_size": block,
        "grad_accum": accum,
        "tokens_per_step": per_step,
        "token_budget": steps * per_step if None not in (steps, per_step) else None,
        "data": {k: data[k] for k in ("source", "tokenizer", "vocab_size", "val_fraction", "task")
                 if k in data and (k != "vocab_size" or data.get("tokenizer") == "bpe") and (k != "task" or data[k])},
        "model": {k: model[k] for k in ("n_layer", "n_head", "n_embd", "dropout", "pos_encoding") if k in model},
        "train": {k: train[k] for k in ("lr", "min_lr", "warmup_steps", "eval_tokens", "device", "dtype")
                  if k in train},
    }


def _mean(values) -> float | None:
    values = [float(v) for v in values if _finite(v)]
    return sum(values) / len(values) if values else None


def _params(records) -> int | None:
    """The parameter count of a variant's runs (None if unknown or, unexpectedly, not the same for all)."""
    counts = {r.summary.get("n_params") for r in records if isinstance(r.summary.get("n_params"), int)}
    return counts.pop() if len(counts) == 1 else None


def _run_row(r: RunRecord) -> dict:
    s = r.summary
    return {
        "seed": r.seed,
        "status": r.status,
        "final_val_loss": r.final_val_loss,
        "final_val_accuracy": r.final_val_accuracy,
        "best_val_loss": s.get("best_val_loss") if _finite(s.get("best_val_loss")) else None,
        "steps": s.get("steps"),
        "tokens_seen": s.get("tokens_seen"),
        "tokens_per_s": s.get("tokens_per_s") if _finite(s.get("tokens_per_s")) else None,
        "wall_time_s": s.get("wall_time_s") if _finite(s.get("wall_time_s")) else None,
        "n_params": s.get("n_params"),
        "message": s.get("message"),
        "dir": str(run_dir("", r.variant, r.seed)),  # relative to the comparison directory (it may be moved or shipped)
    }


def _same_attention_as(spec: dict, variant: str, baseline: str) -> bool:
    """Whether ``variant`` resolves to exactly the baseline's attention for this model (e.g. gqa with
    n_kv_head = n_head is standard attention), so any difference between them is noise by construction."""
    from ..config import GPTConfig
    from ..configio import from_dict

    model = {k: v for k, v in spec["base"].get("model", {}).items() if k != "attention"}
    try:
        resolve = lambda name: from_dict(GPTConfig, {**model, "attention": name}).resolved_attention()  # noqa: E731
        return resolve(variant) == resolve(baseline)
    except ConfigError:
        return False


def _diagnostics_summary(records: list[RunRecord]) -> dict:
    """{name: mean/std over the runs} of each run's last diagnostics (see :func:`diagnostics_of`)."""
    names = sorted({k for r in records for k in r.diagnostics})
    return {k: describe([r.diagnostics[k] for r in records if k in r.diagnostics]).to_dict() for k in names}


def compute_results(spec: dict, records: list[RunRecord]) -> dict:
    """All the report's numbers (the contents of results.json); None wherever a number is undefined."""
    variants = list(spec["variants"])
    by_variant = {v: [r for r in records if r.variant == v] for v in variants}
    losses = {v: [r.final_val_loss for r in rs if r.usable] for v, rs in by_variant.items()}
    accs = {v: [r.final_val_accuracy for r in rs if r.usable and r.final_val_accuracy is not None]
            for v, rs in by_variant.items()}
    curves = {v: [r.curve for r in rs if r.usable and r.curve] for v, rs in by_variant.items()}
    acc_curves = {v: [r.accuracy_curve for r in rs if r.usable and r.accuracy_curve] for v, rs in by_variant.items()}
    baseline = variants[0]
    base_summary, base_acc = describe(losses[baseline]), describe(accs[baseline])
    rows = []
    for v in variants:
        rs, summ, acc = by_variant[v], describe(losses[v]), describe(accs[v])
        is_base = v == baseline
        delta = None if is_base or None in (summ.mean, base_summary.mean) else summ.mean - base_summary.mean
        acc_delta = None if is_base or None in (acc.mean, base_acc.mean) else acc.mean - base_acc.mean
        rows.append({
            "variant": v,
            "baseline": is_base,
            "same_attention_as_baseline": not is_base and _same_attention_as(spec, v, baseline),
            "n_seeds": len(rs),
            "n_finished": len(losses[v]),
            "n_diverged": sum(r.status == "diverged" for r in rs),
            "n_unfinished": sum(r.status not in DONE_STATUSES for r in rs),
            "final_val_loss": summ.to_dict(),
            "delta_vs_baseline": delta,
            "welch_vs_baseline": None if is_base else welch_ttest(losses[v], losses[baseline]).to_dict(),
            "final_val_accuracy": acc.to_dict(),
            "accuracy_delta_vs_baseline": acc_delta,
            "accuracy_welch_vs_baseline": None if is_base else welch_ttest(accs[v], accs[baseline]).to_dict(),
            "tokens_per_s_mean": _mean(r.summary.get("tokens_per_s") for r in rs if r.usable),
            "diagnostics": _diagnostics_summary([r for r in rs if r.usable]),
            "val_curve": {step: st.to_dict() for step, st in curve_summary(curves[v]).items()},
            "val_accuracy_curve": {step: st.to_dict() for step, st in curve_summary(acc_curves[v]).items()},
            "n_params": _params(rs),
            "runs": [_run_row(r) for r in rs],
        })
    primary = spec.get("primary")
    length = length_results(records, variants, spec)
    converged = converged_primary_results(records, variants, primary) if primary else None
    return {"baseline": baseline, "settings": _settings(spec), "variants": rows, "base_config": spec["base"],
            "convergence": convergence_results(records, variants),
            "primary": primary_results(records, variants, primary) if primary else None,
            "hijack": hijack_results(records, variants), **({"length": length} if length else {}),
            **({"primary_converged": converged} if converged else {})}


# ----------------------------------------------------------------------------------------------------- markdown


def _num(value, fmt: str, na: str = "n/a") -> str:
    return na if value is None else format(value, fmt)


def _vs_baseline(is_baseline: bool, delta, welch: dict | None, digits: str = ".4f") -> list[str]:
    """The cells Δ, Welch t, df, p of a row (the baseline's row says so instead)."""
    if is_baseline:
        return ["(baseline)", "—", "—", "—"]
    return [_num(delta, "+" + digits), _num(welch["t"], ".2f"), _num(welch["df"], ".1f"), _num(welch["p"], ".3g")]


def _table(results: dict) -> list[str]:
    base = results["baseline"]
    lines = [
        f"| variant | finished | final val loss (mean ± std) | Δ vs {base} | Welch t | df | p | tokens/s | params |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    conv = {c["variant"]: c for c in (results.get("convergence") or {}).get("variants", [])}
    for row in results["variants"]:
        loss, w = row["final_val_loss"], row["welch_vs_baseline"]
        finished = f"{row['n_finished']}/{row['n_seeds']}" + not_converged_note(conv.get(row["variant"]))
        if row["n_diverged"]:
            finished += f" ({row['n_diverged']} diverged)"
        mean_std = "n/a" if loss["mean"] is None else f"{loss['mean']:.4f} ± {_num(loss['std'], '.4f')}"
        cells = [row["variant"], finished, mean_std, *_vs_baseline(row["baseline"], row["delta_vs_baseline"], w),
                 _num(row["tokens_per_s_mean"], ",.0f"), _num(row["n_params"], ",")]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _settings_lines(results: dict) -> list[str]:
    s = results["settings"]
    budget = (
        f"{s['token_budget']:,} tokens per run = {s['max_steps']} steps × {s['batch_size']} batch × "
        f"{s['block_size']} block × {s['grad_accum']} grad_accum"
        if s["token_budget"] is not None else "n/a"
    )
    kv = lambda d: ", ".join(f"{k}={v}" for k, v in d.items())  # noqa: E731
    return [
        f"- preset: `{s['preset'] or '(none)'}`",
        f"- token budget: {budget}",
        f"- seeds: {', '.join(map(str, s['seeds']))} (the same seeds for every variant)",
        f"- variants: {', '.join(s['variants'])} (baseline: {results['baseline']})",
        f"- data: {kv(s['data'])}",
        f"- model: {kv(s['model'])}",
        f"- train: {kv(s['train'])}",
        "- every run uses the same base config except `model.attention` and `train.seed` "
        "(full config in `compare.toml`)",
    ]


def _notes(results: dict) -> list[str]:
    n_tests = len(results["variants"]) - 1
    notes = [
        "Final val loss: mean and sample standard deviation (ddof=1) over the finished seeds; lower is better.",
        f"Welch's unequal-variance t-test of each variant against {results['baseline']} (Welch 1947; "
        "Welch–Satterthwaite degrees of freedom, Satterthwaite 1946), two-sided; t > 0 means a higher loss "
        "than the baseline.",
        "n/a: undefined (a standard deviation needs ≥ 2 finished seeds, a test ≥ 2 per side and some spread).",
    ]
    same = [row["variant"] for row in results["variants"] if row.get("same_attention_as_baseline")]
    if same:
        notes.append(f"{', '.join(same)}: the same attention as {results['baseline']} for this model "
                     "(e.g. as many K/V heads as heads): it should reproduce the baseline's runs, "
                     "and no difference is due to attention.")
    if n_tests > 1:
        notes.append(f"{n_tests} tests, p-values not corrected for multiple comparisons.")
    notes.append("With few seeds the tests have little power: a large p-value is not evidence of no difference.")
    return [f"- {n}" for n in notes]


def _problem_runs(results: dict) -> list[str]:
    lines = []
    for row in results["variants"]:
        for run in row["runs"]:
            if run["status"] != "finished" or run["final_val_loss"] is None:
                why = run["status"] if run["status"] != "finished" else "finished without a validation loss"
                detail = f": {run['message']}" if run.get("message") else ""
                lines.append(f"- {row['variant']} seed {run['seed']}: {why} (`{run['dir']}`){detail}")
    return lines


def _seed_table(results: dict, key: str = "final_val_loss", scale: float = 1.0, fmt: str = ".4f") -> list[str]:
    """One row per variant, one column per seed: ``key`` of each finished run (times ``scale``), else its status."""
    seeds = results["settings"]["seeds"]
    lines = ["| variant | " + " | ".join(f"seed {s}" for s in seeds) + " |", "|---" * (len(seeds) + 1) + "|"]
    for row in results["variants"]:
        cells = [_num(r[key] and scale * r[key], fmt) if r["status"] == "finished" else r["status"] for r in row["runs"]]
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    return lines


CURVE_COLUMNS = 6  # the during-training table shows at most this many evaluation steps


def _curve_steps(results: dict, key: str = "val_curve") -> list[int]:
    """Up to CURVE_COLUMNS evaluation steps after step 0 that every variant's finished runs share in
    ``row[key]``, evenly spread and always including the first and the last."""
    curves = [row.get(key) or {} for row in results["variants"]]
    curves = [c for c in curves if c]
    if not curves:
        return []
    steps = sorted(set.intersection(*(set(map(int, c)) for c in curves)) - {0})
    if len(steps) <= CURVE_COLUMNS:
        return steps
    last = len(steps) - 1
    return [steps[round(i * last / (CURVE_COLUMNS - 1))] for i in range(CURVE_COLUMNS)]


def _percent(d: dict | None) -> dict | None:
    """A summary dict of fractions as percentages."""
    return d and {k: (100 * v if k in ("mean", "std") and v is not None else v) for k, v in d.items()}


def _curve_table(results: dict, heading: str, key: str = "val_curve") -> list[str]:
    """The validation loss (``key="val_curve"``) or accuracy in % (``"val_accuracy_curve"``) at a few evaluation
    steps: mean ± std over the finished seeds (how fast, not only how far)."""
    steps = _curve_steps(results, key)
    if not steps:
        return []
    accuracy = key == "val_accuracy_curve"
    lines = [f"{heading} Validation {'accuracy (%)' if accuracy else 'loss'} during training", "",
             "Mean ± std over the finished seeds, at up to six evaluation steps that every variant's finished runs "
             "share.", "", "| variant | " + " | ".join(f"step {s}" for s in steps) + " |",
             "|---" * (len(steps) + 1) + "|"]
    for row in results["variants"]:
        curve = {int(k): v for k, v in (row.get(key) or {}).items()}
        cells = [_mean_std(_percent(curve.get(s)), ".2f") if accuracy else _mean_std(curve.get(s), ".4f")
                 for s in steps]
        lines.append(f"| {row['variant']} | " + " | ".join(cells) + " |")
    return [*lines, ""]


_MAG_COLUMNS = (("t", "mag/t", ".3f"), ("\\|X\\|/N", "mag/magnitude_over_n", ".4f"),
                ("mean gate", "mag/gate_mean", ".3f"), ("min mu", "mag/mu_min", ".3g"),
                ("max mu", "mag/mu_max", ".3g"), ("solve residual", "mag/residual", ".2g"))
_PRIOR_COLUMN = ("prior at floor", "mag/prior_floored", ".3f")  # magnitude_apply="logits" (shown when logged)


def _diagnostics_tables(results: dict, heading: str = "##") -> list[str]:
    """Pseudo-rank (and participation ratio) per weight, and the magnitude gates, at the last logged step."""
    rows = [r for r in results["variants"] if r.get("diagnostics")]
    lines = []
    if any(k.startswith("pseudo_rank/") for r in rows for k in r["diagnostics"]):
        lines += [f"{heading} Weights at the end of training", "",
                  "Pseudo-rank (fraction of singular values holding 95% of the squared spectrum) and participation "
                  "ratio of each attention weight, mean over layers (W_q W_k': over heads too), at the last "
                  "evaluation; mean ± std over the finished seeds.", "",
                  "| variant | " + " | ".join(f"W_{w}" for w in _RANK_WEIGHTS) + " |",
                  "|---" * (len(_RANK_WEIGHTS) + 1) + "|"]
        for r in rows:
            d = r["diagnostics"]
            cells = [f"{_mean_std(d[f'pseudo_rank/{w}/mean'], '.3f')} (PR "
                     f"{_mean_std(d.get(f'participation_ratio/{w}/mean'), '.1f')})"
                     if f"pseudo_rank/{w}/mean" in d else "n/a" for w in _RANK_WEIGHTS]
            lines.append(f"| {r['variant']} | " + " | ".join(cells) + " |")
        lines.append("")
    mag = [r for r in rows if any(k.startswith("mag/") for k in r["diagnostics"])]
    if mag:
        prior = any(_PRIOR_COLUMN[1] in r["diagnostics"] for r in mag)
        columns = (*_MAG_COLUMNS, _PRIOR_COLUMN) if prior else _MAG_COLUMNS
        lines += [f"{heading} Magnitude gates at the end of training", "",
                  "Over layers: the mean of t, |X|/N and the mean gate, the smallest mu, the largest mu and the "
                  "largest relative residual of the solve (Cholesky or CG), at the last logged step"
                  + (", and for a logit prior the fraction of weights at its floor" if prior else "")
                  + "; mean ± std over the finished seeds.", "",
                  "| variant | " + " | ".join(c[0] for c in columns) + " |",
                  "|---" * (len(columns) + 1) + "|"]
        for r in mag:
            lines.append(f"| {r['variant']} | "
                         + " | ".join(_mean_std(r["diagnostics"].get(key), fmt) for _, key, fmt in columns) + " |")
        lines.append("")
    return lines


def _accuracy_table(results: dict, heading: str) -> list[str]:
    """Final validation accuracy per variant (mean ± std in %, Welch test against the baseline), when the runs
    logged one (runs trained before accuracy was logged did not: then nothing)."""
    rows = results["variants"]
    if not any((row.get("final_val_accuracy") or {}).get("n") for row in rows):
        return []
    base = results["baseline"]
    lines = [f"{heading} Final validation accuracy", "",
             "Exact match of the argmax: on a task at its answer positions only, on text at every next token.", "",
             f"| variant | seeds | accuracy % (mean ± std) | Δ vs {base} (points) | Welch t | df | p |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        acc, w = row["final_val_accuracy"], row["accuracy_welch_vs_baseline"]
        mean_std = "n/a" if acc["mean"] is None else f"{100 * acc['mean']:.2f} ± {_num(acc['std'] and 100 * acc['std'], '.2f')}"
        d = row["accuracy_delta_vs_baseline"]
        cells = _vs_baseline(row["baseline"], None if d is None else 100 * d, w, ".2f")
        lines.append("| " + " | ".join([row["variant"], str(acc["n"]), mean_std, *cells]) + " |")
    return [*lines, ""]


def results_tables(results: dict, heading: str = "##") -> str:
    """The report's tables without settings and notes: results, accuracy (when logged), per-seed losses and
    accuracies (on a task the seeds' spread is what the mean hides), the loss during training, weight and gate
    diagnostics, under ``heading``-level titles (the docs quote them for the shipped comparisons in ``results/``)."""
    hijack = hijack_tables(results["hijack"], heading) if results.get("hijack") else []
    hijack += length_table(results["length"], heading) if results.get("length") else []
    return "\n".join([*verdict_tables(results, heading), *_table(results), "", *_accuracy_table(results, heading), *hijack,
                      f"{heading} Final validation loss per seed", "", *_seed_table(results),
                      "", *([f"{heading} Final validation accuracy (%) per seed", "",
                             *_seed_table(results, "final_val_accuracy", 100.0, ".2f"), ""] if any(
                          r.get("final_val_accuracy") is not None for row in results["variants"] for r in row["runs"]) else []),
                      *_curve_table(results, heading), *_curve_table(results, heading, "val_accuracy_curve"),
                      *_diagnostics_tables(results, heading)]).rstrip("\n") + "\n"


def render_markdown(results: dict, curves_file: str | None = CURVES_FILE,
                    accuracy_curves_file: str | None = None, delta_file: str | None = None) -> str:
    """report.md: results table, per-seed losses and accuracies, weight and gate diagnostics, settings, notes, runs left out,
    the loss-curve plot, the loss-minus-baseline plot and the accuracy curves (each when it was written)."""
    parts = ["# Attention variant comparison", "", results_tables(results), "## Settings", "",
             *_settings_lines(results), "", "## Notes", "", *_notes(results)]
    problems = _problem_runs(results)
    if problems:
        parts += ["", "## Runs left out of the statistics", "", *problems]
    parts += ["", "## Validation loss curves", ""]
    if curves_file:
        parts.append(f"![validation loss vs tokens, mean ± 1 std over finished seeds]({curves_file})")
    else:
        parts.append("No validation losses logged yet.")
    if delta_file:
        parts += ["", f"![validation loss minus {results['baseline']}'s, mean difference ± 1 standard error]"
                      f"({delta_file})"]
    if accuracy_curves_file:
        parts += ["", "## Validation accuracy curves", "",
                  f"![validation accuracy vs step, mean ± 1 std over finished seeds]({accuracy_curves_file})"]
    if results.get("hijack"):
        parts += ["", "## Hijack sweep plots", "", f"![accuracy at the hijack query against m]({ACCURACY_FILE})", "",
                  f"![retrieval head's mass on the unique binding and the cluster against m]({MASS_FILE})"]
    parts += length_plot_link(results.get("length"))
    return "\n".join(parts) + "\n"


# ------------------------------------------------------------------------------------------------------- writing


def load_spec(out_dir) -> dict:
    """``out_dir/compare.toml``; a missing or malformed one is a one-line ConfigError."""
    path = Path(out_dir) / COMPARE_SPEC_FILE
    if not path.exists():
        raise ConfigError(f"{out_dir} is not a comparison directory (no {COMPARE_SPEC_FILE})")
    spec = load_toml(path)
    if not (isinstance(spec.get("variants"), list) and spec["variants"] and isinstance(spec.get("seeds"), list)
            and isinstance(spec.get("base"), dict)):
        raise ConfigError(f"{path}: expected variants = [...], seeds = [...] and a [base] table")
    return spec


def read_results(out_dir) -> tuple[dict, list[RunRecord]]:
    """The numbers of the comparison in ``out_dir`` as its directory holds them now (see :func:`compute_results`),
    and its run records."""
    spec = load_spec(out_dir)
    records = collect_runs(out_dir, spec["variants"], spec["seeds"])
    return compute_results(spec, records), records


def export_comparison(out_dir, dest) -> Path:
    """Copy the comparison in ``out_dir`` to ``dest`` without its checkpoints, for sharing or committing:
    ``compare.toml`` and, of every run that has a summary (finished or diverged), the files in
    :data:`SHIPPED_RUN_FILES` (and any :data:`SHIPPED_RUN_GLOBS`, e.g. ``swap-*.json``); runs still going or missing
    are left out. Then write the report in ``dest`` (the
    same numbers as in ``out_dir``: the report reads nothing else) and return its path. Files of ``dest`` that
    are not the comparison's own are left alone; the copied ones are replaced atomically."""
    out_dir, dest = Path(out_dir), Path(dest)
    spec = load_spec(out_dir)
    if dest.resolve() == out_dir.resolve():
        raise ConfigError(f"--export {dest}: the destination is the comparison directory itself")
    dest.mkdir(parents=True, exist_ok=True)
    write_text(dest / COMPARE_SPEC_FILE, (out_dir / COMPARE_SPEC_FILE).read_text(encoding="utf-8"))
    for variant in spec["variants"]:
        for seed in spec["seeds"]:
            src = run_dir(out_dir, variant, seed)
            if (read_summary(src) or {}).get("status") not in DONE_STATUSES:  # missing, still going or interrupted
                continue
            run_dest = run_dir(dest, variant, seed)
            run_dest.mkdir(parents=True, exist_ok=True)
            names = [*SHIPPED_RUN_FILES, *sorted(p.name for g in SHIPPED_RUN_GLOBS for p in src.glob(g))]
            for name in names:
                if (src / name).exists():
                    write_text(run_dest / name, (src / name).read_text(encoding="utf-8"))
    return write_report(dest)


def write_report(out_dir) -> Path:
    """Write results.json, the plots and report.md for the comparison in ``out_dir``; returns report.md. Idempotent:
    the same runs and code give the same files, and a plot is redrawn only when missing or stale (:mod:`.figures`)."""
    out_dir = Path(out_dir)
    results, records = read_results(out_dir)
    write_text(out_dir / RESULTS_FILE, json.dumps(results, indent=2, allow_nan=False) + "\n")
    variants = [row["variant"] for row in results["variants"]]
    # the plots draw neither a run's final accuracy nor the tests over converged runs: neither is in their key
    drawn_results = {**{k: v for k, v in results.items() if k != "primary_converged"}, "variants": [{**row, "runs": [
        {k: v for k, v in run.items() if k != "final_val_accuracy"} for run in row["runs"]]} for row in results["variants"]]}
    key = inputs_key(drawn_results, [(r.variant, r.seed, r.status, r.usable, r.not_converged, r.summary.get("stop_at"),
                                sorted(r.curve.items()), sorted(r.accuracy_curve.items())) for r in records],
                     drawn_by=(plots, hijack_report.plot_hijack, hijack_report.band_line))
    drawn = {CURVES_FILE: plot_loss_curves(records, variants, out_dir / CURVES_FILE, key),
             DELTA_CURVES_FILE: plot_loss_deltas(records, variants, results["baseline"], out_dir / DELTA_CURVES_FILE, key),
             ACCURACY_CURVES_FILE: plot_accuracy_curves(records, variants, out_dir / ACCURACY_CURVES_FILE, key)}
    for name in [n for n, path in drawn.items() if path is None] + ([] if results.get("hijack") else [ACCURACY_FILE, MASS_FILE]):
        (out_dir / name).unlink(missing_ok=True)  # a stale plot would contradict the report
    if results.get("hijack"):
        plot_hijack(results["hijack"], out_dir, key)
    plot_lengths(results.get("length"), out_dir)
    report = out_dir / REPORT_FILE
    write_text(report, render_markdown(results, *(drawn[name].name if drawn[name] else None
                                                  for name in (CURVES_FILE, ACCURACY_CURVES_FILE, DELTA_CURVES_FILE))))
    return report
