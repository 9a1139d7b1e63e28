"""The "triton" route: backend="triton" and the Triton kernel for causal attention with a per-key log-prior inside
attnlab.functional.attention and the attention layer.

Without a GPU the kernel runs under Triton's CPU interpreter (TRITON_INTERPRET=1, set by conftest.py before triton
is first imported), in float32 (the interpreter has no bfloat16). What is compared against what:

* attention(..., backend="triton") against a float64 numpy loop written from the formula (tests/helpers.py's
  attention_ref with the prior as a float mask), and its gradients against float64 autograd through the explicit
  path, at T = 7 (not a multiple of the kernel's blocks of 16), with GQA and MQA and with priors per K/V head, per
  query head and on a head count the kernel does not take as it is (repeated first);
* a 2-layer GPT of the magnitude-causal-logits variant (the registered variant whose prior is per key) with
  backend="triton" in float32 against the same model in float64 on the explicit path: logits and the gradient of
  every parameter; the float32 SDPA and explicit paths are held to the same bound, and the bound is small beside
  what dropping the prior changes;
* the causal leak check (tests/test_causal_leak.py's perturbation) in float32 on the triton backend;
* route(): which path each configuration and request takes, and every combination the kernel does not compute as
  a one-line error naming it and what is allowed.

Error measure: max |x - ref| / max(max |ref|, 1) per tensor. Tolerance 2e-5 on attention() and on the model's
logits: float32 (unit roundoff 6e-8) summed over at most T = 16 keys per softmax and through two layers of float32
matmuls; the errors measured are 1e-7 to 2e-6, the float32 SDPA path's are the same size, and removing the prior
changes the logits by more than 1e-2. The model's gradients pass through the float32 backward of the magnitude
solve, which amplifies rounding: 1e-4 between float32 paths and 3e-4 against float64 (GRAD_TOL32, GRAD_TOL64).
"""

import logging
import os

import pytest
import torch

CUDA = torch.cuda.is_available()
if not CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported: @triton.jit reads it then

from attnlab import GPT, AttentionConfig, GPTConfig, get_variant, variants  # noqa: E402
from attnlab.attention_config import _triton_misfits, route, say_route  # noqa: E402
from attnlab.errors import ConfigError  # noqa: E402
import importlib  # noqa: E402
from attnlab.functional import kernels  # noqa: E402
from attnlab.functional.attention import attention  # noqa: E402
from helpers import VOCAB, T, attention_ref, build, fit_rank, one_line_error  # noqa: E402

attention_module = importlib.import_module("attnlab.functional.attention")

try:
    import triton  # noqa: F401
    HAVE_TRITON = kernels.available()
except ImportError:
    HAVE_TRITON = False
needs_triton = pytest.mark.skipif(not HAVE_TRITON, reason="triton cannot run here (pip install 'attnlab[kernels]')")

DEVICE = "cuda" if CUDA else "cpu"
TOL = 2e-5
GRAD_TOL32 = 1e-4  # the model's float32 gradients, one path against another: SDPA and explicit differ by 2e-5
GRAD_TOL64 = 3e-4  # float32 gradients of the magnitude layer against float64: the float32 solve's error, any path
VARIANT = "magnitude-causal-logits"  # the registered variant whose logit prior is per key: [B, Hkv, S]
LOWRANK_VARIANT = "magnitude-prefix-logits-lowrank"  # the low-rank prefix prior: lowrank_prior_attention


pytestmark = pytest.mark.usefixtures("one_thread")  # the interpreter's small numpy products gain nothing from threads


def err(x, ref) -> float:
    """max |x - ref| / max(max |ref|, 1)."""
    ref = ref.double()
    return ((x.double() - ref).abs().max() / ref.abs().max().clamp(min=1.0)).item()


# ---------------------------------------------------------------------------------------- route() and the config


def test_auto_takes_triton_on_cuda_only_for_a_per_key_prior(monkeypatch):
    from attnlab import attention_config

    monkeypatch.setattr(attention_config, "_triton_available", lambda: True)
    cfg = get_variant(VARIANT)
    assert route(cfg).path == "sdpa" and route(cfg, device="cpu", dtype="float32").path == "sdpa"
    assert route(cfg, device="cuda", dtype="bfloat16") == ("triton", None, False)
    assert route(cfg, device="cuda", dtype="float64").path == "sdpa"  # the kernel has no float64
    for other in ("standard", "ssmax", "magnitude-causal", "magnitude-prefix-logits"):  # no prior, a gate, per (i, j)
        assert route(get_variant(other), device="cuda", dtype="float32").path != "triton", other
    assert route(cfg.replace(count_prior=True), device="cuda").path == "sdpa"  # the count prior is per (i, j)
    assert route(cfg.replace(backend="explicit"), device="cuda").path == "explicit"
    weights = route(cfg, device="cuda", return_weights=True)
    assert weights.path == "explicit" and "weights" in weights.forced and "triton" in weights.forced
    dropout = route(cfg, device="cuda", dropout=True)
    assert dropout.path == "sdpa" and "dropout" in dropout.forced and "triton" in dropout.forced
    monkeypatch.setattr(attention_config, "_triton_available", lambda: False)  # triton missing: SDPA's float mask
    assert route(cfg, device="cuda", dtype="float32").path == "sdpa"


def test_auto_takes_the_lowrank_kernels_on_cuda_for_the_lowrank_prefix_form(monkeypatch):
    """The low-rank prefix form (form 'prefix', solver 'lowrank'), as the prior or the value gate, goes to the
    low-rank kernels on CUDA and to the prefix blocks elsewhere; a rank above the kernels' 64 or the exact solver
    keep it off them, and backend='triton' names them."""
    from attnlab import attention_config

    monkeypatch.setattr(attention_config, "_triton_available", lambda: True)
    cfg = get_variant(LOWRANK_VARIANT)
    assert route(cfg, device="cuda", dtype="bfloat16") == ("triton", None, False)
    assert route(cfg, device="cpu", dtype="float32").path == "prefix_blocks"
    assert route(cfg.replace(backend="triton"), device="cpu", dtype="float32") == ("triton", None, False)
    wide = cfg.replace(magnitude=cfg.magnitude.replace(rank=65))
    assert route(wide, device="cuda", dtype="bfloat16").path == "prefix_blocks"
    one_line_error(lambda: wide.replace(backend="triton"), "backend='triton'", "magnitude form 'prefix'", "rank <= 64")
    gate = cfg.replace(magnitude=cfg.magnitude.replace(apply="values"))
    assert route(gate, device="cuda", dtype="bfloat16") == ("triton", None, False)
    assert route(gate, device="cpu", dtype="float32").path == "prefix_blocks"
    exact = get_variant("magnitude-prefix-logits")
    assert route(exact, device="cuda", dtype="bfloat16").path != "triton"
    one_line_error(lambda: exact.replace(backend="triton"), "backend='triton'", "magnitude form 'prefix'",
                   "solver other than 'lowrank'")


def test_backend_triton_forces_the_route_and_gives_up_the_cache():
    for name in ("standard", "gqa", "ssmax", "magnitude-causal", VARIANT):
        how = route(get_variant(name).replace(backend="triton"), device="cpu", dtype="float32")
        assert how == ("triton", None, False), name


@pytest.mark.parametrize("changes, named", [
    (dict(causal=False), "causal=false"),
    (dict(kernel="rbf"), "kernel='rbf'"),
    (dict(normalizer="none"), "normalizer='none'"),
    (dict(mask_form="renormalize"), "mask_form='renormalize'"),
    (dict(magnitude=get_variant("magnitude-prefix-logits").magnitude), "magnitude form 'prefix'"),
    (dict(magnitude=get_variant("magnitude-prefix").magnitude), "magnitude form 'prefix'"),
    (dict(count_prior=True), "count_prior=true"),
    (dict(sink=True), "sink=true"),
    (dict(selective=True), "selective=true"),
    (dict(heads="talking"), "heads.mix='talking'"),
    (dict(heads="coda"), "heads.mix='coda'"),
    (dict(differential=True), "differential=true"),
])
def test_a_config_the_kernel_does_not_compute_is_one_line(changes, named):
    one_line_error(lambda: AttentionConfig(backend="triton", **changes), "attention.backend='triton'", named,
                   "allowed: causal=true", "backend='auto'")


def test_requests_the_kernel_does_not_compute_are_one_line():
    cfg = get_variant(VARIANT).replace(backend="triton")
    one_line_error(lambda: route(cfg, return_weights=True), "backend='triton'", "weights")
    one_line_error(lambda: route(cfg, dropout=True), "backend='triton'", "dropout")
    one_line_error(lambda: route(cfg, dtype="float64"), "float64", "allowed: float16, bfloat16, float32")
    one_line_error(lambda: AttentionConfig(backend="flash"), "flash", "'triton'")
    assert build("standard").cache_exact and not build(get_variant("standard").replace(backend="triton")).cache_exact


def test_every_registered_variant_either_fits_or_is_named():
    """Each variant's misfits are exactly what backend='triton' refuses, and the variant with the per-key prior fits."""
    for name in variants():
        misfits = _triton_misfits(get_variant(name))
        if misfits:
            with pytest.raises(ConfigError, match="backend='triton'"):
                get_variant(name).replace(backend="triton")
        else:
            assert get_variant(name).replace(backend="triton").backend == "triton"
    assert _triton_misfits(get_variant(VARIANT)) == []


# ------------------------------------------------------------------------------------------ attention() itself


def _qkv(b=2, h=4, hkv=2, t=7, d=8, prior_heads=2, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, n, t, d, generator=g, dtype=torch.float64) for n in (h, hkv, hkv))
    prior = None if prior_heads is None else torch.randn(b, prior_heads, t, generator=g, dtype=torch.float64) * 2
    if prior is not None:
        prior.view(-1)[::3] = -20.0  # the log of a magnitude floor
    return [x if x is None else x.to(dtype) for x in (q, k, v, prior)]


@pytest.mark.parametrize("bad, named", [
    (dict(causal=False), "causal=False"),
    (dict(kernel="rbf"), "kernel='rbf'"),
    (dict(normalizer="none", logit_prior=None), "normalizer='none'"),
    (dict(mask_form="renormalize"), "mask_form='renormalize'"),
    (dict(return_weights=True), "return_weights=True"),
    (dict(dropout_p=0.1), "dropout"),
    (dict(attn_mask=torch.ones(7, 7, dtype=torch.bool)), "attn_mask"),
    (dict(sink=torch.zeros(4)), "sink"),
    (dict(value_gate=torch.ones(2, 2, 7, 7)), "value_gate"),
    (dict(logit_fn=lambda z: z), "heads mixed"),
    (dict(head_mix=(torch.eye(4), torch.eye(4))), "heads mixed"),
    (dict(logit_prior=torch.zeros(2, 2, 7, 7)), "per-(i, j) logit_prior"),
])
def test_attention_refuses_what_the_kernel_does_not_compute(bad, named):
    q, k, v, prior = _qkv()
    kw = dict(causal=True, logit_prior=prior) | bad
    with pytest.raises(ValueError) as info:
        attention(q, k, v, backend="triton", **kw)
    msg = str(info.value)
    assert "\n" not in msg and "backend='triton' cannot compute" in msg and named in msg, msg
    assert "it takes causal, kernel='dot'" in msg and "use backend='auto'" in msg


def test_attention_refuses_a_cache_offset_narrow_values_and_float64():
    q, k, v, prior = _qkv()
    for args, named in (((q[:, :, -2:], k, v), "7 keys for 2 queries"), ((q, k, v[..., :4]), "values 4 wide"),
                        ((q.double(), k.double(), v.double()), "dtype float64")):
        with pytest.raises(ValueError, match=named) as info:
            attention(*args, causal=True, backend="triton")
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match="backend='flash'; allowed: 'auto', 'sdpa', 'explicit', 'triton'"):
        attention(q, k, v, backend="flash")


def test_attention_says_when_triton_is_missing_or_cannot_run(monkeypatch):
    import importlib.util

    q, k, v, prior = _qkv()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "triton" else real(name, *a))
    with pytest.raises(ValueError, match=r"needs triton, which is not installed: pip install 'attnlab\[kernels\]'"):
        attention(q, k, v, causal=True, logit_prior=prior, backend="triton")
    monkeypatch.setattr(importlib.util, "find_spec", real)
    monkeypatch.setattr(attention_module, "_triton_runs", lambda: False)
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1") as info:
        attention(q, k, v, causal=True, logit_prior=prior, backend="triton")
    assert "\n" not in str(info.value)


def test_auto_never_takes_the_kernel_on_the_cpu(monkeypatch):
    def refuse(*args):
        raise AssertionError("auto took the Triton kernel on the CPU")

    monkeypatch.setattr(attention_module, "_prior_kernel", refuse)
    q, k, v, prior = _qkv()
    out = attention(q, k, v, causal=True, logit_prior=prior)  # auto: SDPA with the prior as a float mask
    ref, _ = attention_ref(q, k, v, causal=True, attn_mask=prior.repeat_interleave(2, 1).unsqueeze(-2).expand(-1, -1, 7, -1))
    assert err(out, torch.from_numpy(ref)) < TOL


@needs_triton
@pytest.mark.parametrize("h, hkv, prior_heads", [(4, 2, 2), (4, 2, 4), (4, 1, 1), (4, 1, 2), (2, 2, None)])
def test_attention_on_triton_against_float64(h, hkv, prior_heads):
    """Output against the numpy loop, gradients of q, k, v and the prior against float64 autograd (explicit path);
    scale and temperature as the layer passes them (softmax(q.k s / T + p))."""
    q64, k64, v64, p64 = _qkv(h=h, hkv=hkv, prior_heads=prior_heads, dtype=torch.float64, seed=h + hkv)
    leaves64 = [x.requires_grad_() for x in (q64, k64, v64, p64) if x is not None]
    leaves32 = [x.detach().float().to(DEVICE).requires_grad_() for x in leaves64]
    q, k, v, *prior = leaves32
    kw = dict(causal=True, scale=0.3, temperature=0.7)
    out = attention(q, k, v, logit_prior=prior[0] if prior else None, backend="triton", **kw)
    mask = None if p64 is None else p64.detach().repeat_interleave(h // prior_heads, 1).unsqueeze(-2).expand(-1, -1, 7, -1)
    ref, _ = attention_ref(q64.detach(), k64.detach(), v64.detach(), attn_mask=None if mask is None else mask.numpy(),
                           **kw)
    assert err(out.cpu(), torch.from_numpy(ref)) < TOL
    ref64 = attention(q64, k64, v64, logit_prior=p64, backend="explicit", **kw)
    upstream = torch.randn(ref64.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    grads = torch.autograd.grad(out, leaves32, upstream.float().to(DEVICE))
    grads64 = torch.autograd.grad(ref64, leaves64, upstream)
    for name, g, g64 in zip("qkvp", grads, grads64):
        assert err(g.cpu(), g64) < TOL, name


# -------------------------------------------------------------------------------------------------- the layer


def _model(variant, backend, dtype=torch.float32, **kw):
    """A 2-layer GPT of ``variant`` (a registered name or an AttentionConfig) on ``backend``."""
    torch.manual_seed(0)
    cfg = get_variant(variant) if isinstance(variant, str) else variant
    cfg = fit_rank(cfg.replace(backend=backend, **kw), T)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=4, n_embd=32, attention=cfg))
    return model.to(dtype=dtype, device=DEVICE)


def _logits_and_grads(model, idx):
    logits = model(idx.to(DEVICE))[0]
    upstream = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    (logits * upstream.to(logits)).sum().backward()
    return logits.detach().cpu(), {n: p.grad.cpu() for n, p in model.named_parameters() if p.grad is not None}


def _check_on_triton(variant, n_kv_head, kernel, float32_backends, caplog) -> dict:
    """A 2-layer GPT of ``variant`` on backend "triton" (float32): it logs the route through ``kernel`` once; its
    logits (to TOL) and every parameter's gradient (to GRAD_TOL64) equal the float64 explicit path's, and those of
    each backend of ``float32_backends`` in float32 (to TOL and GRAD_TOL32); dropping the magnitude weights moves
    the logits far more than these bounds. Returns the gradients {name: grad}."""
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    ref_logits, ref_grads = _logits_and_grads(_model(variant, "explicit", torch.float64, n_kv_head=n_kv_head), idx)
    say_route.cache_clear()
    with caplog.at_level(logging.INFO, logger="attnlab"):
        logits, grads = _logits_and_grads(_model(variant, "triton", n_kv_head=n_kv_head), idx)
    assert [r.getMessage() for r in caplog.records].count(
        f"attention: the triton path (attnlab.functional.kernels.{kernel}) on {DEVICE}, backend='triton'") == 1
    assert set(grads) == set(ref_grads)
    assert err(logits, ref_logits) < TOL
    for name, g in grads.items():
        assert err(g, ref_grads[name]) < GRAD_TOL64, name
    for backend in float32_backends:
        lo, gr = _logits_and_grads(_model(variant, backend, n_kv_head=n_kv_head), idx)
        assert err(logits, lo) < TOL, backend
        for name, g in grads.items():
            assert err(g, gr[name]) < GRAD_TOL32, (backend, name)
    without_prior, _ = _logits_and_grads(_model("standard", "explicit", torch.float64, n_kv_head=n_kv_head), idx)
    assert err(without_prior, ref_logits) > 1e-2  # the bounds are far below what lost magnitude weights would cost
    return grads


@needs_triton
@pytest.mark.parametrize("n_kv_head", [None, 2])
def test_the_variant_on_triton_matches_sdpa_and_float64(n_kv_head, caplog):
    """magnitude-causal-logits with backend="triton" (float32): the logits and every parameter's gradient (the
    prior's gradient reaches k_proj and the magnitude temperature) against the float32 SDPA and explicit paths,
    the logits to TOL and the gradients to GRAD_TOL32 (the float32 backward of the magnitude solve amplifies
    rounding differences in the prior's gradient: SDPA and explicit differ from each other by up to 2e-5, the
    triton path from either by up to 2.5e-5); and against the float64 explicit path, the logits to TOL and the
    gradients to GRAD_TOL64, the float32 solve's own error (every float32 path errs by the same 7e-5 to 9e-5 on
    k_proj's gradient). Dropping the prior moves the logits far more than any of these bounds."""
    grads = _check_on_triton(VARIANT, n_kv_head, "prior_attention", ("sdpa", "explicit"), caplog)
    assert any("magnitude" in n for n in grads)


def _lowrank_gate(form):
    """magnitude-prefix-logits-lowrank with the value gate ``form`` in place of the prior (no registered variant
    has it; beta = 4, gamma = -2 so that the clamp and linear gates' kinks are crossed)."""
    cfg = get_variant(LOWRANK_VARIANT)
    return cfg.replace(magnitude=cfg.magnitude.replace(apply="values", gate=form, beta=4.0, gamma=-2.0))


@needs_triton
@pytest.mark.parametrize("variant, n_kv_head, kernel", [
    (LOWRANK_VARIANT, None, "lowrank_prior_attention"), (LOWRANK_VARIANT, 2, "lowrank_prior_attention"),
    *[(_lowrank_gate(form), n, "lowrank_gate_attention") for form, n in (("clamp", 2), ("sigmoid", None),
                                                                          ("linear", None))]],
    ids=["prior", "prior-gqa", "clamp-gqa", "sigmoid", "linear"])
def test_the_lowrank_forms_on_triton_match_the_prefix_blocks_and_float64(variant, n_kv_head, kernel, caplog):
    """magnitude-prefix-logits-lowrank, and the same with each value gate, with backend="triton" (the kernels
    lowrank_prior_attention and lowrank_gate_attention, float32): the logits and every parameter's gradient (the
    prior's or the gate's gradient reaches k_proj, the landmarks, the kernel's temperature and the gate's beta and
    gamma through phi, lambda and c) against the same model on the prefix blocks ("auto" on the CPU) and on the
    explicit path in float32, the logits to TOL and the gradients to GRAD_TOL32, and against the float64 explicit path ([T, T] weights from
    the same low-rank solve), the logits to TOL and the gradients to GRAD_TOL64 (the float32 solve's own error, as
    for the per-key variant)."""
    grads = _check_on_triton(variant, n_kv_head, kernel, ("explicit",) if CUDA else ("auto", "explicit"), caplog)
    assert any("landmarks" in n for n in grads)
    if kernel == "lowrank_gate_attention":
        assert any(n.endswith("beta") for n in grads) and any(n.endswith("gamma") for n in grads)


def _leak(model, positions=(0, 3, 8, 14)) -> float:
    """helpers.max_leak's perturbation in float32 (the kernel has no float64): the largest change of the logits at
    positions <= i when the tokens after i change."""
    model.eval()
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, VOCAB, (2, T), generator=g)
    worst = 0.0
    with torch.no_grad():
        base = model(idx.to(DEVICE))[0].cpu()
        for i in positions:
            perturbed = idx.clone()
            perturbed[:, i + 1:] = (idx[:, i + 1:] + 1 + torch.randint(0, VOCAB - 1, (2, T - i - 1), generator=g)) % VOCAB
            out = model(perturbed.to(DEVICE))[0].cpu()
            worst = max(worst, (out[:, : i + 1] - base[:, : i + 1]).abs().max().item())
            assert (out[:, i + 1:] - base[:, i + 1:]).abs().max() > 1e-3  # the perturbation does reach the future
    return worst


FITTING = [v for v in variants() if not _triton_misfits(get_variant(v))]


@needs_triton
@pytest.mark.parametrize("variant", [pytest.param(v, marks=() if v in (VARIANT, LOWRANK_VARIANT, "gqa", "ssmax")
                                                                  else pytest.mark.slow)
                                     for v in FITTING])
def test_no_leak_on_triton_backend(variant):
    """The causal leak check on the triton backend, for every registered variant the kernel computes (the variant
    with the per-key prior, GQA and SSMax in the default suite). Float32: the bound is 1e-6 on logits of size ~1,
    where a kernel that read one future key would move them by 1e-2 or more."""
    assert _leak(_model(variant, "triton")) < 1e-6
