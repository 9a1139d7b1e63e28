"""The `attnlab` command line.

    attnlab train                                   # the default preset (cpu) on the embedded Shakespeare corpus
    attnlab train --preset tiny model.attention=rbf train.lr=3e-4
    attnlab train --resume runs/20261122-101500-standard
    attnlab compare --variants standard gqa rbf --seeds 0 1 2 --jobs 2
    attnlab compare --experiment boneless --jobs 2    # a shipped comparison; `attnlab experiments` lists them
    attnlab sweep --experiment recall-mqar-1 --set train.lr=1e-3,3e-3   # one comparison per value; best per variant
    attnlab sample runs/20261122-101500-standard --tokens 300
    attnlab variants
    attnlab swap runs/hijack-v2/standard/seed0 --attention magnitude-prefix-logits   # a prior on at test time
    attnlab magnitude-demo
    attnlab consensus --points 64 --scale 10          # the Boneless write-up: consensus attention, raw-correlation explosion
    attnlab cluster-colors [IMAGE]                    # the Boneless write-up: palette by consensus attention vs k-means
    attnlab rank runs/20261122-101500-standard        # the Boneless write-up: pseudo-rank of W_q, W_k, W_v, W_o, W_q W_k'
    attnlab rank-sweep --preset tiny --weight-decays 0 0.1 1 --seeds 0 1 2 3 4
    attnlab ngram                                     # unigram/bigram/trigram loss on the validation tokens

A user mistake (bad value, unknown key, missing file) prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import sys



def _run_config(args):
    """RunConfig from --preset / --config, then --data / --variant / --out, then dotted overrides."""
    from .configio import apply_overrides, load_config
    from .presets import load_preset
    from .train.config import RunConfig

    cfg = load_config(RunConfig, args.config) if args.config else load_preset(args.preset or "cpu")
    overrides = list(args.overrides)
    if args.data:
        overrides.insert(0, f"data.source={args.data}")
    if getattr(args, "variant", None):
        overrides.insert(0, f"model.attention={args.variant}")
    if getattr(args, "out", None):
        overrides.insert(0, f"out_dir={args.out}")
    return apply_overrides(cfg, overrides)


def cmd_train(args) -> int:
    from .train import train

    if args.resume:
        if args.overrides or args.config or args.data or args.variant or args.out:
            print("attnlab: error: --resume continues a run exactly as configured; it takes no other settings",
                  file=sys.stderr)
            return 2
        summary = train(None, resume=args.resume, quiet=args.quiet)
    else:
        summary = train(_run_config(args), quiet=args.quiet)
    if summary.get("status") == "interrupted":
        print(f"interrupted: checkpoint saved; continue with: attnlab train --resume {summary.get('out_dir', '')}")
        return 130
    if not args.quiet:
        print(_final_line(summary))
    return 0


def _final_line(summary: dict) -> str:
    """The last line of ``attnlab train``: the final validation numbers, whether a stop_at rule was met, where."""
    loss, acc = summary.get("final_val_loss"), summary.get("final_val_accuracy")
    numbers = "final val loss n/a" if loss is None else f"final val loss {loss:.4f}"
    if acc is not None:
        numbers += f", accuracy {100 * acc:.2f}%"
    if summary.get("stop_at"):
        numbers += (f"; {summary['stop_at']} met at step {summary['threshold_step']}" if summary.get("converged")
                    else f"; not converged: {summary['stop_at']} not met by the cap of {summary.get('max_steps')} steps")
    return (f"{numbers} after {summary.get('steps')} steps ({summary.get('wall_time_s', 0):.0f} s); "
            f"run written to {summary.get('out_dir', '')}")


def _add_comparison_args(p) -> None:
    """The arguments of a grid of variants x seeds (compare and sweep)."""
    _add_config_args(p)
    p.add_argument("--experiment", help="a shipped comparison (see `attnlab experiments`), e.g. boneless, magnitude")
    p.add_argument("--variants", nargs="+", help="variant names; the first is the baseline")
    p.add_argument("--seeds", nargs="+", type=int, help="training seeds (default 0 1 2)")
    p.add_argument("--out-dir", help="where runs and report.md go (resumable; default runs/compare)")
    p.add_argument("--jobs", type=int, default=1, help="runs trained at once, each in its own process (default 1)")
    p.add_argument("--threads", type=int, help="CPU threads per run (default: all cores divided by --jobs)")
    p.add_argument("--primary", help="the primary metric, declared before the runs: val_loss, val_accuracy or a "
                                     "hook's key (e.g. hijack/synonym-m32/accuracy); the report tests it with Holm")


def _comparison(args):
    """(base config, variants, seeds, out_dir, primary) of a compare or sweep command line."""
    from .errors import ConfigError
    from .experiments import load_experiment

    if args.experiment:  # a shipped grid; --variants / --seeds / --out-dir and KEY=VALUE may still adjust it
        if args.preset or args.config or args.data:
            raise ConfigError(f"--experiment {args.experiment} sets its own preset and data; "
                              f"adjust it with KEY=VALUE overrides instead of --preset/--config/--data")
        exp = load_experiment(args.experiment)
        return (exp.base_config(args.overrides), args.variants or exp.variants, args.seeds or exp.seeds,
                args.out_dir or exp.out_dir, args.primary or exp.primary)
    if not args.variants:
        raise ConfigError(f"{args.command} needs --variants NAME [NAME ...] or --experiment NAME "
                          "(see `attnlab experiments`)")
    return _run_config(args), args.variants, args.seeds or [0, 1, 2], args.out_dir, args.primary


def cmd_compare(args) -> int:
    from .experiments import compare

    base, variants, seeds, out_dir, primary = _comparison(args)
    report = compare(base, variants, seeds, out_dir or "runs/compare", quiet=args.quiet,
                     jobs=args.jobs, threads=args.threads, primary=primary)
    print(f"report: {report}")
    return 0


def cmd_sweep(args) -> int:
    from .experiments.grid_sweep import parse_sweep, sweep

    key, values = parse_sweep(args.set)
    base, variants, seeds, out_dir, primary = _comparison(args)
    out_dir = f"{out_dir or 'runs/compare'}-sweep"
    path = sweep(base, key, values, variants, seeds, out_dir, primary=primary, jobs=args.jobs,
                 threads=args.threads, quiet=args.quiet)
    print(path.read_text(encoding="utf-8"), end="")
    print(f"sweep: {path}")
    return 0


def cmd_report(args) -> int:
    """Rewrite a comparison's report from what its directory holds now; trains nothing (runs still going or
    missing are listed as such). Takes no lock: it only reads the runs, and the report files are written
    atomically, so it may look at a comparison that is still running. With --export DEST, the report is written
    in DEST after copying the runs there without their checkpoints. On a sweep directory (``attnlab sweep``'s
    KEY=VALUE comparisons) it rewrites sweep.md and sweep.json."""
    from pathlib import Path

    from .errors import ConfigError
    from .experiments.grid_sweep import find_sweep, write_sweep_report
    from .experiments.report import export_comparison, write_report
    from .rundir import COMPARE_SPEC_FILE

    a_sweep = not (Path(args.out_dir) / COMPARE_SPEC_FILE).is_file() and find_sweep(args.out_dir) is not None
    if a_sweep and args.export:
        raise ConfigError(f"--export {args.export}: export each comparison of the sweep {args.out_dir} "
                          f"(attnlab report {args.out_dir}/KEY=VALUE --export ...)")
    if a_sweep:
        report = write_sweep_report(args.out_dir)
    else:
        report = export_comparison(args.out_dir, args.export) if args.export else write_report(args.out_dir)
    print(report.read_text(encoding="utf-8"), end="")
    print(f"report: {report}")
    return 0


def cmd_experiments(args) -> int:
    from .experiments import experiment_names, load_experiment

    for name in experiment_names():
        exp = load_experiment(name)
        settings = " ".join(exp.overrides)
        print(f"{name}: {exp.description}\n    preset {exp.preset}{', ' + settings if settings else ''}; "
              f"variants {' '.join(exp.variants)}; seeds {' '.join(map(str, exp.seeds))}; out {exp.out_dir}")
    return 0


def cmd_sample(args) -> int:
    from .train import sample

    print(sample(args.run_dir, prompt=args.prompt, max_new_tokens=args.tokens, temperature=args.temperature,
                 top_k=args.top_k, seed=args.seed))
    return 0


def cmd_variants(args) -> int:
    from .registry import variant_info, variants

    rows = [(name, variant_info(name).description, variant_info(name).source) for name in variants()]
    width = max(len(r[0]) for r in rows)
    for name, description, source in rows:
        print(f"{name:<{width}}  {description}")
        print(f"{'':<{width}}  source: {source}")
    return 0


def cmd_tasks(args) -> int:
    from .tasks import get_task, task_names

    width = max(len(name) for name in task_names())
    for name in task_names():
        task = get_task(name)
        print(f"{name:<{width}}  {task.summary}  [defaults: seq_len {task.seq_len}, vocab {task.vocab_size}, "
              f"chance {task.chance_accuracy():.2%}]")
    print("train one: attnlab train --preset tiny data.source=task:<name> data.task.<param>=VALUE")
    return 0


def cmd_magnitude_demo(args) -> int:
    from .experiments.magnitude_demo import main as demo

    demo()
    return 0


def cmd_verify(args) -> int:
    from .verify import CHECKS, LEGACY_NAMES, WRITEUPS, select
    from .verify import main as verify

    if args.list:
        for writeup, title in WRITEUPS.items():
            print(f"{writeup} ({title}): {' '.join(i for i, c in CHECKS.items() if c.writeup == writeup)}")
        print("aliases: " + ", ".join(f"{old} = {new}" for old, new in LEGACY_NAMES.items()))
        return 0
    try:
        ids = select(args.names) if args.names else None
    except ValueError as e:
        print(f"attnlab verify: {e}", file=sys.stderr)
        return 2
    return verify(json_path=args.json, strict_claims=args.strict_claims, ids=ids)


def cmd_consensus(args) -> int:
    import torch

    from .analysis.consensus import consensus, plot_cluster_counts, raw_correlation_growth, save_frames
    from .errors import check_choice, check_number
    from .switches import BUILTIN_NORMALIZERS

    for name in ("points", "steps", "frame_every"):
        check_number(f"--{name.replace('_', '-')}", getattr(args, name), low=1, integer=True)
    check_number("--dim", args.dim, low=2, integer=True)
    check_number("--step-size", args.step_size, low=0.0, low_open=True)
    check_choice("--normalizer", args.normalizer, BUILTIN_NORMALIZERS)
    x = torch.randn(args.points, args.dim, generator=torch.Generator().manual_seed(args.seed), dtype=torch.float64)
    res = consensus(x, args.steps, args.step_size, args.scale, qk_norm=not args.no_qk_norm,
                    normalizer=args.normalizer, radius=args.radius)
    print(f"consensus: {args.points} points ~ N(0, I_{args.dim}), x <- (1 - {args.step_size:g}) x + "
          f"{args.step_size:g} attn(x), {'QK-norm, ' if not args.no_qk_norm else ''}scale {args.scale:g}, "
          f"{args.normalizer}; clusters = components within {args.radius:g} x spread(x_0)")
    print("clusters per iteration:")
    for t in range(0, len(res.clusters), 10):
        print(f"  {t:3d}-{min(t + 9, res.steps):<3d} " + " ".join(f"{c:3d}" for c in res.clusters[t:t + 10]))
    norms = res.trajectory.norm(dim=-1).amax(-1)
    if res.clusters[-1] == -1:
        print(f"stopped at iteration {res.steps}: the points overflowed (not finite; max norm before: {norms[-2]:.3g})")
    else:
        print(("converged (no point moved more than tol)" if res.converged else f"stopped after {res.steps} steps")
              + f"; max ||x_i||: {norms[0]:.3g} at the start, {norms[-1]:.3g} at the end")
    growth = raw_correlation_growth(x, steps=args.steps)
    print(f"raw correlation x <- x x' x on the same points (top Gram eigenvalue {growth['gram_top_eigenvalue']:.4g}):")
    print("iteration  max ||x_i||   predicted from the SVD")
    for t, (got, want) in enumerate(zip(growth["max_row_norm"], growth["predicted_max_row_norm"])):
        print(f"{t:9d}  {got:.4e}   {want:.4e}")
    if growth["stopped"]:
        print(growth["stopped"])
    frames = save_frames(res, args.out, every=args.frame_every)
    plot_cluster_counts(res, f"{args.out}/clusters.png", growth)
    print(f"{len(frames)} frames and clusters.png written to {args.out}")
    return 0


def cmd_cluster_colors(args) -> int:
    from .analysis.colors import cluster_colors, format_table, load_image, save_color_outputs
    from .errors import check_number

    check_number("--samples", args.samples, low=1, integer=True)
    check_number("--steps", args.steps, low=1, integer=True)
    result = cluster_colors(load_image(args.image), samples=args.samples, seed=args.seed, scale=args.scale,
                            steps=args.steps, step_size=args.step_size, kernel=args.kernel, radius=args.radius,
                            min_fraction=args.min_fraction, qk_norm=args.qk_norm)
    info = result["consensus"].info
    print(f"{result['samples']} sampled pixels of a {result['image_shape'][1]}x{result['image_shape'][0]} image; "
          f"consensus ({args.kernel}{', QK-norm' if args.qk_norm else ''}, scale {args.scale:g}, {info['steps']} "
          f"steps): {info['clusters']} clusters, "
          f"{info['kept']} kept (>= {args.min_fraction:g} of the sample)")
    print(format_table(result))
    save_color_outputs(result, args.out)
    print(f"palette.png, recolored.png, recolored_kmeans.png, results.json written to {args.out}")
    return 0


def cmd_mass(args) -> int:
    from .analysis.task_mass import attention_mass, format_mass
    from .configio import apply_overrides
    from .data.task_source import TaskDataset, task_name
    from .errors import ConfigError
    from .train import load_run

    model, _, cfg = load_run(args.run_dir)
    name = task_name(cfg.data.source)
    if name is None:
        raise ConfigError(f"{args.run_dir} was trained on data.source={cfg.data.source!r}, not on a task; attention "
                          f"mass is measured on a task run (data.source=task:hijack)")
    data = apply_overrides(cfg.data, [f"task.{item}" for item in args.params])  # each parameter checked by the task
    task = TaskDataset.build(name, data.task).task
    if task.seq_len != cfg.model.block_size:
        raise ConfigError(f"these parameters give sequences of {task.seq_len} tokens; the model was trained on "
                          f"{cfg.model.block_size}")
    print(f"{args.run_dir}: task {name} {dict(data.task)}, {args.n} sequences (seed {args.seed})")
    print(format_mass(attention_mass(model, task, n=args.n, seed=args.seed)), end="")
    return 0


def cmd_maps(args) -> int:
    from .experiments.maps import write_maps

    for path in write_maps(args.run_dir, args.out, text=args.text, seed=args.seed):
        print(path)
    return 0


def cmd_heads(args) -> int:
    from .experiments.heads import write_heads

    result = write_heads(args.run_dir, args.out, text=args.text, windows=args.windows, seed=args.seed)
    report = result["report"]
    print(f"{args.run_dir}: JS on {report['js_on']}; knockout on {report['windows']} validation windows "
          f"(seed {report['seed']}), base loss {report['base_loss']:.4f}")
    print(result["table"])
    for path in result["paths"]:
        print(path)
    return 0


def cmd_swap(args) -> int:
    from pathlib import Path

    from .experiments.swap import evaluate_swap, swap_comparison, swap_summary_table, swap_table
    from .rundir import COMPARE_SPEC_FILE

    if (Path(args.run_dir) / COMPARE_SPEC_FILE).is_file():  # a comparison: every finished run of --variant
        if not args.variant:
            print("attnlab: error: on a comparison directory, --variant names the trained variant to evaluate",
                  file=sys.stderr)
            return 2
        results = swap_comparison(args.run_dir, args.variant, args.attention)
        metrics = [k for k in results[0]["original"] if k == "accuracy" or k.endswith("/accuracy")]
        print(swap_summary_table(args.run_dir, metrics), end="")
        return 0
    result = evaluate_swap(args.run_dir, args.attention)
    params = result["parameters"]
    print(f"{args.run_dir}: trained with {result['trained_with']}, evaluated with {result['attention']} "
          f"({len(params['copied'])} parameters kept, {len(params['new'])} at their initial values, "
          f"{len(params['dropped'])} dropped)")
    print(swap_table(result), end="")
    print(f"{args.run_dir}/swap-{args.attention}.json")
    return 0


def cmd_export_hf(args) -> int:
    from .hf.gpt2 import export_gpt2
    from .train import load_run

    model, tokenizer, _ = load_run(args.run_dir)
    dest = export_gpt2(model, args.dest, tokenizer.to_hf())
    print(f"{args.run_dir} -> {dest} (transformers.AutoModelForCausalLM.from_pretrained({str(dest)!r}))")
    return 0


def cmd_rank(args) -> int:
    from pathlib import Path

    from .analysis.rank import rank_report
    from .train import load_model

    model, kind = load_model(args.path)
    out = args.out if args.out is not None else Path("runs") / f"rank-{Path(args.path).resolve().name}"
    report = rank_report(model, out, source=str(args.path), kind=kind)
    print(f"{args.path} ({report['kind']})")
    print(report["table"])
    print(f"rank.md, rank.json, spectra.png written to {report['out_dir']}")
    return 0


def cmd_rank_sweep(args) -> int:
    from .experiments.sweep import export_sweep, rank_sweep

    report = rank_sweep(_run_config(args), args.weight_decays, args.out, seeds=args.seeds, quiet=args.quiet)
    print(report["table"])
    print(f"sweep.md, sweep.json written to {report['out_dir']}")
    if args.export:
        print(f"exported (no checkpoints) to {export_sweep(args.out, args.export)}")
    return 0


def cmd_ngram(args) -> int:
    from .analysis.ngram import ORDER_NAMES, reference_losses

    cfg = _run_config(args)
    ref = reference_losses(cfg, args.orders, args.alpha)
    print(f"count n-gram losses (nats/token) on the {ref['targets']:,} validation targets a run of this config is "
          f"scored on; counts from {ref['train_tokens']:,} train tokens, vocab {ref['vocab_size']}, "
          f"add-{ref['alpha']:g} smoothing")
    for n, loss in ref["orders"].items():
        print(f"order {n} ({ORDER_NAMES.get(n, f'{n}-gram')}): {loss:.4f}")
    return 0


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", help="a shipped preset: tiny, cpu (default), gpt2-small")
    p.add_argument("--config", help="a TOML file with [model], [data], [train] tables (replaces --preset)")
    p.add_argument("--data", help="a UTF-8 text file or a directory of .txt/.md files (default: Shakespeare)")
    p.add_argument("--quiet", action="store_true", help="no progress bar or log lines")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                   help="dotted overrides, e.g. model.n_layer=4 train.lr=3e-4 model.attention=gqa")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnlab", description="A laboratory for attention mechanisms.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a GPT with any attention variant")
    _add_config_args(p)
    p.add_argument("--variant", help="attention variant (same as model.attention=NAME)")
    p.add_argument("--out", help="run directory (default: runs/<time>-<variant>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue an interrupted run exactly")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("compare", help="several variants x several seeds, same data and budget; markdown report")
    _add_comparison_args(p)
    p.set_defaults(func=cmd_compare)

    p = sub.add_parser("sweep", help="one comparison per value of a setting (e.g. the learning rate); the best value "
                                     "per variant")
    p.add_argument("--set", required=True, help="KEY=V1,V2,... e.g. train.lr=1e-3,3e-3,1e-2 (one comparison each, "
                                                "in OUT_DIR-sweep/KEY=VALUE/)")
    _add_comparison_args(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("report", help="rewrite a comparison's report.md (a sweep's sweep.md) from its runs so far "
                                      "(trains nothing)")
    p.add_argument("out_dir", help="a comparison directory (holds compare.toml), e.g. runs/magnitude, or a sweep "
                                   "directory (KEY=VALUE comparisons), e.g. runs/zoology-mqar-t64-d64-sweep")
    p.add_argument("--export", metavar="DEST", help="copy the finished runs' config.toml, metrics.jsonl and "
                   "summary.json (no checkpoints) to DEST and write the report there, e.g. results/magnitude")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("experiments", help="list the shipped comparisons for `attnlab compare --experiment NAME`")
    p.set_defaults(func=cmd_experiments)

    p = sub.add_parser("sample", help="generate text from a trained run")
    p.add_argument("run_dir")
    p.add_argument("--prompt", default="\n")
    p.add_argument("--tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("variants", help="list the registered attention variants")
    p.set_defaults(func=cmd_variants)

    p = sub.add_parser("tasks", help="list the synthetic capability tasks (data.source=task:<name>)")
    p.set_defaults(func=cmd_tasks)

    p = sub.add_parser("magnitude-demo", help="the Magnitude Attention write-up's numbers: hijacking, cluster collapse, effective size")
    p.set_defaults(func=cmd_magnitude_demo)

    p = sub.add_parser("verify", help="the claims ledger: measure the write-ups' claims; exit 1 if a row's "
                       "verdict is FAIL (it no longer reproduces its recorded verdict)",
                       description="Exit status 0 when every row reproduces its recorded verdict (holds, refuted or "
                       "as predicted), 1 when any row's verdict is FAIL; with --strict-claims also 1 when any claim "
                       "is refuted.")
    p.add_argument("names", nargs="*", metavar="NAME",
                   help="only these rows: a write-up (magnitude, boneless, masking, softmax) or a check id; the "
                   "write-ups' former names are aliases, listed by --list (default: every row)")
    p.add_argument("--list", action="store_true", help="list the write-ups and their check ids, and exit")
    p.add_argument("--json", metavar="FILE", help="also write the records as JSON")
    p.add_argument("--strict-claims", action="store_true", help="exit 1 also when any claim is refuted")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("consensus", help="the Boneless write-up: parameterless attention as consensus; raw-correlation explosion")
    p.add_argument("--points", type=int, default=64, help="points drawn from N(0, I) (default 64)")
    p.add_argument("--dim", type=int, default=2, help="their dimension (default 2; frames show the first two)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--step-size", type=float, default=0.5, help="s in x <- (1 - s) x + s attn(x) (default 0.5)")
    p.add_argument("--scale", type=float, default=10.0, help="g: logits g cos(x_i, x_j) (default 10)")
    p.add_argument("--normalizer", default="softmax", help="softmax or none (raw correlation)")
    p.add_argument("--no-qk-norm", action="store_true", help="logits g x_i.x_j instead of g cos(x_i, x_j)")
    p.add_argument("--radius", type=float, default=0.01, help="cluster radius, times the initial spread")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--frame-every", type=int, default=5)
    p.add_argument("--out", default="runs/consensus", help="where the frame PNGs go (default runs/consensus)")
    p.set_defaults(func=cmd_consensus)

    p = sub.add_parser("cluster-colors", help="the Boneless write-up: an image's palette by consensus attention, vs k-means")
    p.add_argument("image", nargs="?", help="an image file (default: matplotlib's sample photograph grace_hopper.jpg)")
    p.add_argument("--out", default="runs/colors", help="where palette.png and recolored*.png go")
    p.add_argument("--samples", type=int, default=2000, help="pixels sampled for clustering (default 2000)")
    p.add_argument("--scale", type=float, default=300.0, help="g; RBF bandwidth 1/sqrt(g) in RGB [0, 1] units")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--step-size", type=float, default=1.0)
    p.add_argument("--kernel", choices=("rbf", "dot"), default="rbf")
    p.add_argument("--qk-norm", action="store_true", help="cosine logits g cos(x_i, x_j) (ignores brightness)")
    p.add_argument("--radius", type=float, default=0.01, help="cluster radius in RGB [0, 1] units")
    p.add_argument("--min-fraction", type=float, default=0.005, help="drop clusters below this share of the sample")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_cluster_colors)

    p = sub.add_parser("mass", help="the Magnitude Attention write-up: attention mass on the unique key and the redundant cluster (task runs)")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run trained on a task that marks key roles (hijack)")
    p.add_argument("params", nargs="*", metavar="PARAM=VALUE",
                   help="task parameters to change for the measurement, e.g. m=16 (as data.task.m=16)")
    p.add_argument("--n", type=int, default=256, help="sequences to measure on (default 256)")
    p.add_argument("--seed", type=int, default=0, help="seed of the measured sequences (default 0)")
    p.set_defaults(func=cmd_mass)

    p = sub.add_parser("maps", help="attention-map heatmaps per layer and head (and magnitude gates per key), PNG")
    p.add_argument("run_dir")
    p.add_argument("--text", default=None, help="the tokens to look at (default for task runs: one task sequence)")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/maps)")
    p.add_argument("--seed", type=int, default=0, help="which task sequence, when no --text is given")
    p.set_defaults(func=cmd_maps)

    p = sub.add_parser("heads", help="per layer: JS divergence between heads, loss increase per masked head, MoH usage")
    p.add_argument("run_dir")
    p.add_argument("--text", default=None, help="compute the JS divergence on this text (default: validation windows)")
    p.add_argument("--windows", type=int, default=8, help="validation windows of block_size tokens (default 8)")
    p.add_argument("--seed", type=int, default=0, help="seed of the validation windows (default 0)")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/heads)")
    p.set_defaults(func=cmd_heads)

    p = sub.add_parser("swap", help="a trained task run evaluated with its attention switched (e.g. a prior off or on)")
    p.add_argument("run_dir", help="a run directory, or a comparison directory with --variant")
    p.add_argument("--attention", required=True, help="the variant to evaluate the trained weights with")
    p.add_argument("--variant", help="RUN_DIR is a comparison: evaluate every finished run of this trained variant")
    p.set_defaults(func=cmd_swap)

    p = sub.add_parser("export-hf", help="write a GPT-2-architecture run as a Hugging Face GPT2LMHeadModel directory")
    p.add_argument("run_dir")
    p.add_argument("dest")
    p.set_defaults(func=cmd_export_hf)

    p = sub.add_parser("rank", help="the Boneless write-up: singular spectra, pseudo-rank, participation ratio of attention weights")
    p.add_argument("path", metavar="CHECKPOINT_OR_HF_DIR", help="a run directory or a Hugging Face GPT-2 directory")
    p.add_argument("--out", help="where rank.md, rank.json, spectra.png go (default runs/rank-<name>)")
    p.set_defaults(func=cmd_rank)

    p = sub.add_parser("rank-sweep", help="the Boneless write-up: one run per weight decay; pseudo-rank and val loss per lambda")
    _add_config_args(p)
    p.add_argument("--weight-decays", type=float, nargs="+", default=[0.0, 0.1, 1.0], metavar="LAMBDA")
    p.add_argument("--seeds", type=int, nargs="+", metavar="SEED",
                   help="training seeds, one run per lambda and seed (default: the config's train.seed)")
    p.add_argument("--out", default="runs/rank-sweep", help="sweep directory (resumable; default runs/rank-sweep)")
    p.add_argument("--export", metavar="DEST", help="then copy the sweep to DEST without checkpoints (for results/)")
    p.set_defaults(func=cmd_rank_sweep)

    p = sub.add_parser("ngram", help="reference losses of count n-gram models on a config's validation tokens")
    _add_config_args(p)
    p.add_argument("--orders", type=int, nargs="+", default=[1, 2, 3], metavar="N",
                   help="n-gram orders (default 1 2 3)")
    p.add_argument("--alpha", type=float, default=0.01, help="additive smoothing (default 0.01)")
    p.set_defaults(func=cmd_ngram)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)  # before any heavy import: --help answers at once
    from .errors import ConfigError, TrainingDiverged  # torch-free: a listing command never imports torch

    try:
        return args.func(args)
    except ConfigError as e:
        print(f"attnlab: error: {e}", file=sys.stderr)
        return 2
    except TrainingDiverged as e:  # the last good checkpoint is kept; the message says where
        print(f"attnlab: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
