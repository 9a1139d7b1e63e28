"""Scalable-Softmax (attention.ssmax, variant ssmax): the float64 reference against the authors' formula as the
`scalable-softmax` package computes it (an independent implementation), and the layer against the reference on
both attention paths, with a K/V cache, and on near-duplicate keys. The leak test (tests/test_causal_leak.py) and
the speed benchmark cover it as a registered variant."""

from __future__ import annotations

import math

import pytest
import torch
from scalable_softmax import ScalableSoftmax as OracleSSMax

from attnlab import GPT, AttentionConfig, ConfigError, GPTConfig
from attnlab.mechanisms.ssmax.reference import S_INIT, keys_seen, ssmax_weights
from attnlab.nn import Attention


@pytest.mark.parametrize("causal", [True, False])
def test_reference_equals_the_scalable_softmax_package(causal):
    torch.manual_seed(0)
    z = torch.randn(2, 3, 7, 7, dtype=torch.float64) * 3
    s = torch.tensor([0.5, 0.125, 1.75], dtype=torch.float64)  # exact in float32, which the package stores s in
    ours = ssmax_weights(z, s, causal=causal)
    for h in range(3):
        oracle = OracleSSMax(s=float(s[h]), learn_scaling=False).double()
        for i in range(7):
            seen = i + 1 if causal else 7  # the package scales by the log of the size it is given
            expected = oracle(z[:, h, i, :seen])
            torch.testing.assert_close(ours[:, h, i, :seen], expected, rtol=1e-12, atol=1e-14)  # float64 both
            assert (ours[:, h, i, seen:] == 0).all()


def test_keys_seen_counts_the_prefix_after_the_cache():
    assert keys_seen(3, 5, causal=True, offset=2).tolist() == [3.0, 4.0, 5.0]
    assert keys_seen(3, 5, causal=False).tolist() == [5.0, 5.0, 5.0]


def _layer(**kw) -> Attention:
    torch.manual_seed(1)
    cfg = AttentionConfig(n_head=4, n_kv_head=2, bias=True, dropout=0.0, ssmax=True, **kw)
    layer = Attention(cfg, 32).double()
    with torch.no_grad():
        layer.ssmax.s.copy_(torch.tensor([0.43, 0.2, 0.9, 1.5]))
    return layer


@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_computes_the_reference_on_both_paths(causal):
    layer = _layer(causal=causal)
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    q, k, v = layer.project(x)
    k = k.repeat_interleave(2, dim=1)
    z = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    expected = ssmax_weights(z, layer.ssmax.s.detach(), causal=causal)
    explicit = layer.run(x, return_weights=True)
    torch.testing.assert_close(explicit.weights, expected, rtol=1e-10, atol=1e-12)  # float64, one rounding order apart
    sdpa = layer.run(x)  # no weights asked: the SDPA path, with the scale folded into q
    torch.testing.assert_close(sdpa.y, explicit.y, rtol=1e-10, atol=1e-12)


def test_the_first_query_keeps_its_one_key_and_near_duplicates_stay_finite():
    layer = _layer()
    x = torch.randn(1, 6, 32, dtype=torch.float64).expand(1, 6, 32).clone()
    x[:, 1:] = x[:, :1] + 1e-9 * torch.randn(1, 5, 32, dtype=torch.float64)  # near-duplicate tokens
    out = layer.run(x, return_weights=True)
    assert torch.isfinite(out.y).all() and torch.isfinite(out.weights).all()
    torch.testing.assert_close(out.weights[..., 0, 0], torch.ones(1, 4, dtype=torch.float64))  # n = 1: log 1 = 0


def test_generation_with_the_cache_equals_recomputation():
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, attention="ssmax")).eval()
    prompt = torch.randint(0, 11, (2, 3))
    cached = model.generate(prompt, 9, temperature=0.0, use_cache=True)
    full = model.generate(prompt, 9, temperature=0.0, use_cache=False)
    assert torch.equal(cached, full)


def test_s_starts_at_the_papers_value_and_learns():
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=8, attention="ssmax"))
    s = model.blocks[0].attn.ssmax.s
    assert s.tolist() == pytest.approx([S_INIT, S_INIT]) and s.requires_grad
    idx = torch.randint(0, 11, (2, 8))
    model(idx, idx)[1].backward()
    assert s.grad is not None and s.grad.abs().sum() > 0


@pytest.mark.parametrize("bad, message", [
    (dict(kernel="rbf"), "attention.ssmax=true scales dot-product logits inside a softmax; got kernel='rbf'"),
    (dict(normalizer="none"), "normalizer='none' (allowed: kernel='dot', normalizer='softmax')"),
])
def test_switches_that_do_not_compose_are_one_line_errors(bad, message):
    with pytest.raises(ConfigError, match=re_escape(message)):
        AttentionConfig(ssmax=True, **bad)
    with pytest.raises(ConfigError, match="attention.ssmax='yes' must be true or false"):
        AttentionConfig(ssmax="yes")


def re_escape(text: str) -> str:
    import re

    return re.escape(text)
