"""Model FLOPs utilisation (MFU): FLOPs per token, a measured matmul peak, and their ratio.

MFU (Chowdhery et al. 2022, "PaLM", appendix B) is the achieved model FLOP/s divided by the hardware's peak.
Here the peak is not a datasheet number but the *measured* float32 throughput of a square matrix multiply on
this device, the best over every run on it (:func:`matmul_peak`), cached per device in ``<cache dir>/matmul_peak.json``, so MFU is
comparable across runs on the same machine and meaningful on CPUs, whose peak is rarely published.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch
from torch import nn

from ..atomic import write_text
from ..config import GPTConfig

__all__ = ["matmul_params", "flops_per_token", "gate_flops_per_token", "device_name", "measure_matmul_gflops", "matmul_peak", "matmul_peak_gflops", "mfu"]

PEAK_FILE = "matmul_peak.json"


def matmul_params(model: nn.Module) -> int:
    """N for the FLOPs estimate: parameters that take part in a matmul, each shared parameter counted once.

    That is every parameter except position-embedding tables (looked up, never multiplied). The token
    embedding *is* counted: it is tied to the output head, whose matmul costs 2·d·V FLOPs per token. The
    LayerNorm gains and biases (a few thousand values) are counted too; they are negligible.
    """
    pos = getattr(model, "pos", None)
    skip = {id(p) for p in pos.parameters()} if isinstance(pos, nn.Module) else set()
    return sum(p.numel() for p in model.parameters() if id(p) not in skip)


def flops_per_token(n_params: int, cfg: GPTConfig) -> int:
    """Training FLOPs per token: 6 N + 12 · n_layer · n_embd · block_size.

    6 N: each weight costs one multiply-add (2 FLOPs) per token in the forward pass and twice that in the
    backward pass (Kaplan et al. 2020, section 2.1). 12 · L · d · T: the attention scores q·k and the weighted
    sum of values, each 2 · T · d FLOPs per token and layer forward, times 3 for forward + backward, with the
    full (not causally halved) T x T matrix, as in PaLM appendix B (there 12 · L · H · Q · T with H · Q = d).
    ``n_params`` is N as defined by :func:`matmul_params`.
    """
    return 6 * n_params + 12 * cfg.n_layer * cfg.n_embd * cfg.block_size


def gate_flops_per_token(model: nn.Module, block_size: int) -> int:
    """Training FLOPs per token of the model's magnitude gates (the magnitude write-up), which 6 N does not see: the Gram matrix,
    the factorisation and the solves of every gate, forward and backward, counted by torch's FlopCounterMode on
    one sequence of ``block_size`` random keys per gate (the counter sees the matmuls of the blocked solver; the
    LAPACK work on its 32 x 32 diagonal blocks, a few percent at T >= 256, is not counted). 0 without gates."""
    from torch.utils.flop_counter import FlopCounterMode

    from ..mechanisms.magnitude.module import magnitude_gates

    total = 0
    for gate in magnitude_gates(model):
        attn = next(m for m in model.modules() if getattr(m, "magnitude", None) is gate)
        param = next(gate.parameters())
        k = torch.randn(1, attn.n_kv_head, block_size, attn.head_dim, device=param.device, dtype=param.dtype,
                        requires_grad=True)
        with FlopCounterMode(display=False) as counter:
            gate(k).float().sum().backward()
        total += counter.get_total_flops()
    model.zero_grad(set_to_none=True)
    return total // block_size


def device_name(device: torch.device | str) -> str:
    """A human-readable name of the device: the GPU model, or the CPU model and the number of torch threads."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "mps":
        return "Apple MPS"
    return f"{_cpu_model()} ({torch.get_num_threads()} threads)"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


def measure_matmul_gflops(device: torch.device | str = "cpu", size: int | None = None, repeats: int = 10,
                          dtype: torch.dtype = torch.float32) -> float:
    """Best observed float32 GFLOP/s of an n x n @ n x n matmul (2 n³ FLOPs) over ``repeats`` timed runs.

    n defaults to 1024 on CPU and 4096 on GPUs (large enough to saturate them). One warm-up run first.
    """
    device = torch.device(device)
    n = size or (1024 if device.type == "cpu" else 4096)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n, generator=gen).to(device, dtype)
    b = torch.randn(n, n, generator=gen).to(device, dtype)
    best = float("inf")
    for i in range(repeats + 1):
        _sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        _sync(device)
        if i:  # the first run is a warm-up
            best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def _peak_key(device: torch.device, dtype: torch.dtype = torch.float32) -> str:
    key = f"{device.type}|{device_name(device)}|torch {torch.__version__}"
    return key if dtype == torch.float32 else f"{key}|{str(dtype).removeprefix('torch.')}"


def matmul_peak_gflops(device: torch.device | str = "cpu", cache_dir: str | Path | None = None,
                       dtype: torch.dtype = torch.float32) -> float:
    """The device's matmul peak in ``dtype`` in GFLOP/s (the run's compute dtype: a bfloat16 run is measured
    against the bfloat16 peak, not the float32 one; a float32 run on CUDA with the trainer's TF32 on): the best of
    every measurement on this machine so far (:func:`matmul_peak`)."""
    return matmul_peak(device, cache_dir, dtype)["gflops"]


def matmul_peak(device: torch.device | str = "cpu", cache_dir: str | Path | None = None,
                dtype: torch.dtype = torch.float32) -> dict:
    """{gflops, measurements, since}: the best matmul throughput measured on this device over ``measurements``
    calls since the date ``since``. Each call measures again (:func:`measure_matmul_gflops`, a fraction of a
    second) and keeps the higher of that and the cached best, so a peak measured while the machine is loaded
    (which would inflate MFU) is replaced by the next measurement on a quieter machine and can never shrink a
    better one.

    The cache is ``<cache_dir>/matmul_peak.json`` (default: :func:`attnlab.data.default_cache_dir`), keyed by
    device model, thread count, torch version and dtype. A corrupt or unwritable cache is ignored.
    """
    from ..data import default_cache_dir

    device = torch.device(device)
    path = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    path = path / PEAK_FILE
    key = _peak_key(device, dtype)
    table = _read_json(path)
    entry = table.get(key)
    if not (isinstance(entry, dict) and isinstance(entry.get("gflops"), (int, float)) and entry["gflops"] > 0):
        entry = {"gflops": 0.0, "measurements": 0, "since": time.strftime("%Y-%m-%d")}
    gflops = measure_matmul_gflops(device, dtype=dtype)
    entry = {"gflops": max(float(entry["gflops"]), gflops), "measurements": int(entry.get("measurements", 1)) + 1,
             "since": str(entry.get("since") or entry.get("measured_at", "")[:10])}
    table[key] = entry
    _write_json(path, table)
    return entry


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_json(path: Path, data: dict) -> None:
    """Atomic write (temp file + os.replace); failures are ignored (the cache is only an optimisation)."""
    try:
        write_text(path, json.dumps(data, indent=1))
    except OSError:
        pass


def mfu(tokens_per_s: float, flops_per_tok: float, peak_gflops: float, n_devices: int = 1) -> float:
    """Achieved FLOP/s (tokens/s x FLOPs/token) over the peak of ``n_devices`` devices (0 if unknown)."""
    if not peak_gflops or not tokens_per_s:
        return 0.0
    return tokens_per_s * flops_per_tok / (peak_gflops * 1e9 * n_devices)
