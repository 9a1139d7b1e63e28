"""Differential attention (attention.differential, variant differential; Ye et al. 2024, arXiv:2410.05258).

No installable implementation maps onto the paper's layer (the PyPI package `differential-transformer` 0.0.3 takes
lambda as a fixed input, has no causal mask, no per-head norm and one LayerNorm after W_O, and needs `zetascale`), so
the layer is checked against the float64 reference written from the paper's equations
(attnlab.mechanisms.differential.reference) and against closed forms: lambda = 0 leaves one softmax attention over
the first halves, identical halves with lambda = 1 give a zero map, a first query keeps 1 - lambda of its one key.
The leak test (tests/test_causal_leak.py) and the K/V-cache tests (tests/test_kv_cache.py) cover it as a registered
variant.
"""

from __future__ import annotations

import math
import re

import pytest
import torch

from attnlab import GPT, AttentionConfig, ConfigError, GPTConfig
from attnlab.mechanisms.differential.reference import (LAMBDA_STD, NORM_EPS, differential_attention,
                                                       differential_weights, head_rms_norm, lambda_init, lambda_value)
from attnlab.nn import Attention, RotaryEmbedding

TOL = dict(rtol=1e-10, atol=1e-12)  # float64 on both sides; they differ in summation order only (~1e-15)
HEAD_DIM, HALF = 8, 4


def test_lambda_init_follows_the_papers_schedule():
    # 0.8 - 0.6 exp(-0.3 (l - 1)) at l = 1..4, written out: 0.8 - 0.6, 0.8 - 0.6 e^-0.3, ...
    expected = [0.2, 0.355509067591, 0.470713018344, 0.556058204156]
    assert [lambda_init(layer) for layer in range(4)] == pytest.approx(expected, abs=1e-12)
    assert lambda_init(1000) == pytest.approx(0.8)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=4, n_head=2, n_embd=16, attention="differential"))
    assert [b.attn.differential.init for b in model.blocks] == pytest.approx(expected, abs=1e-12)


def test_lambda_vectors_start_small_and_lambda_near_lambda_init():
    torch.manual_seed(0)
    heads = Attention(AttentionConfig(n_head=4, n_kv_head=4, differential=True), 256, layer=3).differential
    vectors = [heads.lambda_q1, heads.lambda_k1, heads.lambda_q2, heads.lambda_k2]
    assert all(v.shape == (32,) for v in vectors)  # d' = head_dim / 2 = 256 / 4 / 2
    std = torch.cat([v.detach() for v in vectors]).std().item()
    assert 0.8 * LAMBDA_STD < std < 1.2 * LAMBDA_STD  # 128 draws of N(0, 0.1^2)
    assert torch.equal(heads.gain.detach(), torch.ones(64))  # one gain per head_dim entry, shared by the heads
    # each dot product of two N(0, 0.01) vectors of 32 entries has std 0.01 sqrt(32) ~ 0.06: lambda within ~0.5
    assert abs(heads.lam().item() - lambda_init(3)) < 0.5


def _layer(*, causal=True, n_kv_head=2, layer=2, bias=True, **kw) -> Attention:
    torch.manual_seed(1)
    cfg = AttentionConfig(n_head=4, n_kv_head=n_kv_head, bias=bias, dropout=0.0, causal=causal, differential=True,
                          **kw)
    attn = Attention(cfg, 4 * HEAD_DIM, layer=layer).double()
    with torch.no_grad():  # lambda away from lambda_init and a gain away from 1, so that both are exercised
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            getattr(attn.differential, name).copy_(0.4 * torch.randn(HALF))
        attn.differential.gain.copy_(1 + 0.2 * torch.randn(HEAD_DIM))
    return attn


def _params(attn: Attention):
    d = attn.differential
    return [p.detach().clone() for p in (d.lambda_q1, d.lambda_k1, d.lambda_q2, d.lambda_k2, d.gain)]


def _expected(attn: Attention, x, *, q=None, k=None, prior=None, params=None):
    """The layer's y from the reference: W_O applied to (1 - lambda_init) RMSNorm(DiffAttn) of its own projections."""
    pq, pk, v = attn.project(x)
    q, k = (pq if q is None else q), (pk if k is None else k)
    rep = attn.n_head // attn.n_kv_head
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    q1, k1, q2, k2, gain = _params(attn) if params is None else params
    init = attn.differential.init
    lam = lambda_value(q1, k1, q2, k2, init)
    o = differential_attention(q, k, v, lam, init, gain, causal=attn.config.causal, prior=prior)
    weights = differential_weights(q, k, lam, causal=attn.config.causal, prior=prior)
    return attn.out_proj(o.transpose(1, 2).flatten(-2)), weights


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])  # MHA, GQA, MQA
@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_computes_the_reference_on_both_paths(causal, n_kv_head):
    attn = _layer(causal=causal, n_kv_head=n_kv_head)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    y, weights = _expected(attn, x)
    explicit = attn.run(x, return_weights=True)
    torch.testing.assert_close(explicit.weights, weights, **TOL)
    torch.testing.assert_close(explicit.y, y, **TOL)
    torch.testing.assert_close(attn.run(x).y, y, **TOL)  # no weights asked: two SDPA calls


def test_rope_rotates_each_half_of_a_head_on_its_own():
    """The authors' code rotates Q1, Q2, K1, K2 each as a d/2-wide head; the reference gets them rotated that way,
    slice by slice."""
    attn = _layer()
    rope = RotaryEmbedding(16, HALF).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    q, k, _ = attn.project(x)
    q, k = (torch.cat([rope(t[..., :HALF]), rope(t[..., HALF:])], dim=-1) for t in (q, k))
    y, _ = _expected(attn, x, q=q, k=k)
    torch.testing.assert_close(attn.run(x, rope).y, y, **TOL)
    torch.testing.assert_close(attn.run(x, rope, return_weights=True).y, y, **TOL)


def test_a_logit_prior_enters_both_maps():
    """The count prior composes: -log c_ij added to the logits of both softmax maps (here any [B, 1, T, T] prior)."""
    attn = _layer(count_prior=True)
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    prior = -torch.rand(2, 1, 7, 7, dtype=torch.float64) * 2
    y, weights = _expected(attn, x, prior=prior)
    torch.testing.assert_close(attn.run(x, count_prior=prior).y, y, **TOL)
    torch.testing.assert_close(attn.run(x, count_prior=prior, return_weights=True).weights, weights, **TOL)


def test_ssmax_scales_both_maps():
    """SSMax composes: query i of head h times s_h log n_i scales the logits of both halves (arXiv:2501.19399)."""
    attn = _layer(ssmax=True)
    with torch.no_grad():
        attn.ssmax.s.copy_(torch.tensor([0.43, 0.2, 0.9, 1.5]))
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    q, _, _ = attn.project(x)
    n = torch.arange(1, 8, dtype=torch.float64)  # a causal query i sees i + 1 keys
    q = q * attn.ssmax.s.detach().view(1, 4, 1, 1) * n.log().view(1, 1, 7, 1)
    y, _ = _expected(attn, x, q=q)
    torch.testing.assert_close(attn.run(x).y, y, **TOL)


def _set_lambda(attn: Attention, value: float) -> None:
    """lambda_q1 = lambda_k1 = 0 (exp(0) = 1) and lambda_q2 . lambda_k2 = log(1 + init - value), so lambda = value."""
    d = attn.differential
    dot = math.log(1 + d.init - value)
    with torch.no_grad():
        for p in (d.lambda_q1, d.lambda_k1, d.lambda_q2, d.lambda_k2):
            p.zero_()
        d.lambda_q2[0], d.lambda_k2[0] = math.sqrt(abs(dot)), math.copysign(math.sqrt(abs(dot)), dot)
    assert d.lam().item() == pytest.approx(value, abs=1e-14)


def test_lambda_zero_is_one_softmax_attention_over_the_first_halves():
    attn = _layer()
    _set_lambda(attn, 0.0)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    q, k, v = attn.project(x)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    z = q[..., :HALF] @ k[..., :HALF].transpose(-1, -2) / math.sqrt(HALF)
    future = torch.ones(9, 9, dtype=torch.bool).triu(1)
    o = torch.softmax(z.masked_fill(future, float("-inf")), dim=-1) @ v  # softmax(Q1 K1'/sqrt(d')) V
    o = (1 - attn.differential.init) * o / (o.pow(2).mean(-1, keepdim=True) + NORM_EPS).sqrt() \
        * attn.differential.gain.detach()
    expected = attn.out_proj(o.transpose(1, 2).flatten(-2))
    torch.testing.assert_close(attn.run(x).y, expected, **TOL)


def test_identical_halves_with_lambda_one_give_a_zero_map():
    attn = _layer(bias=False)
    _set_lambda(attn, 1.0)
    with torch.no_grad():  # the second half of every head's query and key rows = the first half: Q2 = Q1, K2 = K1
        for proj, heads in ((attn.q_proj, 4), (attn.k_proj, 2)):
            w = proj.weight.view(heads, 2, HALF, -1)
            w[:, 1] = w[:, 0]
    x = torch.randn(2, 9, 32, dtype=torch.float64, requires_grad=True)
    out = attn.run(x, return_weights=True)
    assert out.weights.abs().max() < 1e-15 and out.y.abs().max() < 1e-12  # A1 - A2 = 0, the norm of 0 is 0
    attn.run(x).y.sum().backward()  # RMSNorm of a zero map: rsqrt(0 + eps), finite gradients
    assert all(torch.isfinite(p.grad).all() for p in (x, attn.differential.lambda_q2, attn.differential.gain))


def test_lambda_vectors_and_gain_get_the_references_gradients():
    attn = _layer()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    w = torch.randn(2, 9, 32, dtype=torch.float64)
    (attn.run(x).y * w).sum().backward()
    d = attn.differential
    got = [p.grad for p in (d.lambda_q1, d.lambda_k1, d.lambda_q2, d.lambda_k2, d.gain)]
    leaves = [p.requires_grad_() for p in _params(attn)]
    y, _ = _expected(attn, x, params=leaves)
    expected = torch.autograd.grad((y * w).sum(), leaves)
    for g, e in zip(got, expected):
        assert e.abs().max() > 1e-6  # every parameter matters
        torch.testing.assert_close(g, e, **TOL)


def test_lambda_gradient_by_finite_differences():
    """gradcheck: the layer's gradient in the lambda vectors against central differences (float64)."""
    attn = _layer()
    x = torch.randn(1, 5, 32, dtype=torch.float64)
    d = attn.differential

    def f(q1, k1, q2, k2):
        with torch.no_grad():
            for p, value in zip((d.lambda_q1, d.lambda_k1, d.lambda_q2, d.lambda_k2), (q1, k1, q2, k2)):
                p.copy_(value)
        return attn.run(x).y

    def g(q1, k1, q2, k2):  # the same map, differentiable in its arguments through the reference's lambda
        lam = lambda_value(q1, k1, q2, k2, d.init)
        pq, pk, v = attn.project(x)
        pk, v = pk.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
        o = differential_attention(pq, pk, v, lam, d.init, d.gain, causal=True)
        return attn.out_proj(o.transpose(1, 2).flatten(-2))

    inputs = tuple(p.detach().clone().requires_grad_() for p in (d.lambda_q1, d.lambda_k1, d.lambda_q2, d.lambda_k2))
    assert torch.autograd.gradcheck(g, inputs)
    torch.testing.assert_close(f(*inputs), g(*inputs), **TOL)


def test_the_first_query_keeps_one_minus_lambda_and_near_duplicates_stay_finite():
    attn = _layer()
    x = torch.randn(1, 6, 32, dtype=torch.float64).expand(1, 6, 32).clone()
    x[:, 1:] = x[:, :1] + 1e-9 * torch.randn(1, 5, 32, dtype=torch.float64)  # near-duplicate tokens
    out = attn.run(x, return_weights=True)
    assert torch.isfinite(out.y).all() and torch.isfinite(out.weights).all()
    lam = attn.differential.lam().detach()
    torch.testing.assert_close(out.weights[..., 0, 0], (1 - lam).expand(1, 4))  # both maps put 1 on key 0
    _, _, v = attn.project(x)
    v0 = v[:, :, 0].repeat_interleave(2, dim=1)  # [1, 4, d]
    o0 = (1 - attn.differential.init) * head_rms_norm((1 - lam) * v0, attn.differential.gain.detach())
    torch.testing.assert_close(out.y[:, 0], attn.out_proj(o0.flatten(-2)), **TOL)
    attn.run(x).y.sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


@pytest.mark.parametrize("kw", [dict(pos_encoding="rope", attention=AttentionConfig(n_kv_head=2, differential=True)),
                                dict(pos_encoding="learned", attention="differential")])
def test_generation_with_the_cache_equals_recomputation(kw):
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=4, n_embd=32, **kw)).double().eval()
    assert model.cache_exact
    prompt = torch.randint(0, 11, (2, 3))
    cached = model.generate(prompt, 9, temperature=0.0, use_cache=True)
    full = model.generate(prompt, 9, temperature=0.0, use_cache=False)
    assert torch.equal(cached, full)
    idx = torch.randint(0, 11, (2, 12))
    cache = model.new_cache()
    pieces = [model(idx[:, :5], cache=cache)[0], model(idx[:, 5:6], cache=cache)[0], model(idx[:, 6:], cache=cache)[0]]
    torch.testing.assert_close(torch.cat(pieces, 1), model(idx)[0], **TOL)


def test_the_parameters_learn():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=16, attention="differential"))
    idx = torch.randint(0, 11, (2, 8))
    model(idx, idx)[1].backward()
    d = model.blocks[0].attn.differential
    for p in (d.lambda_q1, d.lambda_k1, d.lambda_q2, d.lambda_k2, d.gain):
        assert p.grad is not None and p.grad.abs().sum() > 0


@pytest.mark.parametrize("bad, message", [
    (dict(kernel="rbf"), "got kernel='rbf' (allowed: kernel='dot', normalizer='softmax', heads.mix='concat', "
                         "magnitude='off', qk_norm='off', sink=false, selective=false)"),
    (dict(normalizer="none"), "got normalizer='none' (allowed"),
    (dict(heads="talking"), "got heads.mix='talking' (allowed"),
    (dict(heads="moh"), "got heads.mix='moh' (allowed"),
    (dict(magnitude="causal"), "got magnitude='causal' (allowed"),
    (dict(qk_norm="fixed"), "got qk_norm='fixed' (allowed"),
    (dict(sink=True), "got sink=True (allowed"),
    (dict(selective=True), "got selective=True (allowed"),
    (dict(normalizer="softpick"), "got normalizer='softpick' (allowed"),
])
def test_switches_that_do_not_compose_are_one_line_errors(bad, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        AttentionConfig(differential=True, **bad)
    assert "\n" not in str(info.value)


def test_sizes_and_types_are_one_line_errors():
    with pytest.raises(ConfigError, match="attention.differential='yes' must be true or false"):
        AttentionConfig(differential="yes")
    with pytest.raises(ConfigError, match="head_dim=5 is odd; use an even n_embd / n_head"):
        GPTConfig(n_embd=20, n_head=4, pos_encoding="learned", attention="differential")
    with pytest.raises(ConfigError, match="rotates each half of a head, which needs head_dim divisible by 4, got 6"):
        GPTConfig(n_embd=24, n_head=4, pos_encoding="rope", attention="differential")
    GPTConfig(n_embd=24, n_head=4, pos_encoding="learned", attention="differential")  # head_dim 6: fine without RoPE


def test_it_is_on_the_dilution_page_of_the_leaderboard():
    from attnlab.experiments.leaderboard import family

    assert family("differential") == "dilution"
