"""Benchmark: the magnitude-gated attention layers (the magnitude write-up) against raw SDPA, with its speed targets.

Rows (batch 8, heads 8, head_dim 64, forward+backward; the targets of "Magnitude Attention, done right"):
  global-cg        magnitude="global", solver="cg", 5 iterations, bidirectional (causal=false): seq 512, <= 1.5x
  magnitude-causal key j's weight inside its own prefix (one Cholesky factor):                  seq 256, <= 2x
  magnitude-prefix key j's weight inside query i's prefix (explicit attention path):             seq 256, <= 3x
plus magnitude-causal and magnitude-prefix at seq 512 (no target; the README's speed table measured them there), and
the logit-prior forms (magnitude_apply="logits", the control of the hijack study) at seq 256 (no target).

--long: the long-context rows at batch 1: the low-rank solver (magnitude_solver="lowrank", default rank
and chunk) beside the exact forms at the same T, so that the crossover shows:
  lowrank-causal   seq 1024, 2048, 4096: <= 1.5x, and peak memory <= 2x SDPA's
  lowrank-prefix   seq 1024, 2048:       <= 3x (block by block: attnlab.mechanisms.magnitude.prefix_blocks)
  lowrank-prefix-explicit seq 1024, 2048: the same layer with backend="explicit" ([T, T] gate; no target)
  magnitude-causal seq 1024, 2048, 4096 and magnitude-prefix seq 1024, 2048 (exact; no target)
and "scaling": per row name, the log-log slope of the fwd+bwd time against T (least squares over its seqs).

Conventions of benchmarks/attention_layer.py (its helpers are imported, not copied): the reference is a layer with
the same q/k/v/out projections around one F.scaled_dot_product_attention call (is_causal as the variant's), timed
in this same run, alternating variant and reference call by call (medians over --repeats); ratio = variant median /
reference median. Forward-only numbers come along (no target).

Peak memory of one forward+backward call, after a warm-up call (so parameter gradients already exist):
  cuda: torch.cuda.max_memory_allocated after reset_peak_memory_stats (bytes above the memory held before the call)
  cpu:  torch.profiler with profile_memory=True: the largest running total of bytes allocated minus freed by torch's
        CPU allocator during the call (tensors alive before the call are not counted). Not RSS: the C library may
        keep or map more than torch asks for.

    python benchmarks/magnitude.py                          # CPU fp32, every row
    python benchmarks/magnitude.py --rows magnitude-causal:256 global-cg:512 --repeats 5
    python benchmarks/magnitude.py --profile magnitude-causal:256          # torch.profiler table instead of JSON
    python benchmarks/magnitude.py --long --repeats 3                       # the long-context rows, batch 1
    python benchmarks/magnitude.py --batch 1 --rows lowrank-prefix:2048:256  # a low-rank row with its chunk set
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import torch
import torch.nn.functional as F

from attention_layer import RawSDPALayer, _sync, add_shape_args, compare, fwd, fwd_bwd  # benchmarks/ helpers (its folder is on sys.path)

from attnlab import GPTConfig
from attnlab.attention_config import prefix_block, route
from attnlab.nn import Attention

# row name -> (AttentionConfig overrides, causal); the variants' own defaults otherwise (eps 1e-3, clamp gate, t 1)
FORMS = {
    "global-cg": ({"magnitude": "global", "magnitude_solver": "cg", "magnitude_cg_iters": 5, "causal": False}, False),
    "magnitude-causal": ("magnitude-causal", True),
    "magnitude-prefix": ("magnitude-prefix", True),
    "magnitude-causal-logits": ("magnitude-causal-logits", True),  # the weights as a logit prior (no target)
    "magnitude-prefix-logits": ("magnitude-prefix-logits", True),
    "lowrank-causal": ({"magnitude": "causal", "magnitude_solver": "lowrank"}, True),  # the low-rank solver
    "lowrank-prefix": ({"magnitude": "prefix", "magnitude_solver": "lowrank"}, True),  # blocks (prefix_attention)
    "lowrank-prefix-explicit": ({"magnitude": "prefix", "magnitude_solver": "lowrank", "backend": "explicit"}, True),
    "lowrank-prefix-logits": ("magnitude-prefix-logits-lowrank", True),  # blocks, the prior inside the softmax
    "lowrank-prefix-logits-sdpa": ({"magnitude": "prefix", "magnitude_solver": "lowrank", "magnitude_apply": "logits",
                                    "backend": "sdpa"}, True),  # the [T, T] prior as SDPA's float mask
}
CHUNKED = [n for n, (a, _) in FORMS.items() if isinstance(a, dict) and a.get("magnitude_solver") == "lowrank"]  # NAME:SEQ:CHUNK
TARGETS = {("global-cg", 512): 1.5, ("magnitude-causal", 256): 2.0, ("magnitude-prefix", 256): 3.0}
DEFAULT_ROWS = ["global-cg:512", "magnitude-causal:256", "magnitude-prefix:256", "magnitude-causal:512",
                "magnitude-prefix:512", "magnitude-causal-logits:256", "magnitude-prefix-logits:256"]
LONG_TARGETS = {**{("lowrank-causal", t): 1.5 for t in (1024, 2048, 4096)},
                **{("lowrank-prefix", t): 3.0 for t in (1024, 2048)}}
LONG_MEMORY_TARGETS = {("lowrank-causal", t): 2.0 for t in (1024, 2048, 4096)}  # peak_mb / sdpa_peak_mb
LONG_SEQS = {"lowrank-causal": (1024, 2048, 4096), "magnitude-causal": (1024, 2048, 4096),
             "lowrank-prefix": (1024, 2048), "lowrank-prefix-explicit": (1024, 2048), "magnitude-prefix": (1024, 2048)}
LONG_ROWS = [f"{name}:{t}" for name, ts in LONG_SEQS.items() for t in ts]


class RawSDPABidirectional(RawSDPALayer):
    """The reference for the bidirectional (global) form: the same layer with is_causal=False."""

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (m(x).view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for m in (self.q, self.k, self.v))
        return self.o(F.scaled_dot_product_attention(q, k, v, is_causal=False).transpose(1, 2).reshape(b, t, c))


def peak_memory_mb(fn, device) -> tuple[float, str]:
    """(MiB, method): peak bytes allocated during fn() above what was allocated before it (see the docstring)."""
    if device.type == "cuda":
        _sync(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        _sync(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20, "torch.cuda.max_memory_allocated"
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    totals, stack = [0], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        stack.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            totals.append(event.extra_fields.total_allocated)
    return max(totals) / 2**20, "torch.profiler profile_memory (CPU allocator, running total)"


def build(name: str, seq: int, heads: int, head_dim: int, device, dtype, chunk: int | None = None):
    """The row's layer and its raw-SDPA reference; chunk sets magnitude_chunk and magnitude_block (the low-rank
    solver's chunk and the block of lowrank_prefix_attention) for the rows given as overrides."""
    attention, causal = FORMS[name]
    if chunk is not None:
        if name not in CHUNKED:
            raise SystemExit(f"--rows: {name}:{seq}:{chunk} sets a chunk, which only the low-rank rows given as "
                             f"overrides take ({', '.join(CHUNKED)})")
        attention = {**attention, "magnitude_chunk": chunk, "magnitude_block": chunk}  # the block on every device
    n_embd = heads * head_dim
    cfg = GPTConfig(n_head=heads, n_embd=n_embd, block_size=seq, attention=attention).resolved_attention()
    reference = (RawSDPALayer if causal else RawSDPABidirectional)(n_embd, heads)
    layer = Attention(cfg, n_embd)
    layer.magnitude.record_stats = False  # as on the trainer's steps that are not logged
    return layer.to(device, dtype), reference.to(device, dtype), cfg


def parse_row(text: str) -> tuple[str, int, int | None]:
    """NAME:SEQ or NAME:SEQ:CHUNK -> (name, seq, chunk or None)."""
    name, seq, chunk = (text.split(":") + [""])[:3]
    if name not in FORMS or not seq.isdigit() or not (chunk == "" or chunk.isdigit() and int(chunk) > 0):
        raise SystemExit(f"--rows: {text!r} is not NAME:SEQ or NAME:SEQ:CHUNK with NAME one of {', '.join(FORMS)}")
    return name, int(seq), int(chunk) if chunk else None


def profile_row(layer, x, device) -> None:
    from torch.profiler import ProfilerActivity, profile

    step = fwd_bwd(layer, x)
    step()
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])) as p:
        step()
        _sync(device)
    print(p.key_averages().table(sort_by="self_cpu_time_total", row_limit=40))


def scaling_exponents(results: list[dict]) -> dict:
    """{row name: slope} of log(fwd_bwd_ms) against log(seq), least squares, for every name timed at >= 2 seqs."""
    import math

    out = {}
    for name in dict.fromkeys(r["row"] for r in results):
        pts = [(math.log(r["seq"]), math.log(r["fwd_bwd_ms"])) for r in results if r["row"] == name]
        if len({x for x, _ in pts}) >= 2:
            mx, my = sum(x for x, _ in pts) / len(pts), sum(y for _, y in pts) / len(pts)
            out[name] = round(sum((x - mx) * (y - my) for x, y in pts) / sum((x - mx) ** 2 for x, _ in pts), 2)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="*", default=DEFAULT_ROWS,
                   help="NAME:SEQ or NAME:SEQ:CHUNK (a low-rank row's magnitude_chunk, also its block of queries on "
                        "every device when any row sets one), NAME in " + ", ".join(FORMS))
    add_shape_args(p)
    p.add_argument("--profile", metavar="NAME:SEQ", help="print a torch.profiler table of one fwd+bwd call and exit")
    p.add_argument("--long", action="store_true", help="the long-context rows at batch 1 (overrides --rows "
                                                       "and --batch)")
    args = p.parse_args(argv)
    targets, memory_targets = TARGETS, {}
    if args.long:
        args.rows, args.batch, targets, memory_targets = LONG_ROWS, 1, LONG_TARGETS, LONG_MEMORY_TARGETS

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.manual_seed(0)
    if args.profile:
        name, seq, chunk = parse_row(args.profile)
        layer, _, _ = build(name, seq, args.heads, args.head_dim, device, dtype, chunk)
        x = torch.randn(args.batch, seq, args.heads * args.head_dim, device=device, dtype=dtype, requires_grad=True)
        profile_row(layer, x, device)
        return
    results, memory_method, load_before = [], None, os.getloadavg()
    rows = [parse_row(r) for r in args.rows]
    for name, seq, chunk in rows:
        layer, reference, cfg = build(name, seq, args.heads, args.head_dim, device, dtype, chunk)
        x = torch.randn(args.batch, seq, args.heads * args.head_dim, device=device, dtype=dtype)
        x_grad = x.clone().requires_grad_()
        row = {"row": name, "seq": seq, "magnitude": cfg.magnitude.form, "solver": cfg.magnitude.solver,
               "causal": cfg.causal}
        if chunk is not None:
            row["chunk"] = chunk
        if route(cfg).path == "prefix_blocks":  # the block lowrank_prefix_attention runs with on this device
            row["block"] = prefix_block(cfg, device.type)
        for mode, make, inp in (("fwd", fwd, x), ("fwd_bwd", fwd_bwd, x_grad)):
            ours, ref = compare(make(layer, inp), make(reference, inp), device, args.warmup, args.repeats)
            row[f"{mode}_ms"], row[f"sdpa_{mode}_ms"], row[f"{mode}_ratio"] = round(ours, 2), round(ref, 2), round(ours / ref, 3)
        for who, module in (("", layer), ("sdpa_", reference)):
            mb, memory_method = peak_memory_mb(fwd_bwd(module, x_grad), device)
            row[f"{who}peak_mb"] = round(mb, 1)
        target = targets.get((name, seq))
        row["target_ratio"], row["met"] = target, None if target is None else row["fwd_bwd_ratio"] <= target
        if (name, seq) in memory_targets:
            row["memory_ratio"] = round(row["peak_mb"] / row["sdpa_peak_mb"], 2)
            row["memory_target_ratio"] = memory_targets[name, seq]
            row["memory_met"] = row["memory_ratio"] <= memory_targets[name, seq]
        results.append(row)
        print(json.dumps(row), file=sys.stderr)  # progress
    out = {
        "benchmark": "magnitude",
        "shape": {"batch": args.batch, "heads": args.heads, "head_dim": args.head_dim},
        "device": str(device), "dtype": args.dtype, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(), "cpus": os.cpu_count(), "repeats": args.repeats,
        "load_average_1min": {"before": round(load_before[0], 2), "after": round(os.getloadavg()[0], 2)},
        "memory": memory_method,
        "note": "ratio = attnlab layer median / raw-SDPA layer median in this run (same projections; is_causal as "
                "the row's); target and met refer to fwd_bwd_ratio",
        "results": results,
        "scaling": scaling_exponents(results),
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
