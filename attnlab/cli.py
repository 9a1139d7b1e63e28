"""The `attnlab` command line.

    attnlab train                                   # the default preset (cpu) on the embedded Shakespeare corpus
    attnlab train --preset tiny model.attention=rbf train.lr=3e-4
    attnlab train --resume runs/20261122-101500-standard
    attnlab compare --variants standard gqa rbf --seeds 0 1 2
    attnlab sample runs/20261122-101500-standard --tokens 300
    attnlab variants
    attnlab magnitude-demo

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

    cfg = load_config(RunConfig, args.config) if args.config else load_preset(args.preset)
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
        print(f"final val loss {summary.get('final_val_loss')} after {summary.get('steps')} steps "
              f"({summary.get('wall_time_s', 0):.0f} s); run written to {summary.get('out_dir', '')}")
    return 0


def cmd_compare(args) -> int:
    from .experiments import compare

    report = compare(_run_config(args), args.variants, args.seeds, args.out_dir, quiet=args.quiet)
    print(f"report: {report}")
    return 0


def cmd_sample(args) -> int:
    from .train import sample

    print(sample(args.run_dir, prompt=args.prompt, max_new_tokens=args.tokens, temperature=args.temperature,
                 top_k=args.top_k, seed=args.seed))
    return 0


def cmd_variants(args) -> int:
    from .variants import variant_info, variants

    rows = [(name, variant_info(name).description, variant_info(name).source) for name in variants()]
    width = max(len(r[0]) for r in rows)
    for name, description, source in rows:
        print(f"{name:<{width}}  {description}")
        print(f"{'':<{width}}  source: {source}")
    return 0


def cmd_magnitude_demo(args) -> int:
    from .experiments.magnitude_demo import main as demo

    demo()
    return 0


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", default="cpu", help="a shipped preset: tiny, cpu (default), gpt2-small")
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
    _add_config_args(p)
    p.add_argument("--variants", nargs="+", required=True, help="variant names; the first is the baseline")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    p.add_argument("--out-dir", default="runs/compare", help="where runs and report.md go (resumable)")
    p.set_defaults(func=cmd_compare)

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

    p = sub.add_parser("magnitude-demo", help="seed 000's numbers: hijacking, cluster collapse, effective size")
    p.set_defaults(func=cmd_magnitude_demo)
    return parser


def main(argv=None) -> int:
    from .errors import ConfigError
    from .train import TrainingDiverged

    args = build_parser().parse_args(argv)
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
