"""Benchmark: the Triton prior kernels (attnlab.functional.kernels.prior_attention, lowrank_prior_attention) against
the other GPU routes to the same attention, forward+backward, as ratios to SDPA's flash kernel measured in the same run.

Routes, all causal, B = 4, H = 12, D = 64, bfloat16 by default, at T = 1024, 4096, 8192:
  sdpa_flash        F.scaled_dot_product_attention, flash backend, no prior: the floor (ratio 1)
  kernel            prior_attention(q, k, v, p): softmax_j(q_i . k_j / sqrt(D) + p_j), gradients to q, k, v, p
  kernel_no_prior   prior_attention(q, k, v): the kernel's own cost against flash on the same work
  sdpa_float_mask   SDPA with the prior as a float [B, H, T, T] mask (causal -inf plus p_j), built in the call
  flex              FlexAttention (compiled once per length, dynamic=False), score_mod s + p[b, h, kv], a causal
                    block mask, gradients to p as well
The low-rank prefix prior (rows under "lowrank", rank --rank = 16, factors phi, c [B, H, T, r] and lam [B, H, T] in
float32, the prior log max(M_ij, 1e-4) with M_ij = (1 - phi_j . c_i) / lam_j):
  sdpa_flash        as above: the floor (ratio 1)
  kernel            lowrank_prior_attention(q, k, v, phi, lam, c): gradients to q, k, v, phi, lam, c; its default
                    tiles (the output's "kernel_backward_blocks": lowrank.CUDA_BACKWARD_BLOCKS)
  kernel_ieee_factors  the same with the factors' product w = 1 - phi . c in IEEE float32 on CUDA cores (its
                    choice for float32 inputs) instead of TF32x3 on tensor cores (its choice for 16-bit inputs)
  kernel_MxN        the same with tiles of M queries x N keys (--lowrank-blocks MxN ...; the wrappers use 64 x 64)
  kernel_bwd_OxI    the same with the forward's 64 x 64 and the backward kernels' (outer, inner) tiles
                    (--lowrank-backward-blocks OxI ...: the wrappers' backward_blocks=(O, I))
  kernel_bwd_wW     the same at its default tiles with W warps per backward program (--lowrank-backward-warps W
                    ...; lowrank.BACKWARD_WARPS, 4, otherwise)
  sdpa_float_mask   SDPA with the dense prior as a float [B, H, T, T] mask (M built whole in the call, then the
                    causal -inf), gradients through it to the factors
  prefix_blocks     attnlab.mechanisms.magnitude.prefix_blocks.lowrank_prefix_attention with prior_floor, blocks of
                    64: the PyTorch path the kernel is to replace (K/V in bfloat16, M in float32)
Every route is called once per round in turn (CUDA events, after two warm-up calls each), medians over --repeats
rounds; ratio = the route's median / sdpa_flash's median. Peak memory: torch.cuda.max_memory_allocated over one
call minus the memory held before it. A route that runs out of memory or fails is reported with its error. The
kernel's output is also compared with the float-mask route's (max |difference|) at every T, as a sanity check.
--families picks the groups of rows (default both: "perkey" under "rows", "lowrank" under "lowrank").

    python benchmarks/kernels.py                         # on a CUDA device; prints one JSON object
    python benchmarks/kernels.py --seqs 1024 --repeats 3
    python benchmarks/kernels.py --out kernels.json     # also kept after each length: a timeout loses only the last
Without a CUDA device it prints a one-line message and exits with status 0.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from pathlib import Path
from unittest import mock


def routes(q, k, v, p, do):
    """{name: a function that runs one forward+backward}; q, k, v, p are leaves that require gradients."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlab.functional.kernels import prior_attention

    t = q.shape[2]
    scale = 1.0 / math.sqrt(q.shape[-1])

    def sdpa_flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    def kernel():
        prior_attention(q, k, v, p, scale).backward(do)

    def kernel_no_prior():
        prior_attention(q, k, v, None, scale).backward(do)

    def sdpa_float_mask():
        later = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
        mask = p[:, :, None, :].to(q.dtype).masked_fill(later, float("-inf"))  # [B, H, T, T]: p_j, -inf after i
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).backward(do)

    out = {"sdpa_flash": sdpa_flash, "kernel": kernel, "kernel_no_prior": kernel_no_prior,
           "sdpa_float_mask": sdpa_float_mask}
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return out
    compiled = torch.compile(flex_attention, dynamic=False)  # one kernel per length, as attnlab's flex route
    block_mask = create_block_mask(lambda b, h, qi, ki: ki <= qi, None, None, t, t, device=q.device)

    def score_mod(s, b, h, qi, ki):
        return s + p[b, h, ki]  # s_ij + p_j (p in float32, as the kernel reads it)

    def flex():
        compiled(q, k, v, score_mod=score_mod, block_mask=block_mask, scale=scale).backward(do)

    out["flex"] = flex
    return out


def measure(seq, args):
    import torch

    from attnlab.functional.kernels import prior_attention

    dev, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    b, h, d = args.batch, args.heads, args.head_dim
    q, k, v, do = (torch.randn(b, h, seq, d, device=dev, dtype=dtype, generator=g) for _ in range(4))
    weights = torch.rand(b, h, seq, device=dev, generator=g)
    p = weights.clamp(min=1e-3).log()  # a log-prior with a floor, as the magnitude prior's log max(w, floor)
    leaves = [x.requires_grad_() for x in (q, k, v, p)]
    row = {"T": seq, "routes": {}}
    with torch.no_grad():
        later = torch.ones(seq, seq, dtype=torch.bool, device=dev).triu(1)
        mask = p[:, :, None, :].to(dtype).masked_fill(later, float("-inf"))
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        diff = prior_attention(q, k, v, p).float() - ref.float()
        row["kernel_max_abs_diff_vs_float_mask"] = diff.abs().max().item()
        del mask, ref, diff
    row["routes"] = time_routes(routes(*leaves, do), leaves, args.repeats)
    return row


def time_routes(fns, leaves, repeats):
    """{name: {"ms", "ratio", "peak_mib"} or {"error"}} for every route in fns; ratio to fns["sdpa_flash"]."""
    import torch

    out, ok = {}, {}
    for name, fn in fns.items():
        try:
            for _ in range(2):
                fn()
                for x in leaves:
                    x.grad = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
            fn()
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - before) / 2**20
            ok[name] = {"peak_mib": round(peak, 1), "times": []}
        except Exception as exc:  # out of memory, or a route this torch lacks
            out[name] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
            torch.cuda.empty_cache()
        for x in leaves:
            x.grad = None
    for _ in range(repeats):
        for name in ok:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[name]()
            end.record()
            torch.cuda.synchronize()
            ok[name]["times"].append(start.elapsed_time(end))
            for x in leaves:
                x.grad = None
    floor = statistics.median(ok["sdpa_flash"]["times"]) if "sdpa_flash" in ok else float("nan")
    for name, r in ok.items():
        ms = statistics.median(r["times"])
        out[name] = {"ms": round(ms, 4), "ratio": round(ms / floor, 3), "peak_mib": r["peak_mib"]}
    return out


LOWRANK_FLOOR = 1e-4  # the floor of the magnitude prior (attnlab.mechanisms.magnitude.names.PRIOR_FLOOR)


def dense_lowrank_mask(phi, lam, c, dtype):
    """The low-rank prior as a float [B, H, T, T] mask: log max(M_ij, floor) for j <= i, -inf after i."""
    import torch

    t = phi.shape[2]
    m = (1.0 - c @ phi.mT) / lam[..., None, :]  # M_ij = (1 - phi_j . c_i) / lam_j, float32
    later = torch.ones(t, t, dtype=torch.bool, device=phi.device).triu(1)
    return m.clamp_min(LOWRANK_FLOOR).log().to(dtype).masked_fill(later, float("-inf"))


def lowrank_routes(q, k, v, phi, lam, c, do, blocks=(), backward_blocks=(), backward_warps=()):
    """{name: a function that runs one forward+backward} for the low-rank prior and the value gate; every input a
    leaf."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from attnlab.functional.kernels import lowrank as lowrank_kernels
    from attnlab.functional.kernels import lowrank_gate_attention, lowrank_prior_attention
    from attnlab.mechanisms.magnitude.prefix_blocks import lowrank_prefix_attention

    scale = 1.0 / math.sqrt(q.shape[-1])

    def sdpa_flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(do)

    def kernel():
        lowrank_prior_attention(q, k, v, phi, lam, c, prior_floor=LOWRANK_FLOOR, scale=scale).backward(do)

    def kernel_ieee_factors():  # the factors' product w on CUDA cores (IEEE), as for float32 inputs
        with mock.patch.object(lowrank_kernels, "factor_precision", lambda dtype: "ieee"):
            kernel()

    def sdpa_float_mask():
        mask = dense_lowrank_mask(phi, lam, c, q.dtype)
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask).backward(do)

    def prefix_blocks():
        lowrank_prefix_attention(q, k, v, phi, lam, c, scale=scale, prior_floor=LOWRANK_FLOOR, block=64).backward(do)

    def gate_kernel():  # the value gate g(M_ij) v_j (clamp), beta and gamma learned
        lowrank_gate_attention(q, k, v, phi, lam, c, beta, gamma, scale=scale).backward(do)

    def gate_prefix_blocks():
        lowrank_prefix_attention(q, k, v, phi, lam, c, beta, gamma, scale=scale, block=64).backward(do)

    def tiles(bm, bn):  # the prior's kernel with other tiles than the wrappers' 64 x 64
        return lambda: lowrank_prior_attention(q, k, v, phi, lam, c, prior_floor=LOWRANK_FLOOR, scale=scale,
                                               block_m=bm, block_n=bn).backward(do)

    def backward_tiles(outer, inner):  # the backward kernels with their own (outer, inner) tiles
        return lambda: lowrank_prior_attention(q, k, v, phi, lam, c, prior_floor=LOWRANK_FLOOR, scale=scale,
                                               backward_blocks=(outer, inner)).backward(do)

    def warps(n):  # the backward kernels with n warps per program
        def run():
            with mock.patch.object(lowrank_kernels, "BACKWARD_WARPS", n):
                kernel()
        return run

    beta = torch.tensor(4.0, device=q.device, requires_grad=True)
    gamma = torch.tensor(-2.0, device=q.device, requires_grad=True)
    return {"sdpa_flash": sdpa_flash, "kernel": kernel, "kernel_ieee_factors": kernel_ieee_factors,
            "sdpa_float_mask": sdpa_float_mask,
            "prefix_blocks": prefix_blocks, "gate_kernel": gate_kernel, "gate_prefix_blocks": gate_prefix_blocks,
            **{f"kernel_{bm}x{bn}": tiles(bm, bn) for bm, bn in blocks},
            **{f"kernel_bwd_{o}x{i}": backward_tiles(o, i) for o, i in backward_blocks},
            **{f"kernel_bwd_w{n}": warps(n) for n in backward_warps}}


def measure_lowrank(seq, args):
    import torch

    from attnlab.functional.kernels import lowrank_prior_attention

    dev, dtype = torch.device("cuda"), getattr(torch, args.dtype)
    g = torch.Generator(device=dev).manual_seed(0)
    b, h, d, r = args.batch, args.heads, args.head_dim, args.rank
    q, k, v, do = (torch.randn(b, h, seq, d, device=dev, dtype=dtype, generator=g) for _ in range(4))
    phi = torch.randn(b, h, seq, r, device=dev, generator=g) * (0.5 / math.sqrt(r))  # phi . c ~ N(0, 1/4)
    c = torch.randn(b, h, seq, r, device=dev, generator=g)
    lam = 0.2 + 0.8 * torch.rand(b, h, seq, device=dev, generator=g)
    leaves = [x.requires_grad_() for x in (q, k, v, phi, lam, c)]
    row = {"T": seq, "rank": r, "routes": {}}
    with torch.no_grad():
        try:
            ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=dense_lowrank_mask(phi, lam, c,
                                                                                                         dtype))
            mine = lowrank_prior_attention(q, k, v, phi, lam, c, prior_floor=LOWRANK_FLOOR)
            row["kernel_max_abs_diff_vs_float_mask"] = (mine.float() - ref.float()).abs().max().item()
            del ref, mine
        except torch.cuda.OutOfMemoryError as exc:
            row["kernel_max_abs_diff_vs_float_mask"] = f"not checked: {str(exc).splitlines()[0][:120]}"
        torch.cuda.empty_cache()
    blocks = [tuple(int(x) for x in b.split("x")) for b in args.lowrank_blocks]
    backward = [tuple(int(x) for x in b.split("x")) for b in args.lowrank_backward_blocks]
    row["routes"] = time_routes(lowrank_routes(*leaves, do, blocks, backward, args.lowrank_backward_warps), leaves,
                                args.repeats)
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 8192])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--rank", type=int, default=16, help="rank r of the low-rank prefix prior's factors")
    parser.add_argument("--families", nargs="+", choices=["perkey", "lowrank"], default=["perkey", "lowrank"],
                        help="which kernels' rows to measure")
    parser.add_argument("--lowrank-blocks", nargs="*", default=[],
                        help="BLOCK_MxBLOCK_N: the low-rank prior's kernel also with these tiles (rows kernel_MxN)")
    parser.add_argument("--lowrank-backward-blocks", nargs="*", default=[],
                        help="OUTERxINNER: the low-rank prior's kernel also with these backward tiles "
                             "(rows kernel_bwd_OxI)")
    parser.add_argument("--lowrank-backward-warps", type=int, nargs="*", default=[],
                        help="W: the low-rank prior's kernel also with W warps per backward program (rows kernel_bwd_wW)")
    parser.add_argument("--out", help="also write the JSON object to this file after each length (atomically)")
    args = parser.parse_args(argv)
    import torch
    if not torch.cuda.is_available():
        print("benchmarks/kernels.py needs a CUDA device (torch sees none); nothing measured")
        return 0
    import triton

    from attnlab.functional.kernels.lowrank import CUDA_BACKWARD_BLOCKS
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "batch": args.batch, "heads": args.heads, "head_dim": args.head_dim, "dtype": args.dtype,
              "repeats": args.repeats, "pass": "forward+backward",
              "kernel_backward_blocks": list(CUDA_BACKWARD_BLOCKS), "rows": [], "lowrank": []}
    for family, key, fn in (("perkey", "rows", measure), ("lowrank", "lowrank", measure_lowrank)):
        if family in args.families:
            for seq in args.seqs:
                result[key].append(fn(seq, args))
                if args.out:  # what is measured so far survives a timeout
                    Path(args.out + ".tmp").write_text(json.dumps(result, indent=1))
                    os.replace(args.out + ".tmp", args.out)
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
