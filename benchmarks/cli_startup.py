"""Benchmark: the `attnlab` command's start-up against `python -c "import torch"`, measured in the same run.

Each command runs in a fresh interpreter (output discarded), the commands interleaved over --repeats rounds so that
a change of machine load hits all of them alike; the median wall time of each is divided by the median of
`import torch`. A command that parses its arguments before importing torch (`--help`) costs a fraction of it; one
that needs the variant registry or the task registry imports torch through them today.

    python benchmarks/cli_startup.py                  # --help, variants, tasks, experiments; 7 rounds
    python benchmarks/cli_startup.py --repeats 15
Prints one JSON object: per command the median seconds and the ratio to `import torch`.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

REFERENCE = ("import torch", [sys.executable, "-c", "import torch"])
COMMANDS = ("--help", "variants", "tasks", "experiments")


def _seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="interleaved rounds (medians over them)")
    args = parser.parse_args(argv)
    runs = {REFERENCE[0]: REFERENCE[1], **{f"attnlab {c}": [sys.executable, "-m", "attnlab.cli", c] for c in COMMANDS}}
    times = {name: [] for name in runs}
    for name, command in runs.items():  # one warm-up each (file cache)
        _seconds(command)
    for _ in range(args.repeats):
        for name, command in runs.items():
            times[name].append(_seconds(command))
    base = statistics.median(times[REFERENCE[0]])
    result = {"machine": platform.processor() or platform.machine(), "python": platform.python_version(),
              "repeats": args.repeats, "reference": REFERENCE[0], "reference_s": round(base, 3),
              "commands": {name: {"median_s": round(statistics.median(t), 3),
                                  "ratio_to_import_torch": round(statistics.median(t) / base, 3)}
                           for name, t in times.items() if name != REFERENCE[0]}}
    print(json.dumps(result, indent=1))
    return result


if __name__ == "__main__":
    main()
