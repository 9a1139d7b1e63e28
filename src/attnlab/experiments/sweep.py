"""``attnlab rank-sweep``: training runs per weight decay lambda and seed, then pseudo-rank and validation loss per
lambda, each lambda's difference from the first one with a confidence interval and a Holm-corrected test.

Kobayashi, Akram & von Oswald (2024) show that L2 regularisation of two multiplied matrices (W_q W_k', W_o W_v)
acts as a nuclear-norm penalty on their product, so AdamW's weight decay lowers the rank of attention layers.
attnlab's AdamW decays every nn.Linear weight (attnlab.train.optim), so W_q, W_k, W_v, W_o are all decayed.

Layout of ``out_dir``::

    sweep.toml         the base config (minus out_dir, train.weight_decay and train.seed) + the lambdas; a
                       different one is refused (more seeds are not a different sweep: they extend it)
    wd<lambda>/seed<k>/  one ordinary training run per (lambda, seed), with rank/ (rank.md, rank.json, spectra.png)
    sweep.md           the three tables of :func:`sweep_tables`
    sweep.json         the same numbers (and every per-layer metric of every run)

The statistics: a seed fixes the initialisation and the data order (attnlab.train), so runs of two lambdas with the
same seed differ only in the weight decay and are compared as pairs: the mean of the paired differences, its BCa
bootstrap 95% interval, Student's paired t-test, the smallest difference the pairs could detect (80% power,
alpha 0.05), and Holm's correction over the whole family (every lambda after the first x every metric of
:data:`TESTED`), all from :mod:`attnlab.experiments.stats`. Pseudo-ranks are multiples of 1/n for an n-column
matrix, so a difference that is the same in every seed has no t-test (the table says so).

Rerunning resumes: finished runs are kept, runs with a checkpoint are resumed, others start fresh.
:func:`write_sweep_report` rewrites sweep.md and sweep.json from the runs a directory holds (no training); a
directory exported with :func:`export_sweep` (no checkpoints) keeps each run's rank/rank.json, so it reports too.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from pathlib import Path

from ..analysis.rank import MASS, MATRICES, rank_report
from ..atomic import write_text
from ..configio import load_toml, save_toml, to_dict
from ..errors import ConfigError
from ..rundir import CHECKPOINT_DIR, DONE_STATUSES, SHIPPED_RUN_FILES, SUMMARY_FILE, read_summary, sweep_run_dir
from ..rundir import SWEEP_SPEC_FILE as SPEC_FILE
from ..train import load_model, train
from .grid import run_state, spec_differences
from .stats import bootstrap_ci, describe, holm, mean_std_text, min_detectable_difference, paired_ttest

__all__ = ["TESTED", "export_sweep", "rank_sweep", "sweep_report", "sweep_run_dir", "sweep_tables", "write_sweep_report"]

TESTED = ("final_val_loss",) + tuple(f"pseudo_rank/{m}/mean" for m in MATRICES)
"""The metrics each lambda is tested on against the first lambda: the final validation loss and the mean (over
layers; over heads too for qk) pseudo-rank of each matrix type."""


def _spec(cfg, weight_decays) -> dict:
    import tomli_w

    base = to_dict(cfg)
    base.pop("out_dir", None)
    base.get("train", {}).pop("weight_decay", None)
    base.get("train", {}).pop("seed", None)
    return tomllib.loads(tomli_w.dumps({"weight_decays": [float(w) for w in weight_decays], "base": base}))


def _check_spec(out_dir: Path, spec: dict) -> None:
    path = out_dir / SPEC_FILE
    if not path.exists():
        save_toml(spec, path)
        return
    diffs = spec_differences(load_toml(path), spec)
    if diffs:
        raise ConfigError(f"{out_dir} already holds a different sweep ({SPEC_FILE}: {'; '.join(diffs[:5])}); "
                          f"use a new --out, or rerun with the same settings to resume")


def _train_one(cfg, path: Path, quiet: bool) -> dict:
    state = run_state(path)
    if state in DONE_STATUSES:
        return read_summary(path) or {}
    if state == "resume":
        return train(None, resume=path, quiet=quiet)
    if path.exists():  # leftovers of a run killed before its first checkpoint
        shutil.rmtree(path)
    return train(cfg, quiet=quiet)


def _rank_metrics(path: Path, mass: float) -> dict:
    """The run's rank metrics: from rank/rank.json when written after the run's summary, or when the run has no
    checkpoint to recompute them from (an exported run, whose file times a git checkout does not keep); else a
    new report."""
    saved = path / "rank" / "rank.json"
    try:
        if not (path / CHECKPOINT_DIR).exists() or saved.stat().st_mtime >= (path / SUMMARY_FILE).stat().st_mtime:
            data = json.loads(saved.read_text(encoding="utf-8"))
            if data.get("mass") == mass:
                return data["metrics"]
    except (OSError, ValueError, KeyError):
        pass
    model, kind = load_model(path)
    return rank_report(model, path / "rank", mass, source=str(path), kind=kind)["metrics"]


def _seeds(seeds) -> list[int]:
    try:
        out = [int(s) for s in seeds]
    except (TypeError, ValueError):
        out = None
    if not out or any(s < 0 for s in out) or len(set(out)) != len(out) or out != [s for s in seeds]:
        raise ConfigError(f"seeds {seeds!r} must be a non-empty list of distinct integers >= 0")
    return out


def rank_sweep(cfg, weight_decays, out_dir, *, seeds=None, quiet: bool = True, mass: float = MASS) -> dict:
    """Train ``cfg`` once per weight decay and seed (train.weight_decay = lambda, train.seed = seed, out_dir =
    wd<lambda>/seed<k>; ``seeds`` None: the config's one train.seed) and report (:func:`write_sweep_report`).
    Returns {"rows": [...], "stats": [...], "table": markdown, "out_dir": ...}."""
    wds = [float(w) for w in weight_decays]
    if not wds or any(w < 0 for w in wds) or len(set(wds)) != len(wds):
        raise ConfigError(f"weight decays {list(weight_decays)!r} must be a non-empty list of distinct numbers >= 0")
    seeds = [cfg.train.seed] if seeds is None else _seeds(seeds)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_spec(out_dir, _spec(cfg, wds))
    for wd in wds:
        for seed in seeds:
            path = sweep_run_dir(out_dir, wd, seed)
            run_cfg = cfg.replace(train=cfg.train.replace(weight_decay=wd, seed=seed), out_dir=str(path))
            if not quiet:
                print(f"weight decay {wd:g}, seed {seed}: {path}", flush=True)
            if _train_one(run_cfg, path, quiet).get("status") == "finished":
                _rank_metrics(path, mass)
    return write_sweep_report(out_dir, mass=mass)


def _runs(out_dir: Path, mass: float) -> list[dict]:
    """One row per run directory of the sweep (lambdas in sweep.toml's order, seeds ascending)."""
    spec = load_toml(out_dir / SPEC_FILE)
    rows = []
    for wd in spec["weight_decays"]:
        seeds = sorted(int(p.name[4:]) for p in (out_dir / f"wd{wd:g}").glob("seed*") if p.name[4:].isdigit())
        for seed in seeds:
            path = sweep_run_dir(out_dir, wd, seed)
            summary = read_summary(path) or {}
            row = {"weight_decay": float(wd), "seed": seed, "status": summary.get("status"),
                   "final_val_loss": summary.get("final_val_loss"), "steps": summary.get("steps"),
                   "run_dir": str(path)}
            if summary.get("status") == "finished":
                row["metrics"] = _rank_metrics(path, mass)
            rows.append(row)
    return rows


def _value(row: dict, metric: str):
    return row.get("final_val_loss") if metric == "final_val_loss" else (row.get("metrics") or {}).get(metric)


def _statistics(rows: list[dict]) -> list[dict]:
    """Each lambda after the first against the first, on every metric of :data:`TESTED`, paired by seed."""
    done = [r for r in rows if r.get("status") == "finished"]
    wds = list(dict.fromkeys(r["weight_decay"] for r in rows))
    if not wds:
        return []
    base = {r["seed"]: r for r in done if r["weight_decay"] == wds[0]}
    stats = []
    for wd in wds[1:]:
        other = {r["seed"]: r for r in done if r["weight_decay"] == wd}
        seeds = sorted(set(base) & set(other))
        for metric in TESTED:
            a = [_value(other[s], metric) for s in seeds]
            b = [_value(base[s], metric) for s in seeds]
            diffs = describe([x - y for x, y in zip(a, b)]) if seeds else None
            test = paired_ttest(a, b)
            stats.append({"weight_decay": wd, "baseline": wds[0], "metric": metric, "seeds": seeds,
                          "ci": bootstrap_ci(a, b, paired=True).to_dict(), "test": test.to_dict(),
                          "detectable": min_detectable_difference(diffs.std if diffs else None, len(seeds),
                                                                  paired=True)})
    for s, p in zip(stats, holm([s["test"]["p"] for s in stats])):
        s["holm_p"] = p
    return stats


def _num(x, fmt: str) -> str:
    return "n/a" if x is None else format(x, fmt)


def sweep_tables(rows: list[dict], stats: list[dict], mass: float = MASS) -> str:
    """Three markdown tables: per lambda (mean ± std over finished seeds), each lambda against the first (paired
    by seed, Holm over the family), and every run."""
    fmt = {"final_val_loss": ".4f"}
    wds = list(dict.fromkeys(r["weight_decay"] for r in rows))
    head = ["lambda", "seeds", "final val loss"] + [f"pseudo-rank {m}" for m in MATRICES] + [f"PR {m}" for m in MATRICES]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for wd in wds:
        done = [r for r in rows if r["weight_decay"] == wd and r.get("status") == "finished"]
        cells = [f"{wd:g}", str(len(done)), mean_std_text(describe([r["final_val_loss"] for r in done]).to_dict(), ".4f")]
        cells += [mean_std_text(describe([_value(r, f"pseudo_rank/{m}/mean") for r in done]).to_dict(), ".3f")
                  for m in MATRICES]
        cells += [_num(describe([_value(r, f"participation_ratio/{m}/mean") for r in done]).mean, ".2f")
                  for m in MATRICES]
        out.append("| " + " | ".join(cells) + " |")
    out.append(f"\nMean ± std over the finished seeds. Pseudo-rank: the fraction of singular values holding {mass:.0%} "
               "of the squared sum; PR: participation ratio (mean over seeds); means over layers (and heads for qk).")
    if stats:
        out += ["", "| lambda | metric | seeds | difference | 95% CI | paired t p | Holm p | detectable |",
                "|---|---|---|---|---|---|---|---|"]
        for s in stats:
            f = fmt.get(s["metric"], ".3f")
            ci, test = s["ci"], s["test"]
            interval = "n/a" if ci["low"] is None else f"[{ci['low']:+{f}}, {ci['high']:+{f}}]"
            p = _num(test["p"], ".3g") if test["p"] is not None else f"n/a ({test['reason']})"
            metric = s["metric"].replace("pseudo_rank/", "pseudo-rank ").replace("/mean", "").replace("_", " ")
            out.append(f"| {s['weight_decay']:g} | {metric} | {len(s['seeds'])} | {_num(ci['difference'], '+' + f)} | "
                       f"{interval} | {p} | {_num(s['holm_p'], '.3g')} | {_num(s['detectable'], f)} |")
        out.append(f"\nEach lambda minus lambda = {stats[0]['baseline']:g}, paired by seed (same initialisation and "
                   "data order): BCa bootstrap 95% CI, paired t-test, Holm's correction over every row of this table; "
                   "detectable: the difference the pairs detect with 80% power at alpha 0.05.")
    head = ["lambda", "seed", "status", "steps", "final val loss"] + [f"pseudo-rank {m}" for m in MATRICES]
    out += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        loss = r.get("final_val_loss")
        cells = [f"{r['weight_decay']:g}", str(r["seed"]), str(r.get("status")), str(r.get("steps")),
                 _num(loss if isinstance(loss, (int, float)) else None, ".4f")]
        cells += [_num(_value(r, f"pseudo_rank/{m}/mean"), ".3f") for m in MATRICES]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def sweep_report(out_dir, *, mass: float = MASS) -> dict:
    """The rows, statistics and tables of the runs ``out_dir`` holds now, without writing anything (a run without
    a current rank/rank.json gets one); returns what :func:`rank_sweep` does."""
    out_dir = Path(out_dir)
    if not (out_dir / SPEC_FILE).is_file():
        raise ConfigError(f"{out_dir} is not a rank sweep (no {SPEC_FILE}); run `attnlab rank-sweep --out {out_dir}`")
    rows = _runs(out_dir, mass)
    stats = _statistics(rows)
    return {"rows": rows, "stats": stats, "table": sweep_tables(rows, stats, mass), "out_dir": str(out_dir)}


def write_sweep_report(out_dir, *, mass: float = MASS) -> dict:
    """Rewrite sweep.md and sweep.json from the runs ``out_dir`` holds now; returns what :func:`rank_sweep` does."""
    report = sweep_report(out_dir, mass=mass)
    out_dir, rows, stats, table = Path(out_dir), report["rows"], report["stats"], report["table"]
    write_text(out_dir / "sweep.md", f"# Weight-decay sweep: pseudo-rank and validation loss\n\n{table}\n")
    write_text(out_dir / "sweep.json", json.dumps({"mass": mass, "rows": rows, "stats": stats}, indent=1) + "\n")
    return report


def export_sweep(out_dir, dest) -> Path:
    """Copy a sweep to ``dest`` for results/: sweep.toml and, per run, its config, metrics
    and summary with rank/rank.json and rank/rank.md (no checkpoints, no plots): without a checkpoint the
    copied rank.json is what the run's rank metrics are read from. Then write sweep.md and sweep.json there."""
    out_dir, dest = Path(out_dir), Path(dest)
    report = sweep_report(out_dir)
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    shutil.copy2(out_dir / SPEC_FILE, dest / SPEC_FILE)
    for row in report["rows"]:
        src = Path(row["run_dir"])
        to = sweep_run_dir(dest, row["weight_decay"], row["seed"])
        (to / "rank").mkdir(parents=True)
        for name in (*SHIPPED_RUN_FILES, "rank/rank.json", "rank/rank.md"):
            if (src / name).is_file():
                shutil.copy2(src / name, to / name)
    write_sweep_report(dest)  # sweep.md and sweep.json, with run_dir paths into dest
    return dest
