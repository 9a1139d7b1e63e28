"""Benchmark: a training step with the output head at every position against one with the head at the answers only
(`train.head_at_answers`), on an experiment preset's task (default: Zoology's Figure 2 cell at T = 64, width 64,
batch 512, a vocabulary of 8,192 and 4 answers per sequence).

Both sides are the real trainer on the same config but for the switch, timed between consecutive steps by its step
callback (train_step.py's attnlab_steps), alternating in blocks of --steps steps, --repeats times; medians of the
per-step times. The loss is the same on both sides (tests/test_model.py and tests/test_task_source.py check that);
only the head's work at the ignored positions goes.

    python benchmarks/head_at_answers.py                                  # CPU, 2 x 4 steps each
    python benchmarks/head_at_answers.py --device cuda --steps 20 --repeats 3
    python benchmarks/head_at_answers.py --experiment zoology-fig2-t128-d64 --batch 64
Prints one JSON object with both medians and the ratio answers-only / every position.
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from attnlab.configio import apply_overrides
from attnlab.data import prepare
from attnlab.experiments.catalog import load_experiment
from train_step import attnlab_steps


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--experiment", default="zoology-fig2-t64-d64")
    p.add_argument("--batch", type=int, default=0, help="train.batch_size (0: the preset's)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    base = load_experiment(args.experiment).base_config(["train.warmup_steps=0"] +
                                                        ([f"train.batch_size={args.batch}"] if args.batch else []))
    sides = {flag: apply_overrides(base, [f"train.head_at_answers={str(flag).lower()}"]) for flag in (False, True)}
    times = {False: [], True: []}
    for _ in range(args.repeats):
        for flag, cfg in sides.items():
            times[flag] += attnlab_steps(cfg, args.steps, args.device)
    every, answers = statistics.median(times[False]), statistics.median(times[True])
    data = prepare(base.data)
    print(json.dumps({
        "benchmark": "head_at_answers", "experiment": args.experiment, "device": args.device,
        "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "threads": torch.get_num_threads(), "torch": torch.__version__,
        "batch_size": base.train.batch_size, "seq_len": data.seq_len, "vocab_size": data.vocab_size,
        "median_step_ms": {"every_position": round(1e3 * every, 2), "answers_only": round(1e3 * answers, 2)},
        "ratio": round(answers / every, 3), "steps_each": len(times[False]),
    }, indent=1))


if __name__ == "__main__":
    main()
