"""``attnlab compare``: several attention variants x several seeds, same data, same token budget, same seeds.

Layout of ``out_dir``::

    compare.toml            the base config (minus out_dir, model.attention, train.seed) + variants + seeds
    <variant>/seed<k>/      one ordinary training run directory per (variant, seed)
    report.md               the statistical report (see :mod:`attnlab.experiments.report`)
    results.json            the same numbers, machine-readable
    loss_curves.png         validation loss vs tokens, mean and ±1 std band per variant

Rerunning the same comparison resumes it: finished runs are skipped, runs with a checkpoint are resumed,
the rest start fresh. A diverged run is recorded (not retried). A ``compare.toml`` with different settings
is refused, so a resumed comparison can never silently mix token budgets; other variants or seeds on the same
settings and baseline extend it (``compare.toml`` lists the union), so a grid can run in parts.

``jobs > 1`` trains that many runs at once, each in its own ``attnlab train`` process with
``threads`` CPU threads (default: this process's torch threads divided by ``jobs``); their output goes to
``out_dir/logs/<variant>-seed<k>.log``. On a small CPU, two 1-thread runs train more tokens per second
in total than one 2-thread run (small matrices use two threads poorly). A run's losses
depend on its thread count through the order of floating-point sums, so they match a ``jobs=1`` run to
rounding, not bit for bit. Ctrl-C (SIGINT to this process) is passed on to every child: each saves a
checkpoint and exits, and rerunning resumes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from pathlib import Path

from ..configio import from_dict, load_toml, save_toml, to_dict
from ..errors import ConfigError
from ..lock import DirectoryLock
from ..rundir import COMPARE_SPEC_FILE as SPEC_FILE
from ..rundir import DONE_STATUSES, LOGS_DIR, read_summary
from ..rundir import comparison_run_dir as run_dir
from ..train.checkpoint import find_checkpoint
from ..registry import variant_info
from .report import write_report

__all__ = ["compare", "run_config", "run_dir", "run_state", "spec_dict", "SPEC_FILE"]

_PER_RUN_KEYS = (("model", "attention"), ("train", "seed"))  # set per run from `variants` / `seeds`


# --------------------------------------------------------------------------------------------- configuration


def run_config(base, variant: str, seed: int, out_dir):
    """``base`` with ``model.attention = variant``, ``train.seed = seed`` and ``out_dir`` = its run directory."""
    return base.replace(
        model=base.model.replace(attention=variant),
        train=base.train.replace(seed=seed),
        out_dir=str(run_dir(out_dir, variant, seed)),
    )


def spec_dict(base, variants: Sequence[str], seeds: Sequence[int], primary: str | None = None) -> dict:
    """The contents of ``compare.toml``, normalised through TOML so it compares equal to a loaded file.

    The base config loses ``out_dir``, ``model.attention`` and ``train.seed``: each run sets those itself.
    ``primary``: the primary metric declared before the runs (attnlab.experiments.verdict), kept when given.
    """
    import tomli_w

    cfg = to_dict(base)
    cfg.pop("out_dir", None)
    for table, key in _PER_RUN_KEYS:
        cfg.get(table, {}).pop(key, None)
    spec = {"variants": list(variants), "seeds": list(seeds), **({"primary": primary} if primary else {}),
            "base": cfg}
    return tomllib.loads(tomli_w.dumps(spec))


def _flatten(tree, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are leaves)."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out = {}
    for key, value in tree.items():
        out.update(_flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def spec_differences(old: dict, new: dict) -> list[str]:
    """``"key: old -> new"`` for every dotted key whose value differs between two spec dicts."""
    a, b = _flatten(old), _flatten(new)
    missing = object()
    diffs = []
    for key in sorted(a.keys() | b.keys()):
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            show = lambda v: "(unset)" if v is missing else repr(v)  # noqa: E731
            diffs.append(f"{key}: {show(va)} -> {show(vb)}")
    return diffs


def _with_defaults(spec: dict, cls) -> dict:
    """An existing spec with every setting it does not name filled in with ``cls``'s default, so a field added
    by a later attnlab version (with its default) does not make an old comparison "different"."""
    if cls is None or not isinstance(spec.get("base"), dict):
        return spec
    try:
        cfg = from_dict(cls, spec["base"])
    except (ConfigError, TypeError, ValueError):
        return spec  # unreadable: compared as written, so the difference is reported
    return spec_dict(cfg, spec.get("variants", []), spec.get("seeds", []), spec.get("primary"))


def _union(old: list, new: list) -> list:
    """``old`` followed by the items of ``new`` it lacks, in their order."""
    return list(old) + [x for x in new if x not in old]


def check_or_write_spec(out_dir: Path, spec: dict, type_of_base=None) -> bool:
    """Write ``out_dir/compare.toml``, or check ``spec`` against the one already there; True when resuming.

    The same base config (every setting but the per-run variant and seed) and the same baseline (the first variant)
    resume the comparison, whatever variants and seeds this call trains: the file then lists the union of both, so
    a grid can be run in parts (``--seeds 0 1 2 3 4`` now, the other seeds later) and reported as one. A grid
    that declared no primary metric may declare one when it is extended (before the added runs train); changing a
    declared one is a difference. Any other difference is a one-line ConfigError naming the differing keys;
    settings missing from the existing file count as ``type_of_base``'s defaults (see :func:`_with_defaults`).
    """
    path = out_dir / SPEC_FILE
    if not path.exists():
        save_toml(spec, path)
        return False
    old = _with_defaults(load_toml(path), type_of_base)
    lists = ("variants", "seeds")
    declared = "primary" not in old and "primary" in spec  # declared now, for the runs this call adds
    if declared:
        old = {**old, "primary": spec["primary"]}
    diffs = spec_differences({k: v for k, v in old.items() if k not in lists},
                             {k: v for k, v in spec.items() if k not in lists})
    old_variants = old.get("variants") or []
    if old_variants[:1] != spec["variants"][:1]:
        diffs.append(f"baseline (the first variant): {old_variants[:1]} -> {spec['variants'][:1]}")
    if diffs:
        shown = "; ".join(diffs[:5]) + (f"; and {len(diffs) - 5} more" if len(diffs) > 5 else "")
        raise ConfigError(
            f"{out_dir} already holds a different comparison ({SPEC_FILE}: {shown}); "
            f"use a new out_dir, or rerun with the same settings to resume"
        )
    merged = {**old, **{key: _union(old.get(key) or [], spec[key]) for key in lists}}
    if declared or any(merged[key] != (old.get(key) or []) for key in lists):
        save_toml(merged, path)
    return True


def _check_lists(variants: Sequence[str], seeds: Sequence[int]) -> None:
    """Non-empty, duplicate-free lists of known variant names and non-negative integer seeds."""
    if isinstance(variants, str) or not variants:
        raise ConfigError(f"variants={variants!r} must be a non-empty list of variant names")
    if isinstance(seeds, (str, int)) or not seeds:
        raise ConfigError(f"seeds={seeds!r} must be a non-empty list of integers")
    for name in variants:
        variant_info(name)  # unknown name: the registry's one-line error
    for seed in seeds:
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ConfigError(f"seed {seed!r} must be an integer >= 0")
    for what, items in (("variant", variants), ("seed", seeds)):
        dupes = sorted({str(x) for x in items if list(items).count(x) > 1})
        if dupes:
            raise ConfigError(f"duplicate {what} {', '.join(dupes)} in {list(items)!r}; list each once")


# ------------------------------------------------------------------------------------------------------ runs


def run_state(path: Path) -> str:
    """What to do with a run directory: "finished" / "diverged" (keep), "resume" (checkpoint), "fresh"."""
    summary = read_summary(path) or {}
    status = summary.get("status")
    if status in DONE_STATUSES:
        return status
    if find_checkpoint(path) is not None:  # also finds a complete checkpoint left mid-swap by a kill
        return "resume"
    return "fresh"


def _default_train_fn() -> Callable:
    """:func:`attnlab.train.train` (imported late: the trainer pulls in the model and data stacks)."""
    from ..train import train

    return train


def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(text, flush=True)


def _launch_state(head: str, path: Path, quiet: bool) -> str | None:
    """How to launch a run now, at its turn: "fresh" (leftovers of a run killed before its first checkpoint
    removed) or "resume"; None (said why) when it is finished or diverged by now, or another process is
    writing to it (its lock is held: nothing is deleted, the report counts it as unfinished)."""
    state = run_state(path)
    if state in DONE_STATUSES:
        _say(quiet, f"{head} already {state}, skipped")
        return None
    if path.exists():
        try:
            with DirectoryLock(path, what="comparison"):
                if state == "fresh":
                    shutil.rmtree(path)
        except ConfigError as e:
            _say(quiet, f"{head} skipped: {e}")
            return None
    return state


def _execute(train_fn: Callable, cfg, path: Path, state: str, quiet: bool) -> dict:
    """Start (``state == "fresh"``) or resume one run; returns its summary.

    The trainer raises (TrainingDiverged) after writing a "diverged" summary.json: that is a result to
    record, so the summary is returned and the comparison goes on. Any other exception propagates.
    """
    try:
        if state == "resume":
            summary = train_fn(None, resume=path, quiet=quiet)
        else:
            summary = train_fn(cfg, quiet=quiet)
    except Exception as e:
        on_disk = read_summary(path) or {}
        if on_disk.get("status") != "diverged":
            raise
        return {**on_disk, "message": on_disk.get("message") or str(e)}
    return summary if isinstance(summary, dict) else (read_summary(path) or {})


def _result_line(summary: dict, seconds: float) -> str:
    status = summary.get("status", "?")
    loss = summary.get("final_val_loss")
    if status == "finished" and isinstance(loss, (int, float)):
        status += f", final val loss {loss:.4f}"
    elif summary.get("steps") is not None:
        status += f" at step {summary.get('diverged_at', summary['steps'])}"
    return f"{status} ({seconds:.1f} s)"


def compare(
    base,
    variants: list[str],
    seeds: list[int],
    out_dir,
    *,
    quiet: bool = False,
    train_fn: Callable | None = None,
    jobs: int = 1,
    threads: int | None = None,
    primary: str | None = None,
) -> Path:
    """Train every (variant, seed) on ``base``'s data and token budget, then write the report; returns report.md.

    Each run is ``base`` with ``model.attention = variant`` and ``train.seed = seed``, written to
    ``out_dir/<variant>/seed<k>``. ``base.out_dir`` is ignored. The first variant is the baseline of the
    Welch tests. Resumable (see the module docstring). ``train_fn`` defaults to :func:`attnlab.train.train`
    (tests inject a fake with the same signature). If a run comes back "interrupted" the comparison stops
    there and the report covers what is done; rerunning resumes it. ``jobs``/``threads``: see the module
    docstring (``train_fn`` works with ``jobs=1`` only). ``primary``: the primary metric, declared before the runs
    (:func:`attnlab.experiments.verdict.check_primary`); the report tests it against the baseline.
    """
    from ..errors import check_number
    from .verdict import check_primary

    variants, seeds = list(variants), list(seeds)
    _check_lists(variants, seeds)
    if primary is not None:
        check_primary(primary)
    check_number("jobs", jobs, low=1, integer=True)
    if threads is not None:
        check_number("threads", threads, low=1, integer=True)
    if jobs > 1 and train_fn is not None:
        raise ValueError("train_fn is only used with jobs=1 (jobs > 1 runs `attnlab train` processes)")
    out_dir = Path(out_dir)
    # seed-major: an unfinished comparison has every variant at the first seeds (validates all up-front)
    grid = [(v, s, run_config(base, v, s, out_dir)) for s in seeds for v in variants]
    with DirectoryLock(out_dir, what="comparison"):  # two compares on one out_dir would train runs twice
        return _compare_locked(base, variants, seeds, grid, out_dir, quiet, train_fn, jobs, threads, primary)


def _compare_locked(base, variants, seeds, grid, out_dir: Path, quiet, train_fn, jobs, threads, primary) -> Path:
    resuming = check_or_write_spec(out_dir, spec_dict(base, variants, seeds, primary), type(base))
    _say(quiet, f"compare: {len(variants)} variants x {len(seeds)} seeds -> {out_dir}"
                + (" (resuming)" if resuming else "") + (f", {jobs} at a time" if jobs > 1 else ""))
    todo = []
    for i, (variant, seed, cfg) in enumerate(grid, 1):
        path = run_dir(out_dir, variant, seed)
        state = run_state(path)
        head = f"[{i}/{len(grid)}] {variant} seed {seed}:"
        if state in DONE_STATUSES:
            _say(quiet, f"{head} already {state}, skipped")
        else:
            todo.append((head, cfg, path))  # its state is read again at its turn (see _launch_state)
    if jobs == 1:
        _run_in_process(todo, train_fn or _default_train_fn(), quiet, threads)
    else:
        _run_in_subprocesses(todo, out_dir, jobs, threads or max(1, _torch_threads() // jobs), quiet)
    report = write_report(out_dir)
    _say(quiet, f"compare: report {report}")
    return report


# ------------------------------------------------------------------------------------------------ executors


def _cuda_devices() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _torch_threads() -> int:
    import torch

    return torch.get_num_threads()


def _run_in_process(todo: list, train_fn: Callable, quiet: bool, threads: int | None) -> None:
    """One run after another in this process; stops after a run that comes back "interrupted"."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        for head, cfg, path in todo:
            state = _launch_state(head, path, quiet)
            if state is None:
                continue
            _say(quiet, f"{head} {'resuming' if state == 'resume' else 'starting'} ({path})")
            start = time.perf_counter()
            summary = _execute(train_fn, cfg, path, state, quiet)
            _say(quiet, f"{head} {_result_line(summary, time.perf_counter() - start)}")
            if summary.get("status") == "interrupted":
                _say(quiet, "compare: interrupted; rerun the same command to resume")
                break
    finally:
        torch.set_num_threads(before)


def _train_command(cfg, path: Path, state: str, config_file: Path) -> list[str]:
    """The ``attnlab train`` command line of one run (``--resume`` or a saved ``--config``)."""
    base = [sys.executable, "-m", "attnlab.cli", "train", "--quiet"]
    if state == "resume":
        return base + ["--resume", str(path)]
    save_toml(cfg, config_file)
    return base + ["--config", str(config_file)]


def _run_in_subprocesses(todo: list, out_dir: Path, jobs: int, threads: int, quiet: bool) -> None:
    """Up to ``jobs`` ``attnlab train`` processes at once, each with ``threads`` threads.

    A child that exits non-zero without a "diverged" or "interrupted" summary is a crash: the others are
    let finish and a RuntimeError names the run and its log. On SIGINT or SIGTERM this process sends one SIGINT
    to each child (they run in their own process groups) and waits for them to save their checkpoints.
    """
    with _sigterm_as_keyboard_interrupt():
        _supervise(todo, out_dir, jobs, threads, quiet)


@contextlib.contextmanager
def _sigterm_as_keyboard_interrupt():
    """Within the block SIGTERM (``kill``) is handled like Ctrl-C, so the children checkpoint before exiting."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def visible_gpus(environ: dict, device_count: int) -> list[str]:
    """The GPU ids this process may hand to children: CUDA_VISIBLE_DEVICES' entries when set, else 0..count-1."""
    listed = environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [g.strip() for g in listed.split(",") if g.strip() and not g.strip().startswith("-")]
    return [str(i) for i in range(device_count)]


def pick_gpu(gpus: list[str], busy: list[str | None]) -> str | None:
    """The least loaded of ``gpus`` given the GPUs of the running children (first on ties); None without GPUs."""
    return min(gpus, key=busy.count) if gpus else None


def _supervise(todo: list, out_dir: Path, jobs: int, threads: int, quiet: bool) -> None:
    logs = out_dir / LOGS_DIR
    logs.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    count = _cuda_devices()
    gpus = visible_gpus(os.environ, count) if count > 1 else []  # one GPU per child when there are several
    pending, running, failures, stopping = list(todo), [], [], False
    with tempfile.TemporaryDirectory(prefix="attnlab-compare-") as tmp:
        while pending or running:
            try:
                while pending and len(running) < jobs and not stopping and not failures:
                    head, cfg, path = pending.pop(0)
                    state = _launch_state(head, path, quiet)
                    if state is None:
                        continue
                    log = logs / f"{path.parent.name}-{path.name}.log"
                    cmd = _train_command(cfg, path, state, Path(tmp) / f"{len(running)}-{time.time_ns()}.toml")
                    gpu = pick_gpu(gpus, [r[5] for r in running])
                    child_env = env if gpu is None else {**env, "CUDA_VISIBLE_DEVICES": gpu}
                    with open(log, "a", encoding="utf-8") as fh:
                        # own process group: a terminal's Ctrl-C reaches only this process, which forwards exactly
                        # one SIGINT (a second one would stop a child's checkpoint save)
                        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=child_env,
                                                start_new_session=True)
                    running.append((head, path, log, proc, time.perf_counter(), gpu))
                    _say(quiet, f"{head} {'resuming' if state == 'resume' else 'starting'} "
                                f"({path}, {threads} thread{'s' if threads > 1 else ''}"
                                f"{'' if gpu is None else f', GPU {gpu}'}, log {log})")
                if not running:
                    break
                time.sleep(0.2)
            except KeyboardInterrupt:
                if not stopping:  # ask each child once to checkpoint and exit, then wait for them
                    for item in running:
                        if item[3].poll() is None:
                            item[3].send_signal(signal.SIGINT)
                stopping = True
                continue
            for item in [r for r in running if r[3].poll() is not None]:
                running.remove(item)
                head, path, log, proc, start, _ = item
                summary = read_summary(path) or {}
                if proc.returncode != 0 and summary.get("status") not in ("diverged", "interrupted"):
                    failures.append(f"{head} exited with status {proc.returncode}; see {log}")
                    continue
                _say(quiet, f"{head} {_result_line(summary, time.perf_counter() - start)}")
                if summary.get("status") == "interrupted":
                    stopping = True
    if failures:
        raise RuntimeError("; ".join(failures))
    if stopping:
        _say(quiet, "compare: interrupted; rerun the same command to resume")
