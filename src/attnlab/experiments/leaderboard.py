"""The leaderboard: every variant against every benchmark, read from shipped comparisons (``results/<name>/``).

A *benchmark* is a training setup (the comparison's base config: task or corpus, model, budget); comparisons with the
same base config are one benchmark split over several grids, so their variants share a column. Each variant is
measured against the ``standard`` runs of its own comparison (same seeds, data order and machine):

- the metric: the comparison's declared primary metric where it has one, else the final validation accuracy on a
  task, else the final validation loss on a corpus;
- the difference from ``standard`` with a 95% CI: the report's BCa bootstrap interval for a primary metric, else
  Welch's t interval from the per-variant mean, std and seed count;
- the test against ``standard`` Holm-adjusted over the comparison's variants (the family the study pages adjust
  over): the report's for a primary metric, else Holm over the comparison's Welch tests. A variant is called
  better or worse only where its interval lies on one side of 0 *and* its adjusted test rejects at 0.05;
- steps to threshold where the comparison stops runs at a threshold, with the runs that hit their cap counted as
  not converged;
- training speed relative to ``standard`` (tokens per second on the same machine in the same comparison; n/a where
  the variant's runs and the baseline's trained on different devices; marked where the baseline's runs were trained
  by another comparison and reused, so that the two were not timed side by side).

:func:`leaderboard` builds the rows, :func:`leaderboard_tables` the markdown (a section per family of mechanisms)
and :func:`plot_leaderboard` the heatmap.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from ..rundir import RESULTS_FILE
from .stats import holm

ALPHA = 0.05
"""The family-wise error rate at which the leaderboard calls a variant better or worse."""

FAMILIES = ("softmax", "magnitude", "controls", "dilution", "projections", "heads")
"""Families of mechanisms, by the AttentionConfig table a variant changes (see :func:`family`)."""

FAMILY_TITLES = {"softmax": "Softmax and its kernels, masks and K/V sharing",
                 "magnitude": "Magnitude Attention",
                 "controls": "Controls for magnitude (duplicate count, temperature)",
                 "dilution": "Other answers to attention dilution",
                 "projections": "Boneless, low-rank and latent projections",
                 "heads": "Head recombination",
                 "other": "Other"}


def family(variant: str) -> str:
    """The family of a registered variant: ``magnitude`` (a magnitude table), ``controls`` (the count prior or a
    fixed temperature), ``dilution`` (another answer to attention dilution: SSMax, softpick, stick-breaking,
    an output gate, a sink, selective attention,
    differential attention),
    ``projections`` (any projection switch), ``heads`` (a head mix), else ``softmax``; ``other`` for a name the
    registry does not know."""
    from ..registry import variant_info, variants
    from ..switches import MECHANISM_NORMALIZERS

    if variant not in variants():
        return "other"
    cfg, base = variant_info(variant).config, variant_info("standard").config
    if cfg.magnitude is not None:
        return "magnitude"
    if cfg.count_prior or cfg.temperature != base.temperature:
        return "controls"
    if cfg.ssmax or cfg.normalizer in MECHANISM_NORMALIZERS or cfg.output_gate or cfg.sink \
            or cfg.selective or cfg.differential:
        return "dilution"
    if cfg.projections != base.projections:
        return "projections"
    if cfg.heads != base.heads:
        return "heads"
    return "softmax"


@dataclass(frozen=True)
class Entry:
    """One variant in one comparison. Accuracy metrics are in %, losses in nats per token."""

    variant: str
    family: str
    comparison: str
    benchmark: str
    metric: str
    higher_is_better: bool
    n: int
    mean: float | None
    std: float | None
    delta: float | None = None
    low: float | None = None
    high: float | None = None
    ci_method: str = ""
    n_not_converged: int = 0
    steps_median: float | None = None
    steps_lower_bound: bool = False
    speed: float | None = None
    baseline_not_converged: int = 0
    speed_apart: bool = False  # the baseline's runs were trained by another comparison: not timed side by side
    p_holm: float | None = None  # the test against standard, Holm-adjusted over the comparison's variants

    @property
    def side(self) -> int:
        """+1: the CI lies on the better side of 0; -1: on the worse side; 0: it covers 0 (or there is none)."""
        if self.low is None or self.high is None:
            return 0
        sign = 1 if self.higher_is_better else -1
        if self.low > 0:
            return sign
        if self.high < 0:
            return -sign
        return 0

    @property
    def verdict(self) -> int:
        """The side of the CI where the Holm-adjusted test also rejects at 0.05, else 0 (no test: 0)."""
        return self.side if self.p_holm is not None and self.p_holm < ALPHA else 0


def _welch_interval(a: dict, b: dict, confidence: float = 0.95) -> tuple[float, float] | None:
    """Welch's t interval for mean(a) - mean(b) from {n, mean, std} summaries; None with fewer than 2 in either."""
    from scipy import stats

    if min(a.get("n") or 0, b.get("n") or 0) < 2 or a.get("std") is None or b.get("std") is None:
        return None
    va, vb = a["std"] ** 2 / a["n"], b["std"] ** 2 / b["n"]
    se = math.sqrt(va + vb)
    if se == 0:
        return (a["mean"] - b["mean"],) * 2
    df = (va + vb) ** 2 / (va ** 2 / (a["n"] - 1) + vb ** 2 / (b["n"] - 1))
    half = stats.t.ppf(0.5 + confidence / 2, df) * se
    diff = a["mean"] - b["mean"]
    return diff - half, diff + half


# How a benchmark's label names its positions; GPT-2's learned positions, the model's default, go unnamed.
POSITION_LABELS = {"none": ", no positions", "sinusoidal": ", sinusoidal positions", "rope": ", RoPE", "alibi": ", ALiBi"}


def _benchmark_label(base: dict) -> str:
    data, model, train = base["data"], base["model"], base["train"]
    source = data.get("source", "")
    what = source.removeprefix("task:") if source.startswith("task:") else f"{source} (language model)"
    budget = f"cap {train['max_steps']}" if train.get("stop_at") else f"{train['max_steps']} steps"
    device = train.get("device") or "auto"
    positions = POSITION_LABELS.get(model.get("pos_encoding", "learned"), "")
    return (f"{what}, {model['n_layer']}x{model['n_embd']}{positions}, {budget}"
            + ("" if device in ("cpu", "auto") else f", {device}"))


def leaderboard(results_root, names: list[str]) -> list[Entry]:
    """The rows of the comparisons ``results_root/<name>`` (each with a results.json from ``attnlab report``)."""
    rows, benchmarks = [], []  # benchmarks: [(base config, label)]
    for name in names:
        results = json.loads((Path(results_root) / name / RESULTS_FILE).read_text(encoding="utf-8"))
        base = results["base_config"]
        match = next((label for config, label in benchmarks if config == base), None)
        if match is None:
            match = _benchmark_label(base)
            if any(label == match for _, label in benchmarks):
                match = f"{match} ({name})"
            benchmarks.append((base, match))
        rows += _entries(name, match, results, _runs(Path(results_root) / name))
    return rows


def _runs(directory: Path) -> dict[str, set[tuple[str, str]]]:
    """{variant: (device, comparison directory) of each of its runs}, from the runs' summary.json: a baseline can be
    copied from an earlier comparison, run on another machine or at another time."""
    found: dict[str, set[tuple[str, str]]] = {}
    for summary in directory.glob("*/seed*/summary.json"):
        run = json.loads(summary.read_text(encoding="utf-8"))
        trained_in = Path(run.get("run_dir") or run.get("out_dir") or summary.parent).parent.parent.name
        found.setdefault(summary.parent.parent.name, set()).add((run.get("device"), trained_in))
    return found


def _entries(name: str, benchmark: str, results: dict, runs: dict[str, set[tuple[str, str]]]) -> list[Entry]:
    by_variant = {row["variant"]: row for row in results["variants"]}
    baseline = by_variant[results["baseline"]]
    convergence = {row["variant"]: row for row in (results.get("convergence") or {}).get("variants", [])}
    primary = results.get("primary")
    task = results["base_config"]["data"].get("source", "").startswith("task:")
    base_conv = convergence.get(results["baseline"])
    base_converged = {r["seed"]: r["converged"] for r in base_conv["runs"]} if base_conv else {}
    welch = "accuracy_welch_vs_baseline" if task else "welch_vs_baseline"
    tested = [v for v, row in by_variant.items() if v != results["baseline"] and (row.get(welch) or {}).get("p") is not None]
    welch_holm = dict(zip(tested, holm([by_variant[v][welch]["p"] for v in tested])))
    out = []
    for variant, row in by_variant.items():
        conv = convergence.get(variant, {})
        # the seeds this variant ran, which it is compared with the baseline on
        compared = ({r["seed"] for r in conv.get("runs", [])} or set(base_converged)) & set(base_converged)
        mine, theirs = runs.get(variant, set()), runs.get(results["baseline"], set())
        same_machine = {d for d, _ in mine} == {d for d, _ in theirs}  # else tokens/s compare machines
        apart = {c for _, c in mine} != {c for _, c in theirs}  # the baseline's runs were trained elsewhere
        speed = (row["tokens_per_s_mean"] / baseline["tokens_per_s_mean"]
                 if row.get("tokens_per_s_mean") and baseline.get("tokens_per_s_mean") and same_machine else None)
        common = dict(variant=variant, family=family(variant), comparison=name, benchmark=benchmark, speed=speed,
                      speed_apart=speed is not None and apart,
                      steps_median=conv.get("median") if conv.get("median") is not None else conv.get("median_lower_bound"),
                      steps_lower_bound=conv.get("median") is None and conv.get("median_lower_bound") is not None,
                      n_not_converged=(conv["n"] - conv["n_converged"]) if conv else 0,
                      baseline_not_converged=0 if variant == results["baseline"] else
                      sum(not base_converged[seed] for seed in compared))
        if primary:
            p = next(v for v in primary["variants"] if v["variant"] == variant)
            scale = 100.0 if primary["metric"].endswith("accuracy") else 1.0
            ci = p.get("ci") or {}
            s = p["summary"]
            out.append(Entry(metric=primary["metric"] + (" (%)" if scale == 100 else ""), p_holm=p.get("p_holm"),
                             higher_is_better=primary["better"] == "higher", n=s["n"],
                             mean=_scaled(s.get("mean"), scale), std=_scaled(s.get("std"), scale),
                             delta=_scaled(p.get("difference"), scale), low=_scaled(ci.get("low"), scale),
                             high=_scaled(ci.get("high"), scale), ci_method="BCa bootstrap" if ci.get("low") is not None else "",
                             **common))
            continue
        key, scale = ("final_val_accuracy", 100.0) if task else ("final_val_loss", 1.0)
        s, b = row.get(key) or {}, baseline.get(key) or {}
        interval = None if variant == results["baseline"] else _welch_interval(s, b)
        out.append(Entry(metric="final val accuracy (%)" if task else "final val loss",
                         higher_is_better=task, n=s.get("n") or 0, mean=_scaled(s.get("mean"), scale),
                         std=_scaled(s.get("std"), scale),
                         delta=None if variant == results["baseline"] or s.get("mean") is None or b.get("mean") is None
                         else scale * (s["mean"] - b["mean"]),
                         low=_scaled(interval and interval[0], scale), high=_scaled(interval and interval[1], scale),
                         ci_method="Welch t" if interval else "", p_holm=welch_holm.get(variant), **common))
    return out


def _scaled(value, scale: float):
    return None if value is None else scale * value


def _number(value: float | None, metric: str, signed: bool = False) -> str:
    if value is None:
        return "n/a"
    digits = 2 if "%" in metric else 4
    return f"{value:+.{digits}f}" if signed else f"{value:.{digits}f}"


def _cell_delta(e: Entry) -> str:
    if e.delta is None:
        return "(baseline)"
    interval = f" [{_number(e.low, e.metric, True)}, {_number(e.high, e.metric, True)}]" if e.low is not None else " (no CI)"
    mark = {1: " **better**", -1: " **worse**", 0: ""}[e.verdict]
    if e.side and not e.verdict:  # an interval clear of 0 that the adjusted test does not back
        mark = " (Holm p = n/a)" if e.p_holm is None else f" (Holm p = {e.p_holm:.3g})"
    runs = "run" if e.baseline_not_converged == 1 else "runs"
    against = f" (against a `standard` with {e.baseline_not_converged} {runs} not converged)" if e.baseline_not_converged else ""
    return _number(e.delta, e.metric, True) + interval + mark + against


SPEED_APART = ("†: `standard`'s runs were trained by an earlier comparison and reused here, so the variant and the "
               "baseline were not timed side by side (same kind of machine, another time and load): a rough ratio.")


def _cell_steps(e: Entry) -> str:
    if e.steps_median is None:
        return "—"
    median = f">{e.steps_median:.0f}" if e.steps_lower_bound else f"{e.steps_median:.0f}"
    return median + (f" ({e.n_not_converged}/{e.n} not converged)" if e.n_not_converged else "")


def _cell_value(e: Entry) -> str:
    value = _number(e.mean, e.metric) + (f" ± {_number(e.std, e.metric)}" if e.std is not None else "")
    return value + (f" ({e.n_not_converged} not converged)" if e.n_not_converged and e.steps_median is None else "")


def leaderboard_tables(entries: list[Entry], link) -> str:
    """A section per family: each variant on each benchmark against that comparison's ``standard``; ``link(name)``
    gives the markdown link of a comparison's page. Then the baselines themselves."""
    lines = []
    for fam in (*FAMILIES, "other"):
        rows = [e for e in entries if e.family == fam and e.delta is not None]
        if not rows:
            continue
        better = sum(e.verdict == 1 for e in rows)
        worse = sum(e.verdict == -1 for e in rows)
        lines += [f"### {FAMILY_TITLES[fam]}", "",
                  f"{len(rows)} variant-benchmark pairs: {better} better than `standard` (95% CI on the better side "
                  f"and Holm p < {ALPHA}), {worse} worse, {len(rows) - better - worse} not distinguishable.", "",
                  *([SPEED_APART, ""] if any(e.speed_apart for e in rows) else []),
                  "| variant | benchmark | Δ vs standard [95% CI] | value (mean ± std) | seeds | steps to threshold "
                  "| speed vs standard | metric | comparison |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for e in sorted(rows, key=lambda e: (e.variant, e.benchmark)):
            speed = f"{e.speed:.2f}x" + "†" * e.speed_apart if e.speed is not None else "n/a"
            lines.append(f"| `{e.variant}` | {e.benchmark} | {_cell_delta(e)} | {_cell_value(e)} | {e.n} | "
                         f"{_cell_steps(e)} | {speed} | {e.metric} | {link(e.comparison)} |")
        lines.append("")
    base = [e for e in entries if e.delta is None]
    lines += ["### The baselines", "", "`standard` in each comparison: the reference its variants are measured against.",
              "", "| benchmark | value (mean ± std) | seeds | steps to threshold | metric | comparison |",
              "|---|---|---|---|---|---|"]
    for e in base:
        lines.append(f"| {e.benchmark} | {_cell_value(e)} | {e.n} | {_cell_steps(e)} | {e.metric} | {link(e.comparison)} |")
    return "\n".join(lines) + "\n"


def plot_leaderboard(entries: list[Entry], path, key: str | None = None) -> Path:
    """The heatmap: variants (grouped by family) against benchmarks; green where the verdict is better (the 95% CI
    of the difference from ``standard`` on the better side and the Holm-adjusted test rejecting), red where it is
    worse, grey otherwise, blank where not run; each
    cell printed with its difference (points of accuracy, or nats), ``nc`` when some seeds did not converge."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.colors import ListedColormap
    from matplotlib.figure import Figure

    from .figures import is_current, save_figure

    if is_current(path, key):
        return Path(path)
    rows = [e for e in entries if e.delta is not None]
    order = {f: i for i, f in enumerate((*FAMILIES, "other"))}
    variants = sorted({e.variant for e in rows}, key=lambda v: (order[family(v)], v))
    benchmarks = list(dict.fromkeys(e.benchmark for e in rows))
    grid = [[math.nan] * len(benchmarks) for _ in variants]
    fig = Figure(figsize=(2.2 + 1.05 * len(benchmarks), 1.2 + 0.32 * len(variants)), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for e in rows:
        i, j = variants.index(e.variant), benchmarks.index(e.benchmark)
        grid[i][j] = e.verdict
        text = _number(e.delta, e.metric, True).replace("+0.", "+.").replace("-0.", "-.")
        ax.text(j, i, text + (" nc" if e.n_not_converged else "") + (" (b nc)" if e.baseline_not_converged else ""),
                ha="center", va="center", fontsize=6.5)
    ax.imshow(grid, cmap=ListedColormap(["#e8a39b", "#d9d9d9", "#9bd3a0"]), vmin=-1.5, vmax=1.5, aspect="auto")
    ax.set_xticks(range(len(benchmarks)), benchmarks, rotation=40, ha="right", fontsize=7)
    ax.set_yticks(range(len(variants)), [f"{v} ({family(v)})" for v in variants], fontsize=7)
    ax.set_title("Difference from standard in the same comparison: green better, red worse (95% CI and Holm), grey neither; "
                 "nc: some runs not converged; (b nc): some of standard's", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path, key)
