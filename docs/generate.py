"""Regenerate the blocks of the docs and the README that are computed from the code and from results/.

    python docs/generate.py           # rewrite every stale block in README.md and docs/**/*.md
    python docs/generate.py --check   # list the stale blocks and exit 1 if there are any (changes nothing)

A generated block sits between two HTML comments, ``<!-- NAME:BEGIN -->`` and ``<!-- NAME:END -->``. The names:

- ``VARIANTS``: the variant registry (:func:`attnlab.variants`), name, description and source of each variant;
- ``SWITCHES:<Class>``: every field of a config dataclass (AttentionConfig, MagnitudeConfig, HeadMixConfig, GPTConfig, TrainConfig,
  DataConfig)
  with its type, default and documentation, read from the dataclass and its source (the field's docstring);
- ``RESULTS:<dir>``: the tables ``attnlab report`` computes from the raw run logs in ``results/<dir>/``;
- ``TASKS``: the task registry (:mod:`attnlab.tasks`): each task's summary, defaults and computed chance accuracy;
- ``HIJACK-MECHANISM``: the Magnitude Attention write-up's hijacking against the cluster size m for the mechanism alone
  (:func:`attnlab.experiments.magnitude_demo.hijack_share_against_m`);
- ``HIJACK-SUMMARY:<prefix>``: one table over the parts ``results/<prefix>-1``, ``-2``, ... of a hijack experiment
  (:func:`attnlab.experiments.hijack_report.hijack_summary`);
- ``HIJACK-PROTOCOL:<fixed>:<prefix>``: the runs in ``results/<fixed>`` against the same variants in the parts
  ``results/<prefix>-1``, ``-2``, ... (:func:`attnlab.experiments.hijack_report.hijack_protocol`);
- ``LOWRANK-ERROR:<dir>[:<stem>]``: the low-rank magnitude solver's error table from ``results/<dir>/error.json``
  (or ``<stem>.json``)
  (:func:`attnlab.experiments.lowrank_error.error_table`);
- ``HEADS:<dir>``: the head analyses (``attnlab heads``) of the runs of a comparison saved in
  ``results/<dir>/<variant>/seed<k>/heads/heads.json`` (:func:`attnlab.experiments.heads.heads_table`);
- ``SWAP:<dir>``: the test-time attention swaps (``attnlab swap``) saved in
  ``results/<dir>/<variant>/seed<k>/swap-<attention>.json``: the accuracy at every hijack sweep cell, trained against
  swapped (:func:`attnlab.experiments.swap.swap_summary_table`);
- ``SWEEP:<dir>``: the sweep table ``attnlab report results/<dir>`` writes for a sweep directory (one
  ``<KEY>=<value>`` comparison per value; :func:`attnlab.experiments.grid_sweep.sweep_table`), every run listed;
- ``RANK-SWEEP:<dir>``: the tables ``attnlab rank-sweep`` writes for a weight-decay sweep exported to
  ``results/<dir>/`` (:func:`attnlab.experiments.sweep.sweep_report`: per lambda, each lambda against the first,
  every run);
- ``BENCH-LONG:<dir>[:<stem>]``: the rows of ``benchmarks/magnitude.py --long`` (or of other rows of it) saved in
  ``results/<dir>/bench_long.json`` (or ``<stem>.json``);
- ``LEADERBOARD``: every variant against every benchmark, from the comparisons in :data:`LEADERBOARD` (results/)
  (:mod:`attnlab.experiments.leaderboard`); ``python docs/generate.py`` also redraws its heatmap,
  ``results/leaderboard.png``, when it is missing or stale;
- ``BENCH-LAYER:<stem>``: the rows of a ``benchmarks/attention_layer.py`` run saved in ``results/benchmarks/<stem>.json``
  (``BENCH-LAYER:cuda:<stem>``: in ``results/benchmarks/cuda/``): each variant's layer against the raw-SDPA layer,
  forward and forward+backward;
- ``BENCH-GENERATE``: the rows of ``benchmarks/generate.py`` saved in ``results/benchmarks/generate.json``;
- ``BENCH-COLOURS``: the rows of ``benchmarks/colours.py`` saved in ``results/benchmarks/colours.json`` (consensus
  attention against k-means as colour quantisers);
- ``BENCH-CUDA:<part>``: what a GPU measured, from ``results/benchmarks/cuda/``: ``path`` (benchmarks/cuda_path.py
  and train_step.py --device cuda), ``train`` (a gpt2-small run), ``long`` (magnitude.py --long), ``layer``
  (attention_layer.py in bfloat16), ``chunks`` (magnitude.py's low-rank prefix rows at several blocks against the
  explicit path, magnitude_chunks.json), ``kernels`` and ``kernels_lowrank`` (benchmarks/kernels.py's per-key and
  low-rank rows, kernels.json and kernels_lowrank.json), ``resources`` (benchmarks/kernel_resources.py: the Triton
  kernels' registers, spills and shared memory compiled for sm_90 without a GPU, kernel_resources_sm90.json;
  ``resources_backward``: the low-rank backward kernels with their own tiles, kernel_resources_backward_sm90.json).

Blocks with other names (the hand-written ``MAGNITUDE-TEXT`` and the like) are left alone. tests/test_docs.py
imports this file and checks that every committed block equals what it generates, so the text cannot drift from
the code or from the shipped results.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BLOCK = re.compile(r"<!-- ([A-Z][A-Z-]*(?::[\w-]+)*):BEGIN -->\n(.*?)<!-- \1:END -->", re.S)
GENERATED = ("VARIANTS", "SWITCHES:", "RESULTS:", "TASKS", "HIJACK-MECHANISM", "HIJACK-SUMMARY:", "HIJACK-PROTOCOL:",
             "LOWRANK-ERROR:", "BENCH-LONG:", "BENCH-CUDA:", "BENCH-LAYER:", "HEADS:", "SWAP:", "SWEEP:", "RANK-SWEEP:", "LEADERBOARD",
             "BENCH-COLOURS")

# The comparisons on the leaderboard, and those left off with the reason. A new study adds its comparisons to one.
LEADERBOARD = ("dilution-mqar-1", "dilution-mqar-2", "dilution-mqar-3", "dilution-nope-1", "dilution-alibi-mqar",
               "dilution-noisy-1", "dilution-noisy-2", "noisy-gates-1", "noisy-gates-2", "noisy-threshold-1", "noisy-threshold-2",
               "dilution-lm-1", "dilution-lm-2", "dilution-lm-3", "dilution-lm-4", "dilution-lm-5", "dilution-rope-lm", "dilution-rope-lm-2",
               "dilution-alibi-lm", "dilution-nope-lm",
               "hijack-v2-1", "hijack-v2-2", "hijack-v2-2-causal", "hijack-v2-4", "hijack-v2-5", "hijack-v2-1-h100", "hijack-v2-6",
               "hijack-v2-7", "hijack-v2-8",
               "recall-mqar-1", "recall-mqar-2", "recall-mqar-3", "recall-mqar-4", "mqar-gates-1", "mqar-gates-2",
               "recall-induction", "recall-induction-2", "induction-gates",
               "recall-selective-copy-1", "recall-selective-copy-2", "recall-selective-copy-3", "selective-copy-gates",
               "recall-noisy-recall-1", "recall-noisy-recall-2", "recall-noisy-recall-3",
               "magnitude", "boneless", "heads-1", "heads-2", "magnitude-long", "magnitude-long-2")
LEFT_OFF = {
    "hijack-1": "hijacking version 1: the baseline still learning and confounded task design (superseded by hijack-v2)",
    "hijack-2": "hijacking version 1 (superseded by hijack-v2)",
    "hijack-fixed": "hijacking version 1 (superseded by hijack-v2)",
    "hijack-mixed-1": "hijacking version 1 (superseded by hijack-v2)",
    "hijack-mixed-2": "hijacking version 1 (superseded by hijack-v2)",
    "hijack-mixed-3": "hijacking version 1 (superseded by hijack-v2)",
    "heads-hijack": "on hijacking version 1's task, 500-step runs not converged (superseded by hijack-v2)",
    "hijack-v2-3": "a calibration: one seed per variant, every run at its cap",
    "hijack-v2-4-calibration": "a calibration: one seed per variant, on another cap than the study's",
    "rank-sweep": "a weight-decay sweep of `standard` alone (pseudo-rank study): no variant to compare",
    "boneless-early": "the boneless comparison at an earlier, shorter budget (superseded by boneless)",
    **{f"zoology-mqar-{cell}-sweep": "a learning-rate sweep of `standard` alone: no variant to compare"
       for cell in ("t64-d64", "t64-d128", "t128-d64", "t128-d128")},
}
LEADERBOARD_PLOT = ROOT / "results" / "leaderboard.png"


def pages() -> list[Path]:
    """The README and every Markdown page of the docs: the files whose blocks are generated."""
    return [ROOT / "README.md", *sorted(DOCS.glob("**/*.md"))]


def _to_docs(page: Path) -> str:
    """The relative path from ``page`` to the docs root ('' inside docs/, 'docs/' for the README)."""
    rel = page.resolve().parent.relative_to(ROOT)
    if rel.parts[:1] == ("docs",):
        return "../" * (len(rel.parts) - 1)
    return "../" * len(rel.parts) + "docs/"


# Each write-up's entry on the Sources page: the names prose uses for it, and its anchor there
WRITEUP_ANCHORS = {
    "magnitude-attention": ("Magnitude Attention write-up", "magnitude write-up"),
    "boneless-attention": ("Boneless write-up",),
    "masking-and-positional-encodings": ("masking write-up",),
    "why-dot-products-why-softmax": ("softmax write-up",),
}
# The former numbers of the write-ups, still in the text of modules being reworded: linked to the same entries
LEGACY_NUMBERS = {"000": "magnitude-attention", "001": "boneless-attention",
                  "002": "masking-and-positional-encodings", "003": "why-dot-products-why-softmax"}


def link_writeups(text: str, to_docs: str) -> str:
    """Link every mention of a write-up ("the Boneless write-up", "the Boneless and softmax write-ups") to its entry
    on the Sources page."""
    anchor = {name: a for a, names in WRITEUP_ANCHORS.items() for name in names}
    names = sorted(anchor, key=len, reverse=True)
    pattern = "|".join(re.escape(n) for n in names)
    text = re.sub(rf"\b({pattern})\b", lambda m: f"[{m.group(1)}]({to_docs}sources.md#{anchor[m.group(1)]})", text)
    # "the Boneless and softmax write-ups": link each name
    short = {n.rsplit(" ", 1)[0]: a for n, a in anchor.items()}
    alternatives = "|".join(re.escape(n) for n in sorted(short, key=len, reverse=True))
    text = re.sub(rf"\b({alternatives}) and ({alternatives}) write-ups\b",
                  lambda m: (f"[{m.group(1)}]({to_docs}sources.md#{short[m.group(1)]}) and "
                             f"[{m.group(2)}]({to_docs}sources.md#{short[m.group(2)]}) write-ups"), text)

    def legacy(m: re.Match) -> str:
        word, numbers = m.group(1), m.group(2)
        return word + " " + re.sub(r"\d{3}", lambda n: f"[{n.group(0)}]({to_docs}sources.md#{LEGACY_NUMBERS[n.group(0)]})",
                                   numbers)

    return re.sub(r"\b(seeds?) (00[0-3](?:(?:, | and )00[0-3])*)\b", legacy, text)


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, pipes escaped, and outside `code` no * emphasis."""
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(p if p.startswith("`") else p.replace("*", "\\*") for p in parts).replace("|", "\\|")


# ------------------------------------------------------------------------------------------------------- variants


def variants_table(to_docs: str | None = None) -> str:
    """The variant registry as a Markdown table; with ``to_docs``, write-up mentions link to the Sources page."""
    from attnlab import variant_info, variants

    rows = ["| variant | what it is | source |", "|---|---|---|"]
    for name in variants():
        info = variant_info(name)
        description, source = cell(info.description), cell(info.source)
        if to_docs is not None:
            description, source = link_writeups(description, to_docs), link_writeups(source, to_docs)
        rows.append(f"| `{name}` | {description} | {source} |")
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------------------------------------------- switches


def config_classes() -> dict:
    """The config dataclasses whose fields are the switches, by class name."""
    from attnlab import AttentionConfig, GPTConfig
    from attnlab.config import HeadMixConfig, MagnitudeConfig, ProjectionConfig
    from attnlab.data import DataConfig
    from attnlab.train import TrainConfig

    return {c.__name__: c for c in (AttentionConfig, MagnitudeConfig, HeadMixConfig, ProjectionConfig,
                                            GPTConfig, TrainConfig, DataConfig)}


def field_docs(cls) -> dict[str, str]:
    """{field name: its attribute docstring (the string on the line after the field)}, read from the class's source.

    Every field must have one: a field without it is a ValueError naming it, so a new switch cannot reach the
    tables undocumented."""
    source = Path(inspect.getsourcefile(cls)).read_text()
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == cls.__name__)
    docs = {}
    for stmt, after in zip(node.body, [*node.body[1:], None]):
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        if not (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)):
            raise ValueError(f"{cls.__name__}.{stmt.target.id} has no docstring (a string on the line after the "
                             f"field); the switch tables need one")
        docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    else:
        return "(required)"
    if isinstance(value, str):
        return f'`"{value}"`'
    return f"`{value!r}`"


def switches_table(class_name: str, to_docs: str = "") -> str:
    """Every field of config dataclass ``class_name``: name, type, default and documentation."""
    cls = config_classes()[class_name]
    docs = field_docs(cls)
    rows = [f"| `{class_name}` field | type | default | meaning |", "|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        type_ = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
        rows.append(f"| `{f.name}` | `{cell(type_)}` | {_default(f)} | {link_writeups(cell(docs.get(f.name, '')), to_docs)} |")
    return "\n".join(rows) + "\n"


# --------------------------------------------------------------------------------------------------------- tasks


def tasks_table(to_docs: str = "") -> str:
    """The task registry as a Markdown table: name, what it is, its parameters' defaults, chance accuracy."""
    from attnlab.tasks import get_task, task_names

    rows = ["| task | what it is | defaults | chance |", "|---|---|---|---|"]
    for name in task_names():
        task = get_task(name)
        params = ", ".join(f"{f.name}={getattr(task, f.name)}" for f in dataclasses.fields(task))
        rows.append(f"| `{name}` | {link_writeups(cell(task.summary), to_docs)} | {cell(params)} (vocab "
                    f"{task.vocab_size}) | {task.chance_accuracy():.2%} |")
    return "\n".join(rows) + "\n"


# ------------------------------------------------------------------------------------------------------- results


_MECHANISM_ROWS = (("softmax", "softmax"), ("values/causal/clamp", "causal, clamp gate on the values (default)"),
                   ("values/prefix/clamp", "prefix, clamp gate on the values"),
                   ("values/causal/linear", "causal, linear gate on the values"),
                   ("values/prefix/linear", "prefix, linear gate on the values"),
                   ("logits/causal", "causal, logit prior"), ("logits/prefix", "prefix, logit prior"))


def hijack_mechanism_table() -> str:
    """The unique key's share of the readout against m, per form (magnitude_demo.hijack_share_against_m)."""
    from attnlab.experiments.magnitude_demo import hijack_share_against_m

    shares = hijack_share_against_m()
    rows = ["| form | " + " | ".join(f"m = {m}" for m in shares) + " |", "|---" * (len(shares) + 1) + "|"]
    for key, label in _MECHANISM_ROWS:
        rows.append(f"| {label} | " + " | ".join(f"{row[key]:.3f}" for row in shares.values()) + " |")
    return "\n".join(rows) + "\n"


def results_block(name: str) -> str:
    """What ``attnlab report results/<name>`` prints as tables, from the raw logs shipped there."""
    from attnlab.experiments.report import read_results, results_tables

    results, _ = read_results(ROOT / "results" / name)
    return collapse(results_tables(results, heading="####"), COLLAPSED)


# The per-seed and per-step tables: folded on the pages (a click opens them), out of the table of contents.
COLLAPSED = ("Final validation loss per seed", "Final validation accuracy (%) per seed", "Validation loss during training",
             "Validation accuracy (%) during training")


def collapse(text: str, titles: tuple[str, ...]) -> str:
    """Each ``#### <title>`` section of ``text`` (up to the next heading) as a folded block (pymdownx.details)."""
    out, inside = [], False
    for line in text.splitlines():
        if line.startswith("#"):
            inside = line.lstrip("#").strip() in titles
            if inside:
                out += [f'??? note "{line.lstrip("#").strip()}"']
                continue
        out.append(("    " + line if line else "") if inside else line)
    return "\n".join(out) + "\n"


def hijack_summary_block(prefix: str) -> str:
    """The parts results/<prefix>-1, -2, ... of a hijack experiment in one table (hijack_report.hijack_summary)."""
    from attnlab.experiments.hijack_report import hijack_summary
    from attnlab.experiments.report import read_results

    return hijack_summary([(p.name, read_results(p)[0]) for p in _parts(prefix)])


def _parts(prefix: str) -> list:
    """results/<prefix>-1, -2, ... in order of their number."""
    dirs = [p for p in (ROOT / "results").glob(f"{prefix}-*") if re.fullmatch(rf"{re.escape(prefix)}-\d+", p.name)]
    return sorted(dirs, key=lambda p: int(p.name.rsplit("-", 1)[1]))


def hijack_protocol_block(spec: str) -> str:
    """``<fixed>:<prefix>``: results/<fixed> against the parts results/<prefix>-1, -2, ...
    (hijack_report.hijack_protocol)."""
    from attnlab.experiments.hijack_report import hijack_protocol
    from attnlab.experiments.report import read_results

    fixed, prefix = spec.split(":", 1)
    return hijack_protocol((fixed, read_results(ROOT / "results" / fixed)[1]),
                           [(p.name, read_results(p)[1]) for p in _parts(prefix)])


def bench_long_block(path: Path) -> str:
    """A table of the rows (and the scaling exponents) of a saved ``benchmarks/magnitude.py`` run (``--long``)."""
    import json

    bench = json.loads(path.read_text())
    lines = ["| row | T | fwd+bwd ms | SDPA ms | ratio | target | peak MiB | SDPA peak MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for r in bench["results"]:
        target = "" if r["target_ratio"] is None else f"<= {r['target_ratio']}x ({'met' if r['met'] else 'not met'})"
        lines.append(f"| {r['row']} | {r['seq']} | {r['fwd_bwd_ms']:,} | {r['sdpa_fwd_bwd_ms']:,} | "
                     f"{r['fwd_bwd_ratio']}x | {target} | {r['peak_mb']} | {r['sdpa_peak_mb']} |")
    slopes = ", ".join(f"{k} {v}" for k, v in bench["scaling"].items())
    load = bench.get("load_average_1min")
    load = "" if bench["device"] != "cpu" or not load else \
        f" Load average (1 min) {load['before']} before, {load['after']} after."
    return "\n".join(lines) + f"\n\nScaling exponents (log-log slope of time against T): {slopes}.{load}\n"


def heads_block(name: str) -> str:
    """The head analyses saved under results/<name>/<variant>/seed<k>/heads/heads.json, one table."""
    import json

    from attnlab.experiments.heads import heads_table

    files = sorted((ROOT / "results" / name).glob("*/seed*/heads/heads.json"))
    return heads_table({f"`{f.parents[2].name}` {f.parents[1].name}": json.loads(f.read_text()) for f in files})


def swap_block(name: str) -> str:
    """The test-time attention swaps saved under results/<name>/<variant>/seed<k>/swap-*.json: the task accuracy and
    the accuracy at every hijack sweep cell, trained -> swapped."""
    import json

    from attnlab.experiments.swap import swap_summary_table

    first = next(iter(sorted((ROOT / "results" / name).glob("*/seed*/swap-*.json"))), None)
    metrics = [] if first is None else [k for k in json.loads(first.read_text())["original"]
                                        if k == "accuracy" or k.endswith("/accuracy")]
    return swap_summary_table(ROOT / "results" / name, metrics)


def bench_chunks_table(bench: dict) -> str:
    """| T | one column per block of the lowrank-prefix rows | the explicit path | SDPA |: fwd+bwd ms (peak MiB)."""
    rows = bench["results"]
    chunks = sorted({r["chunk"] for r in rows if r["row"] == "lowrank-prefix" and "chunk" in r})
    lines = ["| T | " + " | ".join(f"blocks of {c}" for c in chunks) + " | explicit path ([T, T] gate) | SDPA |",
             "|---" * (len(chunks) + 3) + "|"]
    for t in sorted({r["seq"] for r in rows if r["row"] == "lowrank-prefix"}):
        at = {(r["row"], r.get("chunk")): r for r in rows if r["seq"] == t}
        cells = [at.get(("lowrank-prefix", c)) for c in chunks] + [at.get(("lowrank-prefix-explicit", None))]
        sdpa = min(r["sdpa_fwd_bwd_ms"] for r in at.values())
        lines.append(f"| {t} | " + " | ".join("" if r is None else f"{r['fwd_bwd_ms']} ms ({r['peak_mb']:.0f} MiB)"
                                               for r in cells) + f" | {sdpa} ms |")
    s = bench["shape"]
    return "\n".join(lines) + (f"\n\nForward+backward of one layer, batch {s['batch']}, {s['heads']} heads, head_dim "
                               f"{s['head_dim']}, {bench['dtype']}, medians of {bench['repeats']}; SDPA: the raw-SDPA "
                               f"layer at that T, the fastest of its timings in the same run.\n")


KERNEL_ROUTES = {  # benchmarks/kernels.py's routes, as the speed page names them
    "rows": {"sdpa_flash": "SDPA flash, no prior (the floor)", "kernel": "`prior_attention` with the prior",
             "kernel_no_prior": "`prior_attention` without a prior",
             "sdpa_float_mask": "SDPA with the prior as a float mask", "flex": "FlexAttention, `s + p[b, h, kv]`"},
    "lowrank": {"sdpa_flash": "SDPA flash, no prior (the floor)", "kernel": "`lowrank_prior_attention`",
                "kernel_ieee_factors": "the same, factors' products in IEEE float32",
                "sdpa_float_mask": "SDPA with the dense prior as a float mask",
                "prefix_blocks": "the PyTorch block path (blocks of 64)",
                "gate_kernel": "`lowrank_gate_attention` (clamp gate)",
                "gate_prefix_blocks": "the PyTorch block path with the clamp gate"}}


def bench_kernels_table(bench: dict, key: str) -> str:
    """One row per route of a ``benchmarks/kernels.py`` run (``key``: "rows" for the per-key prior, "lowrank"),
    one column per T: forward+backward ms, the ratio to SDPA flash in the same run, peak MiB."""
    rows = bench[key]
    lines = [f"| route, fwd+bwd, {bench['dtype']} | " + " | ".join(f"T = {r['T']}" for r in rows) + " |",
             "|---" * (len(rows) + 1) + "|"]
    labels = dict(KERNEL_ROUTES[key])
    if key == "lowrank" and "kernel_backward_blocks" in bench:  # the backward tiles the wrapper chose by default
        labels["kernel"] += ", backward tiles ({}, {})".format(*bench["kernel_backward_blocks"])
    for route in dict.fromkeys(name for r in rows for name in r["routes"]):
        if route.startswith("kernel_bwd_w"):  # --lowrank-backward-warps W
            labels.setdefault(route, f"the same, {route[12:]} warps per backward program")
        elif route.startswith("kernel_bwd_"):  # --lowrank-backward-blocks OxI: backward_blocks=(O, I)
            labels.setdefault(route, "the same, backward tiles ({}, {})".format(*route[11:].split("x")))
        elif route.startswith("kernel_"):  # --lowrank-blocks MxN: the forward's tiles
            labels.setdefault(route, f"the same, tiles of {route.removeprefix('kernel_').replace('x', ' x ')}")
        else:
            labels.setdefault(route, route)
    for route, label in labels.items():
        cells = [r["routes"].get(route) for r in rows]
        lines.append(f"| {label} | " + " | ".join(
            "" if x is None else "out of memory" if "OutOfMemory" in x.get("error", "") else x.get("error") or
            f"{x['ms']:.3g} ms, {x['ratio']:.2f}x, {x['peak_mib']:,.0f} MiB" for x in cells) + " |")
    diff = max(x for r in rows if isinstance(x := r["kernel_max_abs_diff_vs_float_mask"], (int, float)))
    rank = f", rank {rows[0]['rank']}" if "rank" in rows[0] else ""
    return "\n".join(lines) + (f"\n\n{bench['device']}, torch {bench['torch']}, Triton {bench['triton']}; batch "
                               f"{bench['batch']}, {bench['heads']} heads, head_dim {bench['head_dim']}{rank}, causal; "
                               f"medians of {bench['repeats']} rounds; each cell: milliseconds, the ratio to SDPA flash "
                               f"at that T, peak memory of one call. The kernel's output differs from the float-mask "
                               f"route's by at most {diff} (bfloat16 outputs).\n")


def bench_cuda_block(part: str) -> str:
    """Tables of what a GPU measured (results/benchmarks/cuda/): the CUDA path's design checks, a training run,
    the long-context magnitude rows and the attention layer in bfloat16."""
    import json

    folder = ROOT / "results" / "benchmarks" / "cuda"
    if part == "long":
        return bench_long_block(folder / "magnitude_long.json")
    if part in ("resources", "resources_backward"):
        backward = part == "resources_backward"
        bench = json.loads((folder / f"kernel_{part}_sm90.json").read_text())

        def config(r):  # forward-style tiles (block_m x block_n), or a backward kernel's (outer, inner)
            if not backward:
                return f"{r['block_m']} x {r['block_n']}, {r['num_warps']} warps"
            outer, inner = (r["block_n"], r["block_m"]) if "_dkdv_" in r["kernel"] else (r["block_m"], r["block_n"])
            return f"({outer}, {inner}), {r['num_warps']} warps"

        configs = list(dict.fromkeys(config(r) for r in bench["rows"]))
        cell = {(r["kernel"], config(r)): r for r in bench["rows"]}
        lines = ["| kernel | " + " | ".join(configs) + " |", "|---" * (len(configs) + 1) + "|"]
        for kernel in dict.fromkeys(r["kernel"] for r in bench["rows"]):
            lines.append(f"| `{kernel}` | " + " | ".join(
                f"{cell[kernel, c]['regs']} / {cell[kernel, c]['stack_bytes']}" for c in configs) + " |")
        return "\n".join(lines) + (f"\n\nEach cell: registers per thread / stack bytes per thread (spilled registers)"
                                   + (" with backward_blocks = (outer, inner)" if backward else "")
                                   + f". Compiled for {bench['arch']} by Triton {bench['triton']} on the CPU, "
                                   f"{bench['dtype']} inputs, head_dim {bench['head_dim']}, rank {bench['rank']}.\n")
    if part in ("kernels", "kernels_lowrank"):
        return bench_kernels_table(json.loads((folder / f"{part}.json").read_text()),
                                   "rows" if part == "kernels" else "lowrank")
    if part == "chunks":
        return bench_chunks_table(json.loads((folder / "magnitude_chunks.json").read_text()))
    if part == "layer":
        bench = json.loads((folder / "attention_layer_bf16.json").read_text())
        lines = layer_rows(bench, core=False)
        s = bench["shape"]
        return "\n".join(lines) + (f"\n\nBatch {s['batch']}, {s['heads']} heads, T = {s['seq']}, head_dim "
                                   f"{s['head_dim']}, {bench['dtype']}, torch {bench['torch']}, medians of "
                                   f"{bench['repeats']}.\n")
    if part == "train":  # every saved run summary: <preset>[-compiled | -<dtype> | -<variant>...]_summary.json
        lines = ["| run | variant | dtype | compiled | steps | wall s | tokens/s | MFU | peak TFLOP/s (measured) | "
                 "val loss |", "|---|---|---|---|---|---|---|---|---|---|"]
        for f in sorted(folder.glob("*_summary.json")):
            r = json.loads(f.read_text())
            run = f.name.removesuffix("_summary.json")
            lines.append(f"| `{run}` | `{r['variant']}` | {r['dtype']} | {'yes' if 'compiled' in run else 'no'} | "
                         f"{r['steps']} | {r['wall_time_s']:.0f} | {r['tokens_per_s']:,.0f} | "
                         f"{100 * r['mfu']:.{1 if r['mfu'] > 0.01 else 3}f}% | {r['matmul_peak_gflops'] / 1e3:.0f} | "
                         f"{r['final_val_loss']:.3f} |")
        return "\n".join(lines) + "\n"
    path = json.loads((folder / "cuda_path.json").read_text())
    step = json.loads((folder / "train_step.json").read_text())
    peaks = path["peaks_gflops"]
    lines = ["Matmul rate (n = 8192, TFLOP/s): " + ", ".join(f"{k.replace('_', ' with ')} {v['8192'] / 1e3:.1f}"
                                                           for k, v in peaks.items()) + ".", "",
             "| magnitude gate | CPU float32 | GPU, TF32 on, guarded | GPU, TF32 on, unguarded |", "|---|---|---|---|"]

    def pair(v):
        return "Cholesky fails" if isinstance(v, str) else f"{v[0]:.2g} / {v[1]:.2g}"

    for name, row in path["tf32_gate_errors"].items():
        if name != "note":
            lines.append(f"| {name} | {pair(row['cpu_float32'])} | {pair(row['cuda_float32_tf32_guarded'])} | "
                         f"{pair(row['cuda_float32_tf32_unguarded'])} |")
    lines += ["", "| GQA, 8 query / 2 K/V heads, T = 1024 | kernels taking enable_gqa | attnlab ms | SDPA enable_gqa ms "
              "| SDPA repeated K/V ms | attnlab / best |", "|---|---|---|---|---|---|"]
    for dtype, g in path["gqa"].items():
        took = ", ".join(k.split("_")[0].lower() for k, ok in g["enable_gqa_accepted_by"].items() if ok)
        ms = g["fwd_bwd_ms"]
        lines.append(f"| {dtype} | {took} | {ms['attnlab']} | {ms['sdpa_enable_gqa']} | {ms['sdpa_repeated_kv']} | "
                     f"{g['attnlab_over_best_raw']}x |")
    lines += ["", f"Training step of the `cpu` preset on the GPU ({step['dtype']}, TF32): attnlab "
              f"{step['median_step_ms']['attnlab']} ms against the nanoGPT-style reference's "
              f"{step['median_step_ms']['reference']} ms, ratio {step['ratio']} ({step['steps_each']} steps each; "
              f"step-0 losses {step['step0_loss']['attnlab']} and {step['step0_loss']['reference']})."]
    return f"{path['device_name']}, torch {path['torch']} (CUDA {path['cuda']}).\n\n" + "\n".join(lines) + "\n"


def layer_rows(bench: dict, core: bool, rounded: bool = False) -> list[str]:
    """The table of a ``benchmarks/attention_layer.py`` run: each variant's path and its layer's milliseconds and
    ratios to the raw-SDPA layer; with ``core``, the attention function alone against one SDPA call too; with
    ``rounded``, milliseconds to whole numbers (3 significant digits below 10 ms) and ratios to two decimals (as the
    JSON has them otherwise)."""
    def ms(x):
        return (f"{x:.3g}" if x < 10 else f"{x:.0f}") if rounded else f"{x}"

    def ratio(x):
        return f"{x:.2f}x" if rounded else f"{x}x"

    lines = ["| variant | path | fwd ms | fwd vs SDPA | fwd+bwd ms | fwd+bwd vs SDPA |" + (" core fwd vs SDPA |" if core
                                                                                       else ""),
             "|---|---|---|---|---|---|" + ("---|" if core else "")]
    for r in bench["results"]:
        path = r.get("path") or ("SDPA" if r["sdpa_path"] else "explicit")  # runs before the path was saved
        name = f"`{r['variant']}`" + (", compiled" if r.get("compiled") else "")  # --compile: both layers compiled
        row = (f"| {name} | {path} | {ms(r['layer_fwd_ms'])} | {ratio(r['layer_fwd_ratio'])} | "
               f"{ms(r['layer_fwd_bwd_ms'])} | {ratio(r['layer_fwd_bwd_ratio'])} |")
        if core:
            row += " n/a (in the layer) |" if r["core_fwd_ratio"] is None else f" {ratio(r['core_fwd_ratio'])} |"
        lines.append(row)
    return lines


def bench_layer_block(stem: str) -> str:
    """The rows of a saved ``benchmarks/attention_layer.py`` run: each variant's route, its layer's milliseconds and
    their ratio to the raw-SDPA layer measured in the same run, and the attention function alone against one SDPA
    call where the layer's cost is all in it."""
    import json

    bench = json.loads((ROOT / "results" / "benchmarks" / f"{stem.replace(':', '/')}.json").read_text())
    lines = layer_rows(bench, core=True, rounded=True)
    s = bench["shape"]
    fwd = [r["sdpa_layer_fwd_ms"] for r in bench["results"]]
    both = [r["sdpa_layer_fwd_bwd_ms"] for r in bench["results"]]
    modifiers = "ALiBi's bias in every layer (the reference has none), " if bench.get("pos_encoding") == "alibi" else ""
    if bench.get("softcap") is not None:
        modifiers += f"logits capped at c = {bench['softcap']:g} in every layer (the reference has none), "
    if bench.get("backend"):
        modifiers += f"every variant on backend '{bench['backend']}', "
    where = f"{bench['threads']} thread(s), " if bench["device"] == "cpu" else ""

    def span(ms):  # a range of milliseconds, to 3 significant digits below 10 ms
        return "-".join(f"{x:.3g}" if max(ms) < 10 else f"{x:.0f}" for x in (min(ms), max(ms)))

    return "\n".join(lines) + (
        f"\n\nBatch {s['batch']}, {s['heads']} heads, T = {s['seq']}, head_dim {s['head_dim']}, causal, {modifiers}"
        f"{bench['dtype']} on {bench['device']} ({where}torch {bench['torch']}), medians of "
        f"{bench['repeats']}; the raw-SDPA layer took {span(fwd)} ms forward and "
        f"{span(both)} ms forward+backward across the rows.\n")


def bench_colours_block() -> str:
    """The rows of a saved ``benchmarks/colours.py`` run: consensus attention against k-means as colour quantisers."""
    import json

    bench = json.loads((ROOT / "results" / "benchmarks" / "colours.json").read_text())
    lines = ["| g | consensus clusters (kept) | consensus MSE / PSNR | k-means MSE / PSNR | consensus fit | k-means fit "
             "| fit time ratio (range) |", "|---|---|---|---|---|---|---|"]
    for r in bench["rows"]:
        low, high = r["ratio_range"]
        lines.append(f"| {r['scale']:g} | {r['clusters']} ({r['kept']}) | {r['consensus_mse']:.5f} / "
                     f"{r['consensus_psnr_db']:.2f} dB | {r['kmeans_mse']:.5f} / {r['kmeans_psnr_db']:.2f} dB | "
                     f"{r['consensus_fit_s']:.3f} s | {r['kmeans_fit_s']:.4f} s | {r['ratio']:.0f}x ({low:.0f}-{high:.0f}x) |")
    return "\n".join(lines) + (f"\n\nMedians of {bench['repeats']} alternating fits of each method on the same "
                               f"{bench['samples']:,} pixels ({bench['machine']}, {bench['threads']} thread{'' if bench['threads'] == 1 else 's'}, torch "
                               f"{bench['torch']}); `results/benchmarks/colours.json`.\n")


def bench_generate_block() -> str:
    """The rows of a saved ``benchmarks/generate.py`` run: tokens/s with and without the K/V cache."""
    import json

    bench = json.loads((ROOT / "results" / "benchmarks" / "generate.json").read_text())
    lines = ["| variant | tokens | cached tokens/s | recomputed tokens/s | speedup | same tokens |",
             "|---|---|---|---|---|---|"]
    for r in bench["rows"]:
        lines.append(f"| `{r['variant']}` | {r['tokens']} | {r['cached_tokens_per_s']:,} | "
                     f"{r['recomputed_tokens_per_s']:,} | {r['speedup']}x | {'yes' if r['same_tokens'] else 'NO'} |")
    m = bench["model"]
    return "\n".join(lines) + (f"\n\n{m['n_layer']} layers, {m['n_head']} heads, width {m['n_embd']}, {m['pos']} "
                               f"positions, batch {bench['rows'][0]['batch']}, {bench['threads']} thread(s), "
                               f"torch {bench['torch']}.\n")


# ------------------------------------------------------------------------------------------------------- pages


def _comparison_pages() -> dict[str, Path]:
    """{results directory: the docs page that shows its RESULTS block}."""
    out = {}
    for page in sorted(DOCS.glob("**/*.md")):
        for name in re.findall(r"<!-- RESULTS:([\w-]+):BEGIN -->", page.read_text()):
            out.setdefault(name, page)
    return out


def leaderboard_entries():
    from attnlab.experiments.leaderboard import leaderboard

    return leaderboard(ROOT / "results", list(LEADERBOARD))


def leaderboard_key(entries) -> str:
    from attnlab.experiments import leaderboard as module
    from attnlab.experiments.figures import inputs_key

    return inputs_key([dataclasses.asdict(e) for e in entries], drawn_by=(module,))


def leaderboard_block(page: Path) -> str:
    from attnlab.experiments.leaderboard import leaderboard_tables

    where, here = _comparison_pages(), page.resolve().parent

    def link(name: str) -> str:
        target = where.get(name)
        return f"`{name}`" if target is None else f"[`{name}`]({Path(*_relative(target, here)).as_posix()})"

    left = "\n".join(f"| `{name}` | {why} |" for name, why in LEFT_OFF.items())
    return (leaderboard_tables(leaderboard_entries(), link)
            + "\n### Left off the leaderboard\n\n| comparison | why |\n|---|---|\n" + left + "\n")


def _relative(target: Path, start: Path) -> tuple[str, ...]:
    import os

    return tuple(Path(os.path.relpath(target, start)).parts)


def render(name: str, page: Path) -> str | None:
    """The generated text of block ``name`` on ``page``; None for a block that is not generated."""
    to_docs = _to_docs(page)
    if name == "VARIANTS":
        return variants_table(to_docs)
    if name.startswith("SWITCHES:"):
        return switches_table(name.split(":", 1)[1], to_docs)
    if name.startswith("RESULTS:"):
        return results_block(name.split(":", 1)[1])
    if name == "TASKS":
        return tasks_table(to_docs)
    if name == "HIJACK-MECHANISM":
        return hijack_mechanism_table()
    if name.startswith("HIJACK-SUMMARY:"):
        return hijack_summary_block(name.split(":", 1)[1])
    if name.startswith("HIJACK-PROTOCOL:"):
        return hijack_protocol_block(name.split(":", 1)[1])
    if name.startswith("BENCH-LONG:"):
        folder, _, stem = name.split(":", 1)[1].partition(":")
        return bench_long_block(ROOT / "results" / folder / f"{stem or 'bench_long'}.json")
    if name.startswith("HEADS:"):
        return heads_block(name.split(":", 1)[1])
    if name.startswith("SWAP:"):
        return swap_block(name.split(":", 1)[1])
    if name == "LEADERBOARD":
        return leaderboard_block(page)
    if name.startswith("SWEEP:"):
        from attnlab.experiments.grid_sweep import find_sweep, sweep_results, sweep_table

        folder = ROOT / "results" / name.split(":", 1)[1]
        return sweep_table(sweep_results(folder, *find_sweep(folder)))
    if name.startswith("RANK-SWEEP:"):
        from attnlab.experiments.sweep import sweep_report

        return sweep_report(ROOT / "results" / name.split(":", 1)[1])["table"]
    if name == "BENCH-GENERATE":
        return bench_generate_block()
    if name == "BENCH-COLOURS":
        return bench_colours_block()
    if name.startswith("BENCH-LAYER:"):
        return bench_layer_block(name.split(":", 1)[1])
    if name.startswith("BENCH-CUDA:"):
        return bench_cuda_block(name.split(":", 1)[1])
    if name.startswith("LOWRANK-ERROR:"):
        import json

        from attnlab.experiments.lowrank_error import error_table

        folder, _, stem = name.split(":", 1)[1].partition(":")
        return error_table(json.loads((ROOT / "results" / folder / f"{stem or 'error'}.json").read_text()))
    return None


def blocks(text: str) -> list[tuple[str, str]]:
    """[(name, committed content)] of every marked block in ``text``, generated or not."""
    return BLOCK.findall(text)


def regenerate(text: str, page: Path) -> str:
    """``text`` with every generated block replaced by what the code and results/ give now."""

    def sub(m: re.Match) -> str:
        new = render(m.group(1), page)
        return m.group(0) if new is None else f"<!-- {m.group(1)}:BEGIN -->\n{new}<!-- {m.group(1)}:END -->"

    return BLOCK.sub(sub, text)


def stale() -> list[str]:
    """'page: block' for every generated block whose committed text differs from the generated one."""
    out = []
    for page in pages():
        text = page.read_text()
        for name, committed in blocks(text):
            new = render(name, page)
            if new is not None and new != committed:
                out.append(f"{page.relative_to(ROOT)}: {name}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--check"]:
        bad = stale()
        for line in bad:
            print(f"stale: {line}")
        return 1 if bad else 0
    if argv:
        print(__doc__.split("\n\n")[1])
        return 2
    for page in pages():
        text = page.read_text()
        new = regenerate(text, page)
        if new != text:
            page.write_text(new)
            print(f"rewrote {page.relative_to(ROOT)}")
    from attnlab.experiments.figures import is_current
    from attnlab.experiments.leaderboard import plot_leaderboard

    entries = leaderboard_entries()
    key = leaderboard_key(entries)
    if not is_current(LEADERBOARD_PLOT, key):
        plot_leaderboard(entries, LEADERBOARD_PLOT, key)
        print(f"drew {LEADERBOARD_PLOT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
