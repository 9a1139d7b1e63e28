"""Benchmark: forward and forward+backward milliseconds of every registered variant, as ratios to raw SDPA.

Two comparisons, both measured in this same run, alternating variant and reference call by call so that
machine noise hits both alike (medians over --repeats):
  layer: attnlab.nn.Attention (q/k/v/out projections + attention) against a hand-written layer with the same
         projections around torch.nn.functional.scaled_dot_product_attention(is_causal=True);
  core:  attnlab.functional.attention on q/k/v tensors against one raw SDPA call on the same shapes.

    python benchmarks/attention_layer.py                 # batch 8, heads 8, seq 512, head_dim 64, CPU fp32
    python benchmarks/attention_layer.py --device cuda --dtype bfloat16
    python benchmarks/attention_layer.py --pos-encoding alibi --variants standard selective    # ALiBi in every layer
    python benchmarks/attention_layer.py --softcap 30 --variants standard sink    # a logit softcap in every layer
    python benchmarks/attention_layer.py --device cuda --backend flex --softcap 30 --variants standard ssmax
    python benchmarks/attention_layer.py --profile 12 --variants magnitude-causal-lowrank    # where the time goes
    python benchmarks/attention_layer.py --compile --variants standard magnitude-causal-lowrank    # eager and compiled
Prints one JSON object.

--compile times every variant twice: eager, then with both layers (attnlab's and the reference) under
torch.compile, in a second row marked "compiled": true (its core columns empty). Compilation happens in the warmup
calls, outside the timings. On a GPU it measures what a compiled training run can gain where a layer launches
many small kernels (the low-rank solve, say).

--profile N adds to each row the N costliest entries of one forward+backward call under torch.profiler, after the
timings (so the profiler's overhead stays out of them): on CUDA the GPU kernels by their device time (Triton's
kernels under their own names, cuBLAS, cuSOLVER and PyTorch's under theirs), on the CPU the aten operators by their
self time; each with its calls, milliseconds and share of the call's total (the sum over every entry, so the shares
of the N listed add up to at most 1).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnlab import GPTConfig, variants
from attnlab.config import POS_ENCODINGS
from attnlab.switches import BACKENDS
from attnlab.attention_config import route
from attnlab.functional import attention
from attnlab.nn import Attention
from attnlab.mechanisms.count_prior.reference import count_log_prior
from attnlab.mechanisms.normalizers import normalizer_fn
from attnlab.mechanisms.magnitude.module import record_magnitude_stats


class RawSDPALayer(nn.Module):
    """The reference: nanoGPT-style causal self-attention straight on F.scaled_dot_product_attention."""

    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.n_head = n_head
        self.q, self.k, self.v, self.o = (nn.Linear(n_embd, n_embd) for _ in range(4))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = (m(x).view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for m in (self.q, self.k, self.v))
        return self.o(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def _timed(fn, device) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return (time.perf_counter() - start) * 1e3


def compare(fn_a, fn_b, device, warmup: int, repeats: int) -> tuple[float, float]:
    """Median milliseconds of fn_a and fn_b, run alternately."""
    for _ in range(warmup):
        fn_a(), fn_b()
    a, b = [], []
    for _ in range(repeats):
        a.append(_timed(fn_a, device))
        b.append(_timed(fn_b, device))
    return statistics.median(a), statistics.median(b)


def fwd(module, x, **kw):
    def run():
        with torch.no_grad():
            module(x, **kw)
    return run


def fwd_bwd(module, x, **kw):
    def run():
        module(x, **kw).float().sum().backward()
    return run


def peak_memory_mb(fn, device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    _sync(device)
    return torch.cuda.max_memory_allocated(device) / 2**20


def profile_top(fn, device, top: int) -> dict:
    """The ``top`` costliest entries of one call of fn under torch.profiler: GPU kernels by device time on CUDA,
    aten operators by self CPU time elsewhere (self times: no entry counts another's time)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    fn()
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        fn()
        _sync(device)
    entries = [(e.key, e.count, e.self_device_time_total if cuda else e.self_cpu_time_total)
               for e in prof.key_averages() if (e.device_type == DeviceType.CUDA) == cuda]
    total = sum(us for _, _, us in entries)
    entries.sort(key=lambda e: -e[2])
    launches = {"launches": sum(calls for _, calls, _ in entries)} if cuda else {}  # kernels and copies, one call
    return {"clock": "device (GPU kernels)" if cuda else "cpu (aten operators, self time)",
            "total_ms": round(total / 1e3, 3), **launches,
            "top": [{"name": name, "calls": calls, "ms": round(us / 1e3, 3), "share": round(us / total, 4)}
                    for name, calls, us in entries[:top]]}


def time_layer(row: dict, layer, reference, x, x_grad, extra: dict, device, args) -> None:
    """Fill row with the layer's forward and forward+backward medians against the reference's, their ratios and
    peak memory (CUDA), and with --profile its costliest kernels of one forward+backward call."""
    for mode, make, inp in (("fwd", fwd, x), ("fwd_bwd", fwd_bwd, x_grad)):
        ours, ref = compare(make(layer, inp, **extra), make(reference, inp), device, args.warmup, args.repeats)
        row[f"layer_{mode}_ms"], row[f"sdpa_layer_{mode}_ms"] = round(ours, 3), round(ref, 3)
        row[f"layer_{mode}_ratio"] = round(ours / ref, 3)
        row[f"layer_{mode}_peak_mb"] = peak_memory_mb(make(layer, inp, **extra), device)
    if args.profile:
        row["profile"] = profile_top(fwd_bwd(layer, x_grad, **extra), device, args.profile)


def add_shape_args(p: argparse.ArgumentParser) -> None:
    """The options every attention benchmark shares: shape, repeats, device, dtype."""
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_shape_args(p)
    p.add_argument("--seq", type=int, default=512)
    p.add_argument("--variants", nargs="*", default=None, help="default: every registered variant")
    p.add_argument("--pos-encoding", default="learned", choices=POS_ENCODINGS,
                   help="the model's positions; only 'alibi' reaches the layer (a bias in every attention layer)")
    p.add_argument("--softcap", type=float, default=None,
                   help="attention.softcap for every variant: logits c tanh(z / c) (the reference has none)")
    p.add_argument("--backend", default=None, choices=BACKENDS,
                   help="attention.backend for every variant (default: each variant's own, usually 'auto')")
    p.add_argument("--profile", type=int, default=0, metavar="N",
                   help="add each layer's N costliest kernels (CUDA) or operators (CPU) of one fwd+bwd call")
    p.add_argument("--compile", action="store_true",
                   help="time every variant also with both layers under torch.compile (a second row, compiled)")
    args = p.parse_args(argv)
    if args.profile < 0:
        raise SystemExit(f"benchmarks/attention_layer.py: --profile {args.profile}; allowed: 0 (no profile) or a "
                         f"positive number of entries")

    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    n_embd = args.heads * args.head_dim
    torch.manual_seed(0)
    x = torch.randn(args.batch, args.seq, n_embd, device=device, dtype=dtype)
    x_grad = x.clone().requires_grad_()
    reference = RawSDPALayer(n_embd, args.heads).to(device, dtype)
    compiled_reference = torch.compile(reference) if args.compile else None
    results = []
    for name in args.variants or variants():
        cfg = GPTConfig(n_head=args.heads, n_embd=n_embd, block_size=args.seq, attention=name,
                        pos_encoding=args.pos_encoding).resolved_attention()
        cfg = cfg if args.softcap is None else cfg.replace(softcap=args.softcap)
        cfg = cfg if args.backend is None else cfg.replace(backend=args.backend)
        layer = Attention(cfg, n_embd).to(device, dtype)
        record_magnitude_stats(layer, False)  # as in training: gate statistics only on logged steps
        path = route(cfg, device=device.type, dtype=args.dtype).path
        row = {"variant": name, "path": path, "sdpa_path": path == "sdpa"}
        extra = {}
        if cfg.count_prior:  # the duplicate-count prior of random token ids (the GPT computes it once per forward)
            idx = torch.randint(0, 64, (args.batch, args.seq), generator=torch.Generator().manual_seed(0))
            extra["count_prior"] = count_log_prior(idx.to(device), dtype)
        time_layer(row, layer, reference, x, x_grad, extra, device, args)
        results.append(row)
        if args.compile:
            compiled = {**row, "compiled": True, "core_fwd_ms": None, "sdpa_core_fwd_ms": None, "core_fwd_ratio": None}
            time_layer(compiled, torch.compile(layer), compiled_reference, x, x_grad, extra, device, args)
            results.append(compiled)
        if (cfg.magnitude is not None or cfg.count_prior or cfg.sink or cfg.selective
                or cfg.differential or cfg.alibi):  # their cost lives in the layer, around or inside the attention call
            row["core_fwd_ms"] = row["sdpa_core_fwd_ms"] = row["core_fwd_ratio"] = None
            continue
        # core: the attention function alone on q/k/v, against one raw SDPA call
        q = torch.randn(args.batch, args.heads, args.seq, args.head_dim, device=device, dtype=dtype)
        k, v = (torch.randn(args.batch, cfg.n_kv_head, args.seq, args.head_dim, device=device, dtype=dtype)
                for _ in range(2))
        kr, vr = (t.repeat_interleave(args.heads // cfg.n_kv_head, 1) for t in (k, v))
        opts = dict(causal=True, kernel=cfg.kernel, normalizer=normalizer_fn(cfg.normalizer), mask_form=cfg.mask_form,
                    temperature=cfg.temperature, scale=cfg.scale, backend=cfg.backend, softcap=cfg.softcap)
        with torch.no_grad():
            ours, ref = compare(lambda: attention(q, k, v, **opts),
                                lambda: F.scaled_dot_product_attention(q, kr, vr, is_causal=True),
                                device, args.warmup, args.repeats)
        row["core_fwd_ms"], row["sdpa_core_fwd_ms"], row["core_fwd_ratio"] = round(ours, 3), round(ref, 3), round(ours / ref, 3)
    out = {
        "benchmark": "attention_layer",
        "shape": {"batch": args.batch, "heads": args.heads, "seq": args.seq, "head_dim": args.head_dim},
        "pos_encoding": args.pos_encoding, "softcap": args.softcap, "backend": args.backend, "compile": args.compile,
        "device": str(device), "dtype": args.dtype, "torch": torch.__version__, "threads": torch.get_num_threads(),
        "machine": platform.processor() or platform.machine(), "repeats": args.repeats,
        "note": "ratio = attnlab median / raw-SDPA median in this run (causal); core references repeat K/V heads",
        "results": results,
    }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
