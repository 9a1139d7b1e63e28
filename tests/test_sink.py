"""A learned attention sink (attention.sink, variant sink): the float64 reference p_ij = exp(z_ij) / (exp(s_h) +
sum_k exp(z_ik)) against x-transformers' Attention with head_learned_sink (an independent implementation: a column
of s_h concatenated before its softmax and dropped after), the layer against both on the explicit path (weights)
and the SDPA path (a zero key with s_h in a float mask), GQA, a K/V cache with learned sinks, the first query in
closed form, near-duplicate keys, gradients, and the errors. The leak test covers it as a registered variant."""

from __future__ import annotations

import math
import re

import pytest
import torch

from attnlab import GPT, AttentionConfig, ConfigError, GPTConfig
from attnlab.attention_config import route
from attnlab.functional import attention
from attnlab.mechanisms.sink.reference import sink_weights
from attnlab.nn import Attention
from xt_oracle import N_EMBD, twins

TOL = dict(rtol=1e-10, atol=1e-12)  # float64 on both sides, sums in another order: ~1e-15 relative; margin kept


@pytest.mark.parametrize("n_kv_head", [4, 2])  # MHA, GQA
@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_and_the_reference_equal_x_transformers_learned_sink(n_kv_head, causal):
    oracle, ours, perm = twins(n_kv_head, causal, head_learned_sink=True)
    x = torch.randn(2, 9, N_EMBD, dtype=torch.float64)
    expected, inter = oracle(x, return_intermediates=True)
    oracle_weights = inter.post_softmax_attn[:, perm, :, 1:]  # x-transformers' sink is column 0; our head order
    explicit = ours.run(x, return_weights=True)
    torch.testing.assert_close(explicit.weights, oracle_weights, **TOL)
    torch.testing.assert_close(explicit.y, expected, **TOL)
    torch.testing.assert_close(ours(x), expected, **TOL)  # the SDPA path
    q, k, _ = ours.project(x)
    z = q @ k.repeat_interleave(4 // n_kv_head, dim=1).transpose(-1, -2) / math.sqrt(q.shape[-1])
    torch.testing.assert_close(sink_weights(z, ours.sink.logit.detach(), causal=causal), oracle_weights, **TOL)


def test_the_reference_is_softmax_without_a_sink_and_leaves_the_sinks_share_out():
    z = torch.randn(1, 2, 5, 5, dtype=torch.float64) * 3
    far = sink_weights(z, torch.tensor([-800.0, -800.0]), causal=True)  # exp(-800) = 0 in float64: no sink
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(far, z.masked_fill(~causal, float("-inf")).softmax(-1), rtol=1e-14, atol=1e-15)
    s = torch.tensor([0.5, -1.0], dtype=torch.float64)
    p = sink_weights(z, s, causal=True)
    lse = z.masked_fill(~causal, float("-inf")).logsumexp(-1)  # log sum_k exp(z_ik)
    torch.testing.assert_close(1 - p.sum(-1), torch.sigmoid(s.view(1, 2, 1) - lse), rtol=1e-12, atol=1e-14)


def _layer(causal=True, **kw) -> Attention:
    torch.manual_seed(1)
    cfg = AttentionConfig(n_head=4, n_kv_head=2, bias=True, dropout=0.0, sink=True, causal=causal, **kw)
    layer = Attention(cfg, N_EMBD).double()
    with torch.no_grad():
        layer.sink.logit.copy_(torch.tensor([1.5, -0.5, 0.0, 3.0]))
    return layer


@pytest.mark.parametrize("causal", [True, False])
def test_the_paths_agree_with_biases_and_a_logit_prior(causal):
    """With q/k/v biases and a per-(i, j) additive prior (a float mask folded into the same SDPA mask)."""
    layer = _layer(causal)
    q, k, v = (torch.randn(2, h, 7, 8, dtype=torch.float64) for h in (4, 2, 2))
    prior = torch.randn(2, 2, 7, 7, dtype=torch.float64)
    s = layer.sink.logit.detach()
    kw = dict(causal=causal, logit_prior=prior, sink=s)
    y_sdpa = attention(q, k, v, backend="sdpa", **kw)
    y, w = attention(q, k, v, backend="explicit", return_weights=True, **kw)
    z = q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) / math.sqrt(8) + prior.repeat_interleave(2, dim=1)
    expected = sink_weights(z, s, causal=causal)
    torch.testing.assert_close(w, expected, **TOL)
    torch.testing.assert_close(y, expected @ v.repeat_interleave(2, dim=1), **TOL)
    torch.testing.assert_close(y_sdpa, y, **TOL)


def test_sdpa_after_a_cache_and_with_a_padding_mask():
    """S > T (queries after 5 cached keys) and a boolean mask that hides every key of one query: the sink still
    takes that row's mass (output 0, no NaN) on both paths."""
    q, k, v = torch.randn(1, 2, 3, 8, dtype=torch.float64), *torch.randn(2, 1, 2, 8, 8, dtype=torch.float64)
    s = torch.tensor([0.3, -2.0], dtype=torch.float64)
    mask = torch.ones(3, 8, dtype=torch.bool)
    mask[1] = False
    y_sdpa = attention(q, k, v, causal=True, sink=s, attn_mask=mask, backend="sdpa")
    y = attention(q, k, v, causal=True, sink=s, attn_mask=mask, backend="explicit")
    torch.testing.assert_close(y_sdpa, y, **TOL)
    assert torch.isfinite(y).all() and (y[:, :, 1] == 0).all()
    expected = sink_weights(q @ k.transpose(-1, -2) / math.sqrt(8), s, causal=True) @ v
    torch.testing.assert_close(y[:, :, [0, 2]], expected[:, :, [0, 2]], **TOL)


def test_the_first_query_in_closed_form():
    """Query 0 sees key 0 and the sink: p_00 = exp(z_00) / (exp(s) + exp(z_00)) = sigmoid(z_00 - s), o_0 = p_00 v_0."""
    layer = _layer()
    x = torch.randn(1, 4, N_EMBD, dtype=torch.float64)
    out = layer.run(x, return_weights=True)
    q, k, v = layer.project(x)
    z00 = (q[:, :, 0] * k.repeat_interleave(2, dim=1)[:, :, 0]).sum(-1) / math.sqrt(8)  # [1, H]
    p00 = torch.sigmoid(z00 - layer.sink.logit.detach())
    torch.testing.assert_close(out.weights[:, :, 0, 0], p00, rtol=1e-12, atol=1e-14)
    o0 = p00.unsqueeze(-1) * v.repeat_interleave(2, dim=1)[:, :, 0]  # [1, H, d]
    torch.testing.assert_close(out.y[:, 0], layer.out_proj(o0.flatten(-2)), rtol=1e-12, atol=1e-14)
    assert (out.weights.sum(-1) < 1).all()


@pytest.mark.parametrize("sink", [0.0, 60.0, -60.0])
def test_near_duplicate_keys_and_extreme_sinks_stay_finite(sink):
    layer = _layer()
    with torch.no_grad():
        layer.sink.logit.fill_(sink)
        layer.q_proj.weight.mul_(30)  # logits in the hundreds
    x = torch.randn(1, 1, N_EMBD, dtype=torch.float64).expand(1, 6, N_EMBD).clone()
    x[:, 1:] += 1e-9 * torch.randn(1, 5, N_EMBD, dtype=torch.float64)  # near-duplicate tokens
    for y in (layer(x), layer.run(x, return_weights=True).y, layer.float()(x.float())):
        assert torch.isfinite(y).all()
        layer.double()


def test_the_sink_learns_on_both_paths_with_the_same_gradient():
    layer = _layer()
    x = torch.randn(2, 6, N_EMBD, dtype=torch.float64)
    grads = []
    for weights in (False, True):  # SDPA, explicit
        layer.zero_grad()
        layer.run(x, return_weights=weights).y.square().sum().backward()
        grads.append(layer.sink.logit.grad.clone())
    assert grads[0].abs().min() > 0
    torch.testing.assert_close(grads[0], grads[1], **TOL)


def test_generation_with_the_cache_equals_recomputation_with_learned_sinks():
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, attention="sink",
                          pos_encoding="rope")).double().eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.sink.logit.copy_(torch.randn(2) * 2)
    assert model.cache_exact and route(model.blocks[0].attn.config).path == "sdpa"
    idx = torch.randint(0, 11, (2, 12))
    cache = model.new_cache()
    pieces = [model(idx[:, :5], cache=cache)[0], model(idx[:, 5:6], cache=cache)[0], model(idx[:, 6:], cache=cache)[0]]
    torch.testing.assert_close(torch.cat(pieces, 1), model(idx)[0], rtol=1e-10, atol=1e-10)  # float64, sum order
    prompt = idx[:, :3]
    assert torch.equal(model.generate(prompt, 9, temperature=0.0, use_cache=True),
                       model.generate(prompt, 9, temperature=0.0, use_cache=False))


def test_the_sink_starts_at_zero():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, attention="sink"))
    assert model.blocks[0].attn.sink.logit.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("bad, message", [
    (dict(kernel="rbf"), "attention.sink=true adds a key with logit s_h to a dot-product softmax; got kernel='rbf'"),
    (dict(normalizer="none"), "normalizer='none', mask_form='additive' (allowed: kernel='dot', normalizer='softmax', "
                              "mask_form='additive')"),
    (dict(mask_form="renormalize"), "mask_form='renormalize' (allowed"),
])
def test_switches_that_do_not_compose_are_one_line_errors(bad, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        AttentionConfig(sink=True, **bad)
    with pytest.raises(ConfigError, match="^attention.sink='yes' must be true or false$"):
        AttentionConfig(sink="yes")
