"""The verdict of a comparison: steps-to-threshold with censored runs, and the primary metric's tests.

Convergence. When the comparison's runs had a stop rule (``train.stop_at``), each run either met it at a step
(its steps-to-threshold) or stopped at the cap ``train.max_steps`` without meeting it: right-censored, "not
converged". Per variant: the number that converged, the Kaplan–Meier median steps-to-threshold (a lower bound when
more than half are censored), and the log-rank test against the baseline (attnlab.experiments.stats).

The primary metric. Declared before the runs (``primary`` in the experiment preset, stored in compare.toml): one
quantity per run, ``val_loss``, ``val_accuracy`` or a key a hook logs at evaluations (e.g.
``hijack/synonym-m32/accuracy``), read at the run's last evaluation, i.e. where it met its threshold or at the cap.
Per variant against the baseline:

- paired over the seeds both variants finished (seed i of both sees the same data order and initialisation draws):
  Student's paired t-test and a bootstrap CI of the mean paired difference; Welch's test and an unpaired bootstrap
  only where fewer than two seeds are shared;
- Holm's adjustment over the family of all the variants' tests against the baseline (the table says so);
- the smallest difference the seeds could have detected (80% power at alpha = 0.05, from the observed spread), so
  that "no difference" is stated with the difference it could have seen.

A level from a run that did not converge is marked wherever it is shown. Where any run did not converge, the same
tests are repeated over the converged runs only (:func:`converged_primary_results`): the first table compares
levels at the threshold with levels at the cap, so part of a difference there can be learning speed; a difference
that holds among converged runs is not only that. Keeping only converged runs selects seeds (those that learned in
time), so this is a check on the first table, not a replacement for it.
"""

from __future__ import annotations

import math
import re

from ..errors import ConfigError
from .stats import (bootstrap_ci, describe, holm, logrank, min_detectable_difference, paired_ttest, threshold_summary,
                    welch_ttest)

__all__ = ["PRIMARY_BUILTIN", "check_primary", "convergence_results", "convergence_table", "converged_primary_results",
           "metric_value", "primary_results", "primary_table", "not_converged_note", "verdict_tables"]

PRIMARY_BUILTIN = {"val_loss": "lower", "val_accuracy": "higher"}
"""The primary metrics every run has, and which way is better; a hook's ``.../accuracy`` key is higher-better."""

ALPHA, POWER = 0.05, 0.8
_HOOK_METRIC = re.compile(r"^[a-z_]+(/[\w.-]+)+$")


def check_primary(metric) -> str:
    """``metric`` if it names a primary metric (``val_loss``, ``val_accuracy``, or a hook's evaluation key such as
    ``hijack/synonym-m32/accuracy``), else a one-line ConfigError."""
    if not (isinstance(metric, str) and (metric in PRIMARY_BUILTIN or _HOOK_METRIC.match(metric))):
        raise ConfigError(f"primary={metric!r} is not a metric; use val_loss, val_accuracy or a key a hook logs at "
                          f"evaluations (e.g. 'hijack/synonym-m32/accuracy')")
    return metric


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def metric_value(record, metric: str) -> float | None:
    """The value of ``metric`` for one run: its final validation loss or accuracy, or a key its hooks logged at
    the last evaluation (``record.diagnostics``); None when it has none."""
    if metric == "val_loss":
        return record.final_val_loss
    if metric == "val_accuracy":
        return record.final_val_accuracy
    value = record.diagnostics.get(metric)
    return float(value) if _finite(value) else None


def better(metric: str) -> str:
    """"lower" or "higher": which way ``metric`` improves."""
    return PRIMARY_BUILTIN.get(metric, "lower" if metric.endswith("loss") else "higher")


# ------------------------------------------------------------------------------------------------ convergence


def _threshold_runs(records) -> list[tuple[int, float, bool]]:
    """(seed, steps, censored) of the finished runs that had a stop rule."""
    out = []
    for r in records:
        s = r.summary
        if r.status != "finished" or not s.get("stop_at"):
            continue
        converged = bool(s.get("converged"))
        steps = s.get("threshold_step") if converged else s.get("steps")
        if _finite(steps):
            out.append((r.seed, float(steps), not converged))
    return out


def convergence_results(records, variants: list[str]) -> dict | None:
    """{"stop_at", "variants": [{variant, n, n_converged, median, median_lower_bound, reason, runs: [{seed,
    steps, converged}], logrank_vs_baseline}]} from the runs' summaries; None when no run had a stop rule."""
    rules = {r.summary.get("stop_at") for r in records if r.summary.get("stop_at")}
    if not rules:
        return None
    runs = {v: _threshold_runs([r for r in records if r.variant == v]) for v in variants}
    base = runs[variants[0]]
    rows = []
    for v in variants:
        mine = runs[v]
        steps, censored = [s for _, s, _ in mine], [c for _, _, c in mine]
        summary = threshold_summary(steps, censored)
        test = None if v == variants[0] else logrank(steps, censored, [s for _, s, _ in base],
                                                      [c for _, _, c in base]).to_dict()
        rows.append({"variant": v, **summary.to_dict(), "n_converged": summary.n_reached,
                     "runs": [{"seed": seed, "steps": int(s), "converged": not c} for seed, s, c in mine],
                     "logrank_vs_baseline": test})
    return {"stop_at": " / ".join(sorted(rules)), "baseline": variants[0], "variants": rows}


def not_converged_note(row: dict | None) -> str:
    """" (k/n not converged)" for a variant some of whose runs hit the cap, else ""."""
    if not row or row["n"] == row["n_converged"]:
        return ""
    return f" ({row['n'] - row['n_converged']}/{row['n']} not converged)"


def convergence_table(conv: dict, heading: str = "##") -> list[str]:
    """Markdown: steps-to-threshold per seed (``>N`` where the run hit its cap N: not converged), the Kaplan–Meier
    median, and the log-rank p against the baseline."""
    seeds = sorted({run["seed"] for row in conv["variants"] for run in row["runs"]})
    lines = [f"{heading} Steps to threshold ({conv['stop_at']})", "",
             "Each run stops at the first evaluation that meets the rule; `>N`: it reached its cap of N steps without "
             "meeting it (not converged, censored). Median: Kaplan–Meier over the seeds (a lower bound `>N` when "
             f"more than half never met it). Log-rank test against {conv['baseline']}.", "",
             "| variant | converged | median steps | " + " | ".join(f"seed {s}" for s in seeds) + " | log-rank p |",
             "|---|---|---|" + "---|" * len(seeds) + "---|"]
    for row in conv["variants"]:
        by_seed = {run["seed"]: run for run in row["runs"]}
        cells = [("" if run["converged"] else ">") + str(run["steps"]) if (run := by_seed.get(s)) else "—"
                 for s in seeds]
        median = (f"{row['median']:.0f}" if row["median"] is not None
                  else f">{row['median_lower_bound']:.0f}" if row["median_lower_bound"] is not None else "n/a")
        test = row["logrank_vs_baseline"]
        p = "(baseline)" if test is None else "n/a" if test["p"] is None else f"{test['p']:.3g}"
        lines.append(f"| {row['variant']} | {row['n_converged']}/{row['n']} | {median} | " + " | ".join(cells)
                     + f" | {p} |")
    return [*lines, ""]


# ------------------------------------------------------------------------------------------------ the primary metric


def _paired_values(records, variant: str, baseline: str, metric: str):
    """(values of variant, values of baseline, paired?): paired over the seeds both have usable runs of (at least
    two; a seed only one side finished is left out of the test), else each side's usable runs, unpaired."""
    def values(v):
        return {r.seed: x for r in records if r.variant == v and r.usable and (x := metric_value(r, metric)) is not None}

    mine, theirs = values(variant), values(baseline)
    shared = sorted(mine.keys() & theirs.keys())
    if len(shared) >= 2:
        return [mine[s] for s in shared], [theirs[s] for s in shared], True
    return list(mine.values()), list(theirs.values()), False


def primary_results(records, variants: list[str], metric: str) -> dict:
    """{"metric", "better", "alpha", "power", "variants": [{variant, summary, n_not_converged, paired, difference,
    ci, test, p_holm, detectable}]}: the primary metric of each variant and its tests against the baseline (the
    first variant), Holm-adjusted over the family of those tests."""
    baseline = variants[0]
    rows, pvalues = [], []
    for v in variants:
        runs = [r for r in records if r.variant == v and r.usable]
        values = [x for r in runs if (x := metric_value(r, metric)) is not None]
        row = {"variant": v, "summary": describe(values).to_dict(),
               "n_not_converged": sum(r.not_converged for r in runs)}
        if v != baseline:
            a, b, paired = _paired_values(records, v, baseline, metric)
            test = (paired_ttest(a, b) if paired else welch_ttest(a, b)).to_dict()
            ci = bootstrap_ci(a, b, paired=paired).to_dict() if a and b else None
            if paired:
                sd = describe([x - y for x, y in zip(a, b)]).std
                detectable = min_detectable_difference(sd, len(a), paired=True) if sd is not None else None
            else:
                sa, sb = describe(a).std, describe(b).std
                pooled = (math.sqrt(((len(a) - 1) * sa ** 2 + (len(b) - 1) * sb ** 2) / (len(a) + len(b) - 2))
                          if None not in (sa, sb) else None)
                detectable = (min_detectable_difference(pooled, len(a), len(b), paired=False)
                              if pooled is not None else None)
            row.update(paired=paired, n_compared=len(a), difference=None if ci is None else ci["difference"],
                       ci=ci, test=test, detectable=detectable)
            pvalues.append(test["p"])
        rows.append(row)
    adjusted = iter(holm(pvalues))
    for row in rows[1:]:
        row["p_holm"] = next(adjusted)
    return {"metric": metric, "better": better(metric), "baseline": baseline, "alpha": ALPHA, "power": POWER,
            "variants": rows}


def converged_primary_results(records, variants: list[str], metric: str) -> dict | None:
    """:func:`primary_results` over the runs that met their threshold only (paired over the seeds where both
    variants converged). None where it would say nothing: no run of ``variants`` was censored (the first table
    already is that), the primary metric is the stop rule's own (every converged run sits at the threshold), or no
    test is defined over the converged runs (e.g. the baseline has none)."""
    from ..train.config import StopRule

    runs = [r for r in records if r.variant in variants and r.usable]
    if not any(r.not_converged for r in runs) or any(
            r.summary.get("stop_at") and StopRule.parse(r.summary["stop_at"]).metric == metric for r in runs):
        return None
    converged = primary_results([r for r in records if not r.not_converged], variants, metric)
    return converged if any(row.get("test", {}).get("p") is not None for row in converged["variants"]) else None


def _fmt(metric: str):
    """A value formatter: accuracies in % with 2 decimals, anything else with 4 decimals."""
    if "accuracy" in metric:
        return lambda x: f"{100 * x:.2f}"
    return lambda x: f"{x:.4f}"


def primary_table(primary: dict, heading: str = "##", converged_only: bool = False) -> list[str]:
    """Markdown: the primary metric per variant (mean ± std over seeds, runs not converged marked), the difference
    from the baseline with its 95% bootstrap CI, the test's p, Holm's p, and the difference the seeds could have
    detected. ``converged_only``: the table of :func:`converged_primary_results`, titled and described as such."""
    metric, base = primary["metric"], primary["baseline"]
    f = _fmt(metric)
    unit = " (%)" if "accuracy" in metric else ""
    if converged_only:
        title = f"{heading} Primary metric over the converged runs only"
        what = ("The tests above again, leaving out every run that reached its cap without meeting the threshold: "
                "the table above compares levels at the threshold with levels still changing at the cap, so part "
                "of a difference there can be learning speed. Keeping only converged runs also keeps only the "
                "seeds that learned in time, so this checks the table above and does not replace it. Mean ± std "
                "over the converged runs; paired over the seeds where both variants converged.")
    else:
        title = f"{heading} Primary metric: {metric}"
        what = (f"Declared before the runs; {primary['better']} is better. Mean ± std over the finished seeds at "
                f"each run's last evaluation (where it met its threshold, or at its cap). Difference from {base} "
                "with a 95% bootstrap CI (BCa); paired over the seeds both variants finished (same data order; "
                "`pairs` counts them), Welch where fewer than two are shared.")
    family = len(primary["variants"]) - 1
    tested = sum(row["test"]["p"] is not None for row in primary["variants"][1:])
    tests = f"{tested} test{'' if tested == 1 else 's'} against {base}" + ("" if tested == family else
                                                 f" that the runs allow (of {family}: too few runs for the rest)")
    lines = [title, "",
             f"{what} Holm's adjustment over the {tests}. Detectable: "
             f"the difference the seeds would detect with {primary['power']:.0%} power at alpha = "
             f"{primary['alpha']} (from the observed spread).", "",
             f"| variant | seeds | {metric}{unit} | difference | 95% CI | test | pairs | p | Holm p | detectable |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for row in primary["variants"]:
        s = row["summary"]
        level = "n/a" if s["mean"] is None else f(s["mean"]) + ("" if s["std"] is None else f" ± {f(s['std'])}")
        if row["n_not_converged"]:
            level += f" ({row['n_not_converged']} not converged)"
        if row["variant"] == base:
            lines.append(f"| {row['variant']} | {s['n']} | {level} | (baseline) | — | — | — | — | — | — |")
            continue
        ci, test = row["ci"] or {}, row["test"]
        diff = "n/a" if row["difference"] is None else ("+" if row["difference"] >= 0 else "−") + f(abs(row["difference"]))
        interval = ("n/a" if ci.get("low") is None else f"[{f(ci['low'])}, {f(ci['high'])}]")
        p = "n/a" if test["p"] is None else f"{test['p']:.3g}"
        ph = "n/a" if row["p_holm"] is None else f"{row['p_holm']:.3g}"
        det = "n/a" if row["detectable"] is None else f(row["detectable"])
        kind, pairs = ("paired t", row["n_compared"]) if row["paired"] else ("Welch", "—")  # Welch pairs no seeds
        lines.append(f"| {row['variant']} | {s['n']} | {level} | {diff} | {interval} | {kind} | {pairs} | "
                     f"{p} | {ph} | {det} |")
    return [*lines, ""]


def verdict_tables(results: dict, heading: str = "##") -> list[str]:
    """Markdown: the primary metric's table, its repetition over the converged runs where some run was censored,
    and the steps-to-threshold table, each where the results have it."""
    return [*(primary_table(results["primary"], heading) if results.get("primary") else []),
            *(primary_table(c, heading, converged_only=True) if (c := results.get("primary_converged")) else []),
            *(convergence_table(results["convergence"], heading) if results.get("convergence") else [])]
