"""Selective attention (attention.selective, variant selective; Leviathan, Kalman and Matias 2024, arXiv:2410.02703):
the float64 reference against a case worked by hand, the layer's fast form against the reference, the layer against
x-transformers' `Attention(selective=True)` (an independent implementation) with the same weights, MHA, GQA and MQA,
outputs and gradients; first queries, near-duplicate keys, the route and the errors. The leak test
(tests/test_causal_leak.py) covers it as a registered variant; tests/test_kv_cache.py checks that it refuses a cache."""

from __future__ import annotations

import math

import pytest
import torch
from x_transformers.x_transformers import Attention as OracleAttention

from attnlab import GPT, AttentionConfig, ConfigError, GPTConfig
from attnlab.attention_config import route
from attnlab.mechanisms.selective.functional import select_logits, selection_penalty
from attnlab.mechanisms.selective.reference import selection_penalty_reference, selective_weights
from attnlab.nn import Attention
from helpers import one_line_error

N_EMBD, N_HEAD = 32, 4


def test_a_case_worked_by_hand():
    """T = 5, one head. S_kj = ReLU(z_kj) for 0 < j < k: S_21 = 2, S_31 = ReLU(-1) = 0, S_32 = 0.5, and
    S_41, S_42, S_43 act on no later query. F_ij = sum_{k < i} S_kj: F_31 = S_21 = 2; F_41 = S_21 + S_31 = 2,
    F_42 = S_32 = 0.5; every other F is 0 (BOS, the token itself, the key just before the query)."""
    z = torch.zeros(1, 1, 5, 5, dtype=torch.float64)
    z[0, 0, 2, 1], z[0, 0, 3, 1], z[0, 0, 3, 2] = 2.0, -1.0, 0.5
    z[0, 0, 2, 0] = z[0, 0, 3, 0] = 7.0  # selecting BOS does nothing
    z[0, 0, 4, 0] = 3.0  # neither does the last query's selection
    expected = torch.zeros(5, 5, dtype=torch.float64)
    expected[3, 1], expected[4, 1], expected[4, 2] = 2.0, 2.0, 0.5
    assert torch.equal(selection_penalty_reference(z)[0], expected)
    p = selective_weights(z)[0, 0]
    e = [math.exp(x) for x in (3.0, -2.0, -0.5, 0.0, 0.0)]  # query 4: exp(z_4j - F_4j)
    torch.testing.assert_close(p[4], torch.tensor(e, dtype=torch.float64) / sum(e), rtol=1e-14, atol=0)
    e = [math.exp(x) for x in (7.0, -1.0 - 2.0, 0.5, 0.0)]  # query 3: F_31 = 2
    torch.testing.assert_close(p[3, :4], torch.tensor(e, dtype=torch.float64) / sum(e), rtol=1e-14, atol=0)


def test_the_fast_form_equals_the_reference():
    """The cumulative sum against the three loops: float64, one summation order apart, so 1e-12."""
    torch.manual_seed(0)
    z = torch.randn(2, 3, 9, 9, dtype=torch.float64) * 3
    penalty = selection_penalty(z)
    torch.testing.assert_close(penalty[:, 0], selection_penalty_reference(z), rtol=1e-12, atol=1e-12)
    keep = torch.ones(9, 9, dtype=torch.bool).tril()
    fast = torch.softmax(select_logits(z).masked_fill(~keep, float("-inf")), dim=-1)
    torch.testing.assert_close(fast, selective_weights(z), rtol=1e-12, atol=1e-14)
    masked = z.masked_fill(~keep, float("-inf"))  # the paper takes S after the causal mask: the same F
    torch.testing.assert_close(selection_penalty(masked), penalty, rtol=0, atol=0)
    with pytest.raises(ValueError, match="T = S"):
        selection_penalty(z[:, :, 1:])


def _softmax(z: torch.Tensor) -> torch.Tensor:
    """The plain softmax in the logits' dtype: x-transformers' default computes it in float32 whatever the input,
    which would cap the comparison at ~1e-7; its selection step is unchanged by this."""
    return torch.softmax(z, dim=-1)


def _pair(n_kv_head: int, seed: int = 1):
    """An attnlab layer and an x-transformers layer with the same weights, float64. x-transformers gives query head
    h' the K/V head h' % n_kv (heads repeated as (r kvh)), attnlab gives head h the K/V head h // r: attnlab head
    g r + m is x-transformers head m n_kv + g (head 0 is head 0 in both, the selecting head)."""
    torch.manual_seed(seed)
    ours = Attention(AttentionConfig(n_head=N_HEAD, n_kv_head=n_kv_head, bias=False, dropout=0.0, selective=True),
                     N_EMBD).double()
    d, r = N_EMBD // N_HEAD, N_HEAD // n_kv_head
    oracle = OracleAttention(N_EMBD, heads=N_HEAD, dim_head=d, kv_heads=n_kv_head, causal=True, selective=True,
                             custom_attn_fn=_softmax).double()
    order = [(h % r) * n_kv_head + h // r for h in range(N_HEAD)]  # attnlab head h -> x-transformers head order[h]
    with torch.no_grad():
        for module in (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj):
            module.weight.mul_(2.0)  # larger logits, so that ReLU passes many selection scores
        wq, wo = ours.q_proj.weight.unflatten(0, (N_HEAD, d)), ours.out_proj.weight.unflatten(1, (N_HEAD, d))
        oracle.to_q.weight.copy_(torch.stack([wq[order.index(g)] for g in range(N_HEAD)]).flatten(0, 1))
        oracle.to_out.weight.copy_(torch.stack([wo[:, order.index(g)] for g in range(N_HEAD)], 1).flatten(1))
        oracle.to_k.weight.copy_(ours.k_proj.weight)
        oracle.to_v.weight.copy_(ours.v_proj.weight)
    return ours, oracle


@pytest.mark.parametrize("n_kv_head", [N_HEAD, 2, 1])  # MHA, GQA, MQA
def test_the_layer_equals_x_transformers(n_kv_head):
    """Output and input gradient to 1e-12 / 1e-10 (float64; the two differ in summation order and in the masked
    value, -inf here and -finfo.max there, whose exp is 0 in both). The selection must matter here: the same layer
    without it differs by far more than the tolerance, so the comparison can fail."""
    ours, oracle = _pair(n_kv_head)
    x = torch.randn(2, 12, N_EMBD, dtype=torch.float64, requires_grad=True)
    y, expected = ours(x), oracle(x)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    (g_ours,) = torch.autograd.grad((y * torch.cos(y)).sum(), x)
    (g_oracle,) = torch.autograd.grad((expected * torch.cos(expected)).sum(), x)
    torch.testing.assert_close(g_ours, g_oracle, rtol=1e-10, atol=1e-10)
    plain = Attention(ours.config.replace(selective=False), N_EMBD).double()
    plain.load_state_dict(ours.state_dict())
    assert (plain(x) - y).abs().max() > 1e-3


def test_the_layer_computes_the_reference_weights():
    """The explicit path's weights against the float64 loops on the layer's own logits (GQA, RoPE-free); 1e-12."""
    ours, _ = _pair(2)
    x = torch.randn(2, 10, N_EMBD, dtype=torch.float64)
    q, k, _v = ours.project(x)
    z = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    out = ours.run(x, return_weights=True)
    torch.testing.assert_close(out.weights, selective_weights(z), rtol=1e-12, atol=1e-14)


def test_the_first_queries_are_plain_softmax():
    """F_ij > 0 needs 0 < j < k < i, so queries 0..2 get softmax's weights exactly; query 0 keeps its one key."""
    ours, _ = _pair(N_HEAD)
    plain = Attention(ours.config.replace(selective=False), N_EMBD).double()
    plain.load_state_dict(ours.state_dict())
    x = torch.randn(1, 8, N_EMBD, dtype=torch.float64)
    w, w_plain = ours.run(x, return_weights=True).weights, plain.run(x, return_weights=True).weights
    assert torch.equal(w[..., :3, :], w_plain[..., :3, :])
    assert (w[..., 0, 0] == 1).all()
    assert (w[..., 3:, :] - w_plain[..., 3:, :]).abs().max() > 1e-3


def test_near_duplicate_keys_stay_finite():
    """Eight near-copies of one token with large logits: a large F on most keys, never on BOS or the query's own
    key, so every row keeps mass; output, weights and gradients finite, rows summing to 1 (float32, the dtype of
    training)."""
    ours, _ = _pair(2)
    ours = ours.float()
    with torch.no_grad():
        ours.q_proj.weight.mul_(30.0)
    x = torch.randn(1, 1, N_EMBD).expand(2, 8, N_EMBD).clone()
    x = (x + 1e-6 * torch.randn_like(x)).requires_grad_()
    out = ours.run(x, return_weights=True)
    assert torch.isfinite(out.y).all() and torch.isfinite(out.weights).all()
    torch.testing.assert_close(out.weights.sum(-1), torch.ones(2, N_HEAD, 8), rtol=0, atol=1e-5)
    out.y.square().sum().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in ours.parameters())


def test_route_explicit_and_no_cache():
    how = route(AttentionConfig(selective=True))
    assert how.path == "explicit" and not how.cacheable
    model = GPT(GPTConfig(vocab_size=11, block_size=12, n_layer=2, n_head=2, n_embd=16, attention="selective")).eval()
    prompt = torch.randint(0, 11, (1, 3))
    assert model.generate(prompt, 4, temperature=0.0).shape == (1, 7)  # recomputes the prefix at every token
    one_line_error(lambda: model.generate(prompt, 4, use_cache=True), "selective attention")


@pytest.mark.parametrize("bad, fragments", [
    (dict(causal=False), ["attention.selective=true", "causal=False", "allowed: causal=true"]),
    (dict(normalizer="none"), ["attention.selective=true", "normalizer='none'"]),
    (dict(kernel="rbf"), ["attention.selective=true", "kernel='rbf'", "kernel='dot'"]),
    (dict(heads="talking"), ["attention.selective=true with heads.mix='talking'"]),
    (dict(heads="coda"), ["attention.selective=true with heads.mix='coda'"]),
    (dict(backend="sdpa"), ["attention.backend='sdpa' cannot compute", "selective=true"]),
    (dict(selective="yes"), ["attention.selective='yes' must be true or false"]),
])
def test_switches_that_do_not_compose_are_one_line_errors(bad, fragments):
    one_line_error(lambda: AttentionConfig(**{"selective": True, **bad}), *fragments)


def test_composes_with_moh_and_a_magnitude_prior():
    """Switches that do not rewrite the logits of every head run on the explicit path with the selection."""
    for extra in (dict(heads="moh"), dict(magnitude={"form": "causal", "apply": "logits"}),
                  dict(magnitude={"form": "prefix", "solver": "lowrank"})):
        cfg = AttentionConfig(n_head=N_HEAD, n_kv_head=N_HEAD, selective=True, **extra)
        assert route(cfg).path == "explicit"
        y = Attention(cfg, N_EMBD)(torch.randn(1, 6, N_EMBD))
        assert torch.isfinite(y).all()
