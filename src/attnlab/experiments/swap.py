"""``attnlab swap RUN_DIR --attention VARIANT``: a trained model evaluated with its attention switched at test time.

The ablation behind a prior's verdict: switch magnitude's logit prior off in a model trained with it (does the
trained model still need it, or did it only speed learning?), and on in a model trained without it (does the prior
alone stop a cluster, without training for it?). The swapped model keeps every trained parameter whose name and
shape it shares with the run (the projections, MLPs, embeddings); parameters only the new attention has (e.g. the
magnitude gate's t) start from their initial values (seeded); parameters only the run has are dropped. Both models
are evaluated on the same fixed sequences: the task's answer accuracy on its own distribution, and on a hijack task
every cell of its sweep (attnlab.train.hooks.HijackSweepHook: the accuracy at the hijack query and the retrieval
head's mass on the unique binding and on the cluster).

Written to ``RUN_DIR/swap-<variant>.json``: {"run", "attention", "parameters": {"copied", "new", "dropped"},
"original": {metric: value}, "swapped": {metric: value}}.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..atomic import write_text
from ..data.task_source import task_name
from ..errors import ConfigError
from ..model import GPT
from ..rundir import comparison_run_dir, read_summary
from ..tasks import get_task
from ..train import load_run
from ..train.hooks import HijackSweepHook
from ..analysis.task_mass import task_accuracy
from ..registry import variant_info
from .report import load_spec
from .stats import describe, paired_ttest

__all__ = ["swap_attention", "evaluate_swap", "swap_table", "swap_comparison", "swap_summary",
           "swap_summary_table"]

def swap_attention(model: GPT, attention: str, seed: int = 0) -> tuple[GPT, dict]:
    """A copy of ``model`` with ``model.config.attention`` replaced by the variant ``attention``: (new model in eval
    mode, {"copied", "new", "dropped"}: the parameter names copied from ``model``, left at their initial values
    (initialised under ``torch.manual_seed(seed)``), and not used)."""
    variant_info(attention)  # an unknown name is a one-line ConfigError
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        swapped = GPT(model.config.replace(attention=attention))
    old, new = model.state_dict(), swapped.state_dict()
    copied = [k for k in new if k in old and old[k].shape == new[k].shape]
    swapped.load_state_dict({**new, **{k: old[k] for k in copied}})
    return swapped.to(next(model.parameters()).device).eval(), {
        "copied": copied, "new": [k for k in new if k not in copied],
        "dropped": [k for k in old if k not in new or old[k].shape != new[k].shape]}


def _evaluate(model: GPT, task) -> dict:
    out = {"accuracy": task_accuracy(model, task)}
    if hasattr(task, "sweep"):  # a hijack task
        out.update(HijackSweepHook(task).eval_stats(model))
    return out


def evaluate_swap(run_dir, attention: str) -> dict:
    """The run's trained model and the same weights under ``attention``, evaluated on the run's task; written to
    ``RUN_DIR/swap-<attention>.json`` and returned (see the module docstring)."""
    run_dir = Path(run_dir)
    model, _, cfg = load_run(run_dir)
    name = task_name(cfg.data.source)
    if name is None:
        raise ConfigError(f"{run_dir} was trained on {cfg.data.source!r}; swap evaluates runs on a task "
                          f"(data.source = 'task:NAME')")
    task = get_task(name, cfg.data.task or {})
    swapped, params = swap_attention(model, attention, cfg.train.seed)
    result = {"run": str(run_dir), "trained_with": cfg.variant_name, "attention": attention, "parameters": params,
              "original": _evaluate(model, task), "swapped": _evaluate(swapped, task)}
    write_text(run_dir / f"swap-{attention}.json", json.dumps(result, indent=2) + "\n")
    return result


def swap_table(result: dict) -> str:
    """Markdown: each metric of the original model and of the swapped one."""
    lines = [f"| metric | trained ({result['trained_with']}) | swapped to {result['attention']} |", "|---|---|---|"]
    for key, value in result["original"].items():
        lines.append(f"| {key} | {value:.4f} | {result['swapped'][key]:.4f} |")
    return "\n".join(lines) + "\n"


def swap_comparison(out_dir, trained: str, attention: str) -> list[dict]:
    """:func:`evaluate_swap` on every finished run of variant ``trained`` in the comparison ``out_dir`` (each writes
    its ``swap-<attention>.json``, which ``attnlab report --export`` ships); the results, by seed."""
    spec = load_spec(out_dir)
    if trained not in spec["variants"]:
        raise ConfigError(f"{out_dir} has no variant {trained!r}; it has {', '.join(spec['variants'])}")
    runs = [comparison_run_dir(out_dir, trained, seed) for seed in spec["seeds"]]
    done = [r for r in runs if (read_summary(r) or {}).get("status") == "finished"]
    if not done:
        raise ConfigError(f"{out_dir}: no finished run of {trained!r} to evaluate yet")
    return [evaluate_swap(r, attention) for r in done]


def swap_summary(out_dir, metrics: list[str]) -> list[dict]:
    """Every ``<variant>/seed<k>/swap-<attention>.json`` of a comparison, summarised per (trained variant, attention):
    {"trained", "attention", "n", "metrics": {metric: {"original", "swapped": Summary dicts, "test": paired t-test of
    swapped against original over the seeds}}}, for each of ``metrics``."""
    out_dir = Path(out_dir)
    groups: dict[tuple[str, str], list[dict]] = {}
    for path in sorted(out_dir.glob("*/seed*/swap-*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        groups.setdefault((path.parents[1].name, result["attention"]), []).append(result)
    rows = []
    for (trained, attention), results in groups.items():
        cells = {}
        for metric in metrics:
            pairs = [(r["original"][metric], r["swapped"][metric]) for r in results
                     if metric in r["original"] and metric in r["swapped"]]
            original, swapped = [a for a, _ in pairs], [b for _, b in pairs]
            cells[metric] = {"original": describe(original).to_dict(), "swapped": describe(swapped).to_dict(),
                             "test": paired_ttest(swapped, original).to_dict()}
        rows.append({"trained": trained, "attention": attention, "n": len(results), "metrics": cells})
    return rows


def swap_summary_table(out_dir, metrics: list[str]) -> str:
    """Markdown over a comparison's swap evaluations: per trained variant and test-time attention, each metric as
    trained -> swapped (mean ± std in % over the seeds, the paired t-test's p)."""
    rows = swap_summary(out_dir, metrics)
    if not rows:
        return "No swap evaluations saved yet.\n"
    pct = lambda d: "n/a" if d["mean"] is None else f"{100 * d['mean']:.1f}" + (  # noqa: E731
        "" if d["std"] is None else f" ± {100 * d['std']:.1f}")
    lines = ["| trained with | evaluated with | seeds | " + " | ".join(metrics) + " |",
             "|---|---|---|" + "---|" * len(metrics)]
    for row in rows:
        cells = []
        for metric in metrics:
            c = row["metrics"][metric]
            p = c["test"]["p"]
            cells.append(f"{pct(c['original'])} -> {pct(c['swapped'])}" + ("" if p is None else f" (p {p:.2g})"))
        lines.append(f"| `{row['trained']}` | `{row['attention']}` | {row['n']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
