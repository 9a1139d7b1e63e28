"""The CUDA path on a real GPU: skipped where torch sees no CUDA device, as on CI.

Each test checks on the GPU a design that the CPU tests can only check by its logic:

* causality: the perturbation leak test of every registered variant, in float64 on the GPU (fused kernels and
  the magnitude solves take other code paths there);
* every variant's layer on the GPU in float32 (TF32 off) against the same layer in float64 on the CPU;
* the magnitude gates under the trainer's TF32 setting: forward and gradient against float64 on the CPU;
* grouped K/V heads in float32 and bfloat16 against repeated K/V;
* rbf in bfloat16: the hi + lo norm coordinate against a float64 reference;
* KV-cache generation on the GPU gives the tokens of recomputation;
* a bfloat16 training run reports MFU against the bfloat16 peak.

Run on a GPU machine with ``python -m pytest tests/test_cuda.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, attention, variants
from attnlab.attention_config import route
from attnlab.mechanisms.count_prior.reference import count_log_prior
from attnlab.nn import Attention
from attnlab.train.trainer import configure_tf32
from helpers import LEAK_TOL, VOCAB, attention_ref, build, fit_rank, max_leak

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
CUDA = torch.device("cuda")


@pytest.fixture
def tf32():
    """The trainer's float32 setting on CUDA (configure_tf32), restored afterwards."""
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    assert configure_tf32("cuda", "float32")
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


@pytest.mark.parametrize("variant", variants())
def test_no_variant_leaks_the_future_on_the_gpu(variant):
    """helpers.max_leak's check with the model and tokens on the GPU (float64: only rounding may differ)."""
    assert max_leak(build(variant, "rope"), device=CUDA) < LEAK_TOL


@pytest.mark.parametrize("variant", variants())
def test_every_layer_on_the_gpu_matches_float64_on_the_cpu(variant):
    """float32 on the GPU with TF32 off: 2e-4 allows float32 rounding through four projections, a softmax and,
    for the magnitude gates, a solve at eps = 1e-3 (condition number up to ~1e3 times float32's 6e-8)."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=64, n_layer=1, n_head=4, n_embd=64,
                    attention=fit_rank(variant, 64)).resolved_attention()
    layer = Attention(cfg, 64).eval()  # coda samples noise in training
    x = torch.randn(2, 64, 64)
    idx = torch.randint(0, 5, (2, 64))  # token ids with many repeats, for the count prior's -log c_ij
    prior = (lambda dtype, device: {"count_prior": count_log_prior(idx, dtype).to(device)}) if cfg.count_prior \
        else (lambda dtype, device: {})
    ref = layer.double()(x.double(), **prior(torch.float64, "cpu"))
    out = layer.float().to(CUDA)(x.to(CUDA), **prior(torch.float32, CUDA)).double().cpu()
    assert (out - ref).abs().max().item() < 2e-4


@pytest.mark.parametrize("apply", ["values", "logits"])
def test_the_lowrank_prefix_block_path_on_the_gpu(apply):
    """attnlab.mechanisms.magnitude.prefix_blocks's blocks (the path of magnitude="prefix" with the low-rank solver, gated
    values or the logit prior): float32 on the GPU (TF32 off) against float64 on the CPU with the bound above, and
    the leak test in float64 on the GPU with blocks of 5 positions."""
    attn = {"magnitude": "prefix", "magnitude_solver": "lowrank", "magnitude_rank": 16, "magnitude_chunk": 24,
            "magnitude_apply": apply}
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=64, n_layer=1, n_head=4, n_embd=64, attention=attn)
    layer = Attention(cfg.resolved_attention(), 64)
    assert route(layer.config).path == "prefix_blocks"
    x = torch.randn(2, 64, 64)
    ref = layer.double()(x.double())
    out = layer.float().to(CUDA)(x.to(CUDA)).double().cpu()
    assert (out - ref).abs().max().item() < 2e-4
    assert max_leak(build({**attn, "magnitude_rank": 8, "magnitude_chunk": 5}, "rope"), device=CUDA) < LEAK_TOL


@pytest.mark.parametrize("floor", [None, 1e-3])
def test_the_lowrank_prefix_blocks_keep_float32_accuracy_under_tf32(tf32, floor):
    """The trainer's TF32 setting: lowrank_prefix_attention runs every matmul in IEEE float32 (forward and
    hand-written backward; ieee_float32), so its output's and its inputs' gradients' errors on the GPU against
    float64 on the CPU stay within 2x (plus 1e-6) of float32 on the CPU's; TF32 would cost ~8x per digit (10-bit
    against 23-bit mantissa). Value gate (floor None) and logit prior; T = 200 in blocks of 64."""
    from attnlab.mechanisms.magnitude.prefix_blocks import lowrank_prefix_attention

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 200, 32, generator=g, dtype=torch.float64) for _ in range(3))
    phi = 0.3 * torch.randn(2, 4, 200, 16, generator=g, dtype=torch.float64)
    c = 0.5 * torch.randn(2, 4, 200, 16, generator=g, dtype=torch.float64)
    lam = 0.2 + 0.8 * torch.rand(2, 4, 200, generator=g, dtype=torch.float64)
    probe = torch.randn(2, 4, 200, 32, generator=g, dtype=torch.float64)

    def run(dtype, device):
        leaves = [x.to(device, dtype).requires_grad_() for x in (q, k, v, phi, lam, c)]
        out = lowrank_prefix_attention(*leaves, 1.7, -0.3, scale=32 ** -0.5, prior_floor=floor, block=64)
        grads = torch.autograd.grad((out * probe.to(device, dtype)).sum(), leaves)
        return [t.detach().double().cpu() for t in (out, *grads)]

    ref = run(torch.float64, "cpu")

    def errors(got):
        return [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(got, ref)]

    cpu32, gpu = errors(run(torch.float32, "cpu")), errors(run(torch.float32, CUDA))
    print(f"prefix blocks (floor {floor}): relative error (out, dq, dk, dv, dphi, dlam, dc) cpu float32 {cpu32}, "
          f"gpu under TF32 {gpu}")
    assert all(e_gpu <= 2 * e_cpu + 1e-6 for e_gpu, e_cpu in zip(gpu, cpu32)), (cpu32, gpu)


def test_the_lowrank_prefix_block_path_under_bfloat16_autocast_on_the_gpu():
    """CUDA autocast (bfloat16), as a bfloat16 training run uses it: the block path's output stays within bfloat16
    rounding (3e-2, the CPU test's bound) of float64 on the CPU, its input gradient within 3e-2 of the largest
    entry, and every parameter gets a finite gradient."""
    attn = {"magnitude": "prefix", "magnitude_solver": "lowrank", "magnitude_rank": 16, "magnitude_chunk": 24}
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=VOCAB, block_size=96, n_layer=1, n_head=4, n_embd=64, attention=attn)
    layer = Attention(cfg.resolved_attention(), 64).double()
    x = torch.randn(2, 96, 64, dtype=torch.float64, requires_grad=True)
    ref = layer(x)
    (gx_ref,) = torch.autograd.grad(ref.sum(), x)
    layer = layer.float().to(CUDA)
    xc = x.detach().float().to(CUDA).requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = layer(xc)
    assert out.dtype == torch.bfloat16
    (gx,) = torch.autograd.grad(out.float().sum(), xc)
    assert (out.double().cpu() - ref.detach()).abs().max() < 3e-2
    assert (gx.double().cpu() - gx_ref).abs().max() < 3e-2 * gx_ref.abs().max()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        layer(xc).float().square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in layer.parameters())


@pytest.mark.parametrize("form", ["causal", "prefix"])
@pytest.mark.parametrize("solver", ["cholesky", "lowrank"])
def test_magnitude_gate_keeps_float32_accuracy_under_tf32(tf32, form, solver):
    """The trainer turns TF32 on for float32 runs; the gate's solves (forward, and the exact kernel's hand-written
    backward, through full_precision_backward for the autograd paths) run with it off (ieee_float32). The weights' and key gradients' errors on the GPU against float64 on
    the CPU must stay within 2x those of float32 on the CPU (keys with a near-duplicate cluster, where float32 itself
    loses ~1e-3 of the gradient): TF32's 10-bit mantissa would cost ~8x float32's 23-bit one per digit lost."""
    from attnlab.mechanisms.magnitude.module import MagnitudeGate

    torch.manual_seed(0)
    gate = MagnitudeGate(form, solver=solver, eps=1e-3 if solver == "cholesky" else 0.1, rank=32, n_heads=4,
                         head_dim=32, record_stats=False)
    keys = torch.randn(2, 4, 128, 32, dtype=torch.float64)
    keys[:, :, 64:80] = keys[:, :, 63:64] + 1e-3 * torch.randn(2, 4, 16, 32, dtype=torch.float64)  # a cluster

    def weights_and_grad(module, k):
        k = k.clone().requires_grad_()
        w, _, _ = module.weights(k, with_residual=False)  # guards its own forward and backward
        probe = torch.linspace(-1, 1, w.numel(), dtype=w.dtype, device=w.device).view_as(w)
        (w * probe).sum().backward()  # the backward runs outside the block, as in training
        return w.detach().double().cpu(), k.grad.double().cpu()

    def errors(w, g):
        return ((w - w_ref).abs().max() / w_ref.abs().max()).item(), ((g - g_ref).abs().max() / g_ref.abs().max()).item()

    w_ref, g_ref = weights_and_grad(gate.double(), keys)
    cpu32 = errors(*weights_and_grad(gate.float(), keys.float()))
    gpu = errors(*weights_and_grad(gate.to(CUDA), keys.float().to(CUDA)))
    print(f"{solver} {form}: relative error (weights, key gradients) cpu float32 {cpu32}, gpu under TF32 {gpu}")
    assert gpu[0] <= 2 * cpu32[0] + 1e-6 and gpu[1] <= 2 * cpu32[1] + 1e-6, (cpu32, gpu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_grouped_kv_heads_match_repeated_kv(dtype):
    """attnlab.attention with 2 K/V heads (enable_gqa where the fused kernel takes it, repeated K/V elsewhere)
    against SDPA on K/V repeated by hand: equal to the dtype's rounding (TF32 off)."""
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 8, 256, 64, generator=g).to(CUDA, dtype)
    k, v = (torch.randn(2, 2, 256, 64, generator=g).to(CUDA, dtype) for _ in range(2))
    ours = attention(q, k, v, causal=True)
    ref = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(4, 1), v.repeat_interleave(4, 1),
                                                           is_causal=True)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(ours, ref, rtol=tol, atol=tol)


@pytest.mark.parametrize("offset", [2.0, 6.0])
def test_rbf_in_bfloat16_on_the_gpu(offset):
    """tests/test_functional.py's check on the GPU's fused bfloat16 kernels: within three bfloat16 steps (0.02)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 64, 64, generator=g) for _ in range(3))
    q, k = (q * offset / 2).bfloat16(), (k * offset / 2 + offset).bfloat16()
    v = v.bfloat16()
    ref, _ = attention_ref(q.double(), k.double(), v.double(), kernel="rbf", causal=True)
    out = attention(q.to(CUDA), k.to(CUDA), v.to(CUDA), kernel="rbf", causal=True).float().cpu().numpy()
    assert np.abs(out - ref).max() < 0.02


@pytest.mark.parametrize("variant", ["standard", "gqa", "mla", "rbf"])
def test_cached_generation_on_the_gpu_gives_the_recomputed_tokens(variant):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=64, n_layer=2, n_head=4, n_embd=64,
                          attention=variant, pos_encoding="rope")).to(CUDA).eval()
    prompt = torch.randint(0, VOCAB, (2, 5), device=CUDA)
    runs = [model.generate(prompt, 40, temperature=0, use_cache=c) for c in (True, False)]
    assert torch.equal(runs[0], runs[1])


def test_bfloat16_run_reports_mfu_against_the_bfloat16_peak(tmp_path):
    import json

    from attnlab.train import train
    from helpers import tiny

    cfg = tiny(tmp_path / "run", tmp_path / "cache", train__device="cuda", train__dtype="bfloat16",
               train__max_steps=20, train__eval_interval=10, train__sample_tokens=0)
    summary = train(cfg, quiet=True)
    assert summary["status"] == "finished" and summary["dtype"] == "bfloat16"
    peaks = json.loads((tmp_path / "cache" / "matmul_peak.json").read_text())
    bf16 = [v["gflops"] for key, v in peaks.items() if key.startswith("cuda|") and key.endswith("|bfloat16")]
    assert bf16 == [summary["matmul_peak_gflops"]], (peaks, summary["matmul_peak_gflops"])
    assert 0 < summary["mfu"] < 1, summary["mfu"]
