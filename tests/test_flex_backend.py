"""The FlexAttention backend (attnlab.functional.flex; backend="flex") against independent references.

* attention(..., backend="flex") against the float64 numpy loop written from the formula (tests/helpers.py's
  attention_ref, with the prior as a float mask and the sink as one more zero-valued key), causal and not, with
  GQA and MQA, a prior per K/V head, per query head, shared by all heads, broadcast over the batch, and per (i, j),
  a sink, and more keys than queries (a K/V cache), at T = 7 and S = 11 (FlexAttention's blocks are 128: every
  case is a partial block);
* a 2-layer GPT of every registered variant the backend computes, in float64, against the same model on the
  explicit path: the logits, and the tokens of a cached decode against the full forward;
* route() and the one-line errors for what the backend does not compute, and for gradients on the CPU.

On the CPU FlexAttention runs unfused and forward only, in float64: the bound is 1e-12 (rounding of sums of at
most 12 terms). Its backward pass and its compiled kernels run on a GPU only: the last test, skipped here, compares
the gradients of the float32 model on CUDA with the explicit path's (benchmarks/cuda_checks.sh runs it).
"""

import logging
import math

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, get_variant, variants
from attnlab.attention_config import _flex_misfits, route, say_route
from attnlab.functional.attention import attention
from helpers import VOCAB, T, attention_ref, fit_rank, one_line_error

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

TOL = 1e-12
CUDA = torch.cuda.is_available()


def _inputs(b=2, h=4, hkv=2, t=7, s=11, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, t, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, g


def _reference(q, k, v, *, causal, scale, prior=None, sink=None):
    """attention_ref with the prior as a float mask [B, H, T, S] and the sink as key S: a zero key (score 0) whose
    mask entry is s_h and whose value is zero."""
    b, h, t, _ = q.shape
    s = k.shape[2]
    bias = np.zeros((b, h, t, s))
    if prior is not None:
        p = prior.numpy().repeat(h // prior.shape[1], axis=1)
        bias = bias + (p[:, :, None, :] if p.ndim == 3 else p)
    if causal:  # the sink column is seen by every query, so the causal mask goes into the bias here
        bias = np.where(np.arange(s)[None, :] <= s - t + np.arange(t)[:, None], bias, -np.inf)
    if sink is not None:
        k, v = (torch.nn.functional.pad(x, (0, 0, 0, 1)) for x in (k, v))
        bias = np.concatenate([bias, np.broadcast_to(sink.numpy()[None, :, None, None], (b, h, t, 1))], axis=-1)
    out, _ = attention_ref(q.numpy(), k.numpy(), v.numpy(), scale=scale, attn_mask=bias)
    return out


PRIORS = {
    "none": lambda b, h, hkv, t, s, g: None,
    "per key, Hkv heads": lambda b, h, hkv, t, s, g: torch.randn(b, hkv, s, generator=g, dtype=torch.float64),
    "per key, H heads": lambda b, h, hkv, t, s, g: torch.randn(b, h, s, generator=g, dtype=torch.float64),
    "per key, one head, batch 1": lambda b, h, hkv, t, s, g: torch.randn(1, 1, s, generator=g, dtype=torch.float64),
    "per (i, j), Hkv heads": lambda b, h, hkv, t, s, g: torch.randn(b, hkv, t, s, generator=g, dtype=torch.float64),
    "per (i, j), H heads, batch 1": lambda b, h, hkv, t, s, g: torch.randn(1, h, t, s, generator=g,
                                                                          dtype=torch.float64),
}


@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
@pytest.mark.parametrize("prior_kind", list(PRIORS))
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("heads", [(4, 2), (4, 1), pytest.param((2, 2), marks=pytest.mark.slow)],
                         ids=["gqa", "mqa", "mha"])
def test_attention_on_flex_against_the_numpy_loop(heads, causal, prior_kind, with_sink):
    """T = 7 queries over S = 11 keys (causal: query i at position 4 + i, as with a K/V cache)."""
    h, hkv = heads
    q, k, v, g = _inputs(h=h, hkv=hkv)
    prior = PRIORS[prior_kind](2, h, hkv, 7, 11, g)
    sink = torch.randn(h, generator=g, dtype=torch.float64) if with_sink else None
    with torch.no_grad():
        out = attention(q, k, v, causal=causal, scale=0.3, logit_prior=prior, sink=sink, backend="flex")
        plain = attention(q, k, v, causal=causal, scale=0.3, backend="flex")
    ref = _reference(q, k, v, causal=causal, scale=0.3, prior=prior, sink=sink)
    assert np.abs(out.numpy() - ref).max() < TOL
    if prior is not None or sink is not None:  # the modifier is not lost on the way
        assert (out - plain).abs().max() > 1e-3


@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
@pytest.mark.parametrize("prior_kind", ["none", "per key, Hkv heads", "per (i, j), H heads, batch 1"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("heads", [(4, 2), (4, 1)], ids=["gqa", "mqa"])
def test_alibi_inside_the_kernel_against_the_numpy_loop(heads, causal, prior_kind, with_sink):
    """ALiBi computed in the score modifier from the indices, -m_h |pos_i - j| with pos_i = S - T + i (T = 7 queries
    after 4 cached keys), against the reference with the bias written out in numpy as one more float mask; the
    other backends (SDPA, explicit) build the same bias as a tensor and must agree too."""
    h, hkv = heads
    q, k, v, g = _inputs(h=h, hkv=hkv)
    prior = PRIORS[prior_kind](2, h, hkv, 7, 11, g)
    sink = torch.randn(h, generator=g, dtype=torch.float64) if with_sink else None
    slopes = torch.tensor([0.5, 0.25, 0.8, 0.0625], dtype=torch.float64)[:h]
    pos_q, pos_k = np.arange(4, 11)[:, None], np.arange(11)[None, :]
    bias = -slopes.numpy()[None, :, None, None] * np.abs(pos_q - pos_k)  # [1, H, T, S]
    full = torch.from_numpy(np.broadcast_to(bias, (2, h, 7, 11)).copy())
    if prior is not None:
        full = full + (prior.repeat_interleave(h // prior.shape[1], 1) if prior.dim() == 4 else
                       prior.repeat_interleave(h // prior.shape[1], 1).unsqueeze(-2))
    ref = _reference(q, k, v, causal=causal, scale=0.3, prior=full, sink=sink)
    with torch.no_grad():
        for backend in ("flex", "explicit", "sdpa"):
            if backend == "sdpa" and sink is not None:
                continue
            out = attention(q, k, v, causal=causal, scale=0.3, logit_prior=prior, sink=sink, alibi=slopes,
                            backend=backend)
            assert np.abs(out.numpy() - ref).max() < TOL, backend


@pytest.mark.parametrize("bad, named", [(dict(alibi=torch.ones(3)), "shape (3,)"),
                                        (dict(alibi=torch.ones(4), normalizer="none"), "normalizer='none'")])
def test_alibi_it_cannot_take_is_one_line(bad, named):
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="^alibi needs normalizer='softmax' and slopes of shape \\[4\\]") as caught:
        attention(q, k, v, causal=True, backend="flex", **bad)
    assert named in str(caught.value) and "\n" not in str(caught.value)


def test_temperature_and_default_scale():
    q, k, v, _ = _inputs(t=11)
    with torch.no_grad():
        out = attention(q, k, v, causal=True, temperature=0.5, backend="flex")
    ref = _reference(q, k, v, causal=True, scale=2.0 / math.sqrt(8))
    assert np.abs(out.numpy() - ref).max() < TOL


FITS = [v for v in variants() if not _flex_misfits(get_variant(v))]


def _model(cfg, backend, pos_encoding="learned"):
    torch.manual_seed(0)
    cfg = fit_rank(cfg, T).replace(backend=backend)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=4, n_embd=32, attention=cfg,
                         pos_encoding=pos_encoding)).double().eval()


def test_the_registered_variants_it_computes():
    """The variants whose attention is a dot-product softmax with a score modifier (priors, sink, SSMax's scale,
    QK-norm, differential attention's two maps, per-key value gates on v) fit; those with another normalizer, a
    per-(i, j) value gate or logits mixed across heads are named."""
    assert {"standard", "gqa", "magnitude-causal-logits", "magnitude-prefix-logits", "count-prior", "sink", "ssmax",
            "differential", "magnitude-causal"} <= set(FITS)
    for name in ("softpick", "stick-breaking", "rbf", "mask-renormalize", "selective", "talking-heads", "coda",
                 "magnitude-prefix"):
        assert name not in FITS, name


@pytest.mark.parametrize("variant", FITS)
def test_the_model_on_flex_equals_the_explicit_path(variant, caplog):
    """float64 logits of a 2-layer GPT on backend 'flex' and on the explicit path; the layer logs its route once."""
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1))
    say_route.cache_clear()
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="attnlab"):
        flex, explicit = (_model(get_variant(variant), b)(idx)[0] for b in ("flex", "explicit"))
    assert (flex - explicit).abs().max() < TOL
    assert [r.getMessage() for r in caplog.records].count(
        "attention: the flex path (attnlab.functional.flex, FlexAttention) on cpu, backend='flex'") == 1


@pytest.mark.parametrize("variant", ["standard", "gqa", "sink", "magnitude-causal-logits", "count-prior",
                                     pytest.param("differential", marks=pytest.mark.slow)])
def test_the_model_with_alibi_on_flex_equals_the_explicit_path(variant):
    """pos_encoding='alibi': the flex path computes the bias inside the kernel, the explicit path adds the
    materialised [H, T, S] tensor; float64 logits of the full forward and of a cached decode agree."""
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(4))
    flex, explicit = (_model(get_variant(variant), b, "alibi") for b in ("flex", "explicit"))
    with torch.no_grad():
        full = flex(idx)[0]
        assert (full - explicit(idx)[0]).abs().max() < TOL
        assert (full - _model(get_variant(variant), "explicit")(idx)[0]).abs().max() > 1e-3  # ALiBi is not lost
        if route(flex.config.resolved_attention()).cacheable:
            cache = flex.new_cache()
            steps = [flex(idx[:, :5], cache=cache)[0]] + [flex(idx[:, i:i + 1], cache=cache)[0] for i in range(5, T)]
            assert (torch.cat(steps, dim=1) - full).abs().max() < TOL


@pytest.mark.parametrize("variant", ["sink", pytest.param("gqa", marks=pytest.mark.slow),
                                     pytest.param("ssmax", marks=pytest.mark.slow)])
def test_a_cached_decode_on_flex(variant):
    """Prefill 5 tokens, then one token at a time with the K/V cache (more keys than queries from then on): the
    logits equal the full forward's at every position."""
    model = _model(get_variant(variant), "flex")
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(idx)[0]
        cache = model.new_cache()
        steps = [model(idx[:, :5], cache=cache)[0]]
        steps += [model(idx[:, i:i + 1], cache=cache)[0] for i in range(5, T)]
    assert (torch.cat(steps, dim=1) - full).abs().max() < TOL


def test_route_takes_flex_only_when_asked():
    cfg = get_variant("magnitude-causal-logits")
    assert route(cfg.replace(backend="flex")) == ("flex", None, False)
    assert route(cfg.replace(backend="flex"), device="cuda", dtype="bfloat16").path == "flex"
    assert route(cfg, device="cuda", dtype="float64").path != "flex"
    assert route(get_variant("standard").replace(backend="flex")).cacheable


@pytest.mark.parametrize("changes, named", [
    (dict(kernel="rbf"), "kernel='rbf'"),
    (dict(normalizer="softpick"), "normalizer='softpick'"),
    (dict(mask_form="renormalize"), "mask_form='renormalize'"),
    (dict(selective=True), "selective=true"),
    (dict(heads="talking"), "heads.mix='talking'"),
    (dict(magnitude=get_variant("magnitude-prefix").magnitude), "per-(i, j) value gate"),
])
def test_a_config_flex_does_not_compute_is_one_line(changes, named):
    one_line_error(lambda: get_variant("standard").replace(backend="flex", **changes), "attention.backend='flex'",
                   named, "allowed: kernel='dot'", "backend='auto'")


def test_requests_flex_does_not_compute_are_one_line():
    cfg = get_variant("sink").replace(backend="flex")
    one_line_error(lambda: route(cfg, return_weights=True), "backend='flex'", "weights")
    one_line_error(lambda: route(cfg, dropout=True), "backend='flex'", "dropout")


@pytest.mark.parametrize("bad, named", [
    (dict(kernel="rbf"), "kernel='rbf'"),
    (dict(return_weights=True), "return_weights=True"),
    (dict(dropout_p=0.1), "dropout"),
    (dict(attn_mask=torch.ones(7, 11, dtype=torch.bool)), "an attn_mask"),
    (dict(value_gate=torch.ones(2, 2, 7, 11, dtype=torch.float64)), "a value_gate"),
    (dict(logit_fn=lambda z: z), "heads mixed"),
])
def test_attention_refuses_what_flex_does_not_compute(bad, named):
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match=f"^backend='flex' cannot compute .*{named}") as caught:
        attention(q, k, v, causal=True, backend="flex", **bad)
    assert "\n" not in str(caught.value)


@pytest.mark.skipif(CUDA, reason="the CPU's limit")
def test_gradients_on_the_cpu_are_a_one_line_error():
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match="^backend='flex' has no backward pass on cpu") as caught:
        attention(q.requires_grad_(), k, v, causal=True, backend="flex")
    assert "\n" not in str(caught.value)
    model = _model(get_variant("standard"), "flex").train()
    with pytest.raises(ValueError, match="no backward pass on cpu"):
        model(torch.zeros(1, T, dtype=torch.long))


@pytest.mark.skipif(not CUDA, reason="FlexAttention's backward and compiled kernels run on a GPU only")
@pytest.mark.parametrize("variant, pos, changes", [(v, "learned", {}) for v in (
    "magnitude-causal-logits", "magnitude-prefix-logits", "count-prior", "sink", "gqa")] + [
    ("standard", "alibi", {}), ("magnitude-causal-logits", "alibi", {}),
    ("gqa", "rope", {"qk_norm": "fixed", "softcap": 0.5})])  # logits up to sqrt(8) at initialisation: the cap bites
def test_gradients_on_cuda_equal_the_explicit_path(variant, pos, changes):
    """float32 on CUDA, compiled: the logits to 1e-4 and every parameter's gradient to 1e-3 of the explicit path's
    (float32 with TF32 off; the compiled kernel's block sums and the float32 magnitude solve round differently).
    ALiBi and a softcap are computed inside the score modifier, so their gradients go through the compiled kernel."""
    torch.backends.cuda.matmul.allow_tf32 = False
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(1)).cuda()
    results = []
    for backend in ("flex", "explicit"):
        model = _model(get_variant(variant).replace(**changes), backend, pos).float().cuda().train()
        logits = model(idx)[0]
        upstream = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3)).cuda()
        (logits * upstream).sum().backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
    (flex, flex_grads), (explicit, explicit_grads) = results
    assert (flex - explicit).abs().max() < 1e-4
    assert set(flex_grads) == set(explicit_grads)
    for name, g in flex_grads.items():
        ref = explicit_grads[name]
        assert ((g - ref).abs().max() / ref.abs().max().clamp(min=1.0)) < 1e-3, name
