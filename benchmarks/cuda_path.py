"""Benchmark: the CUDA path's design choices measured on a GPU; prints one JSON object.

  peaks:  the matmul rate attnlab's MFU divides by (attnlab.train.flops.measure_matmul_gflops) in float32 with TF32
          off, float32 with TF32 on (what a float32 run on CUDA uses) and bfloat16;
  gqa:    which SDPA kernels take enable_gqa=True in float32 and bfloat16 (each tried alone), and forward+backward
          milliseconds of attnlab.attention with 2 K/V heads for 8 query heads against raw SDPA with enable_gqa and
          against raw SDPA on K/V repeated by hand, in the same run;
  tf32:   the magnitude gates' relative error (weights and key gradients, against float64 on the CPU) with TF32 on
          outside the gate, as the trainer runs float32 on CUDA, beside float32 on the CPU.

    python benchmarks/cuda_path.py          # needs a CUDA device
"""

from __future__ import annotations

import contextlib
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from attention_layer import _timed  # benchmarks/ helpers

from attnlab import attention
from attnlab.mechanisms.magnitude.module import MagnitudeGate
from attnlab.train.flops import measure_matmul_gflops

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CUDA = torch.device("cuda")


def median_ms(fn, repeats=20, warmup=3) -> float:
    for _ in range(warmup):
        fn()
    return statistics.median(_timed(fn, CUDA) for _ in range(repeats))


def peaks() -> dict:
    out = {}
    for name, dtype, tf32 in (("float32", torch.float32, False), ("float32_tf32", torch.float32, True),
                              ("bfloat16", torch.bfloat16, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        out[name] = {n: round(measure_matmul_gflops("cuda", size=n, dtype=dtype)) for n in (4096, 8192)}
    torch.backends.cuda.matmul.allow_tf32 = False
    return out


def gqa(batch=8, heads=8, kv_heads=2, seq=1024, dim=64) -> dict:
    out = {}
    for name, dtype in DTYPES.items():
        g = torch.Generator().manual_seed(0)
        q = torch.randn(batch, heads, seq, dim, generator=g).to("cuda", dtype).requires_grad_()
        k, v = (torch.randn(batch, kv_heads, seq, dim, generator=g).to("cuda", dtype).requires_grad_() for _ in "kv")
        rep = heads // kv_heads
        accepted = {}
        for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                        SDPBackend.MATH):
            try:
                with sdpa_kernel([backend]):
                    F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                accepted[backend.name] = True
            except RuntimeError:
                accepted[backend.name] = False

        def step(fn):
            def run():
                fn().float().square().mean().backward()
            return run

        times = {
            "attnlab": median_ms(step(lambda: attention(q, k, v, causal=True))),
            "sdpa_enable_gqa": median_ms(step(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                                      enable_gqa=True))),
            "sdpa_repeated_kv": median_ms(step(lambda: F.scaled_dot_product_attention(
                q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True))),
        }
        out[name] = {"enable_gqa_accepted_by": accepted, "fwd_bwd_ms": {n: round(t, 3) for n, t in times.items()},
                     "attnlab_over_best_raw": round(times["attnlab"] / min(times["sdpa_enable_gqa"],
                                                                           times["sdpa_repeated_kv"]), 3)}
    return out


@contextlib.contextmanager
def unguarded():
    """The gate's TF32 guards switched off (ieee_float32 a no-op: every guard looks it up in its module), to
    measure what they buy."""
    import attnlab.mechanisms.magnitude.fused as kernel

    saved = kernel.ieee_float32
    kernel.ieee_float32 = lambda device_type: contextlib.nullcontext()
    try:
        yield
    finally:
        kernel.ieee_float32 = saved


def tf32_gate_errors() -> dict:
    out = {}
    torch.manual_seed(0)
    keys = torch.randn(2, 8, 256, 64, dtype=torch.float64)
    keys[:, :, 100:132] = keys[:, :, 99:100] + 1e-3 * torch.randn(2, 8, 32, 64, dtype=torch.float64)  # a cluster
    for solver in ("cholesky", "lowrank"):
        for form in ("causal", "prefix"):
            gate = MagnitudeGate(form, solver=solver, eps=1e-3 if solver == "cholesky" else 0.1, n_heads=8,
                                 head_dim=64, record_stats=False).double()

            def run(k, guard=True):
                k = k.clone().requires_grad_()
                with contextlib.nullcontext() if guard else unguarded():
                    w, _, _ = gate.weights(k, with_residual=False)
                probe = torch.linspace(-1, 1, w.numel(), dtype=w.dtype, device=w.device).view_as(w)
                (w * probe).sum().backward()
                return w.detach().double().cpu(), k.grad.double().cpu()

            w64, g64 = run(keys)  # gate in float64 (its parameters are cast with the keys below)

            def rel(pair):
                return [round(((a - b).abs().max() / b.abs().max()).item(), 7) for a, b in zip(pair, (w64, g64))]

            gate.float()
            row = {"cpu_float32": rel(run(keys.float()))}
            gate.cuda()
            torch.backends.cuda.matmul.allow_tf32 = True  # the trainer's float32 setting on CUDA
            row["cuda_float32_tf32_guarded"] = rel(run(keys.float().cuda()))
            try:
                row["cuda_float32_tf32_unguarded"] = rel(run(keys.float().cuda(), guard=False))
            except torch.linalg.LinAlgError as e:
                row["cuda_float32_tf32_unguarded"] = f"failed: {str(e)[:120]}"
            torch.backends.cuda.matmul.allow_tf32 = False
            row["cuda_float32_ieee"] = rel(run(keys.float().cuda()))
            out[f"{solver}-{form}"] = row
    out["note"] = ("[weights, key gradients]: max |error| / max |float64 value| on 2 x 8 heads of 256 keys with a "
                   "32-key near-duplicate cluster; 'unguarded' runs forward and backward with ieee_float32 and "
                   "full_precision_backward switched off, i.e. TF32 everywhere")
    return out


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("benchmarks/cuda_path.py needs a CUDA device")
    result = {"benchmark": "cuda_path", "device_name": torch.cuda.get_device_name(), "torch": torch.__version__,
              "cuda": torch.version.cuda}
    for name, fn in (("peaks_gflops", peaks), ("gqa", gqa), ("tf32_gate_errors", tf32_gate_errors)):
        result[name] = fn()
        print(json.dumps({name: result[name]}), flush=True)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
