"""``attnlab rank-sweep``: one training run per weight decay lambda, then pseudo-rank and validation loss per lambda.

Kobayashi, Akram & von Oswald (2024) show that L2 regularisation of two multiplied matrices (W_q W_k', W_o W_v)
acts as a nuclear-norm penalty on their product, so AdamW's weight decay lowers the rank of attention layers.
attnlab's AdamW decays every nn.Linear weight (attnlab.train.optim), so W_q, W_k, W_v, W_o are all decayed.

Layout of ``out_dir``::

    sweep.toml         the base config (minus out_dir and train.weight_decay) + the lambdas; a different one is refused
    wd<lambda>/        one ordinary training run per lambda, with rank/ (rank.md, rank.json, spectra.png)
    sweep.md           lambda, final val loss, mean pseudo-rank and mean participation ratio per matrix type
    sweep.json         the same numbers (and every per-layer metric)

Rerunning resumes: finished runs are kept, runs with a checkpoint are resumed, others start fresh.
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
from ..rundir import DONE_STATUSES, SUMMARY_FILE, read_summary, sweep_run_dir
from ..rundir import SWEEP_SPEC_FILE as SPEC_FILE
from ..train import load_model, train
from .grid import run_state, spec_differences

__all__ = ["rank_sweep", "sweep_run_dir", "format_sweep_table"]


def _spec(cfg, weight_decays) -> dict:
    import tomli_w

    base = to_dict(cfg)
    base.pop("out_dir", None)
    base.get("train", {}).pop("weight_decay", None)
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
    """The run's rank metrics: from rank/rank.json when written after the run's summary, else a new report."""
    saved = path / "rank" / "rank.json"
    try:
        if saved.stat().st_mtime >= (path / SUMMARY_FILE).stat().st_mtime:
            data = json.loads(saved.read_text(encoding="utf-8"))
            if data.get("mass") == mass:
                return data["metrics"]
    except (OSError, ValueError, KeyError):
        pass
    model, kind = load_model(path)
    return rank_report(model, path / "rank", mass, source=str(path), kind=kind)["metrics"]


def rank_sweep(cfg, weight_decays, out_dir, *, quiet: bool = True, mass: float = MASS) -> dict:
    """Train ``cfg`` once per weight decay (train.weight_decay = lambda, out_dir = wd<lambda>) and report, per
    lambda, the final validation loss and the mean (over layers; over heads too for qk) pseudo-rank and
    participation ratio of each matrix type (:func:`attnlab.analysis.rank.rank_metrics`).
    Writes sweep.md / sweep.json into ``out_dir`` and returns {"rows": [...], "table": markdown}."""
    wds = [float(w) for w in weight_decays]
    if not wds or any(w < 0 for w in wds) or len(set(wds)) != len(wds):
        raise ConfigError(f"weight decays {list(weight_decays)!r} must be a non-empty list of distinct numbers >= 0")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _check_spec(out_dir, _spec(cfg, wds))
    rows = []
    for wd in wds:
        path = sweep_run_dir(out_dir, wd)
        run_cfg = cfg.replace(train=cfg.train.replace(weight_decay=wd), out_dir=str(path))
        if not quiet:
            print(f"weight decay {wd:g}: {path}", flush=True)
        summary = _train_one(run_cfg, path, quiet)
        row = {"weight_decay": wd, "status": summary.get("status"), "final_val_loss": summary.get("final_val_loss"),
               "steps": summary.get("steps"), "run_dir": str(path)}
        if summary.get("status") == "finished":
            row["metrics"] = _rank_metrics(path, mass)
        rows.append(row)
    table = format_sweep_table(rows, mass)
    write_text(out_dir / "sweep.md", f"# Weight-decay sweep: pseudo-rank and validation loss\n\n{table}\n")
    write_text(out_dir / "sweep.json", json.dumps({"mass": mass, "rows": rows}, indent=1) + "\n")
    return {"rows": rows, "table": table, "out_dir": str(out_dir)}


def format_sweep_table(rows: list[dict], mass: float = MASS) -> str:
    """lambda | final val loss | mean pseudo-rank of q, k, v, o, qk | mean participation ratio of the same."""
    head = ["lambda", "final val loss"] + [f"pseudo-rank {m}" for m in MATRICES] + [f"PR {m}" for m in MATRICES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        m = r.get("metrics") or {}
        loss = r.get("final_val_loss")
        cells = [f"{r['weight_decay']:g}", f"{loss:.4f}" if isinstance(loss, (int, float)) else str(r.get("status"))]
        cells += [f"{m[f'pseudo_rank/{x}/mean']:.3f}" if f"pseudo_rank/{x}/mean" in m else "n/a" for x in MATRICES]
        cells += [f"{m[f'participation_ratio/{x}/mean']:.2f}" if f"participation_ratio/{x}/mean" in m else "n/a"
                  for x in MATRICES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + f"\n\npseudo-rank: fraction of singular values holding {mass:.0%} of the squared sum; " \
                              "means over layers (and heads for qk)."
