"""Softpick (normalizer "softpick", variant softpick): the attention path against closed forms and against the float64
reference written from the paper's formula (attnlab.mechanisms.softpick.reference, unshifted, a row at a time), the
layer with grouped K/V heads, gradients (gradcheck, and against the reference's), extreme logits, near-duplicate
keys, the K/V cache and the errors. No installable implementation exists to compare with (the authors publish
kernels to read, not a package). tests/test_causal_leak.py checks the variant for leaks from the future."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import GPT, AttentionConfig, GPTConfig
from attnlab.attention_config import route
from attnlab.experiments.leaderboard import family
from attnlab.functional.attention import attention
from attnlab.mechanisms.softpick.functional import EPS, softpick
from attnlab.mechanisms.softpick.reference import softpick_weights
from attnlab.nn import Attention
from helpers import extreme_logit_inputs, one_line_error


def test_closed_forms():
    # e^z - 1 = [2, 1, -1/2, 0]: weights 2/3.5 and 1/3.5 on the first two keys, 0 elsewhere; the row sums to 3/3.5
    z = torch.tensor([3.0, 2.0, 0.5, 1.0], dtype=torch.float64).log().view(1, 1, 1, 4)
    expected = torch.tensor([2 / 3.5, 1 / 3.5, 0.0, 0.0], dtype=torch.float64).view(1, 1, 1, 4)
    torch.testing.assert_close(softpick(z, eps=0.0), expected, rtol=1e-15, atol=1e-15)  # float64, a few roundings
    torch.testing.assert_close(softpick_weights(z, causal=False, eps=0.0), expected, rtol=1e-15, atol=1e-15)
    # every logit <= 0: no key takes any weight
    assert (softpick(-torch.rand(1, 1, 3, 5, dtype=torch.float64)) == 0).all()
    # one key at z = log 2: after the shift m = log 2 the row is (1 - 1/2) / (1/2 + eps) = 1 / (1 + 2 eps), eps after
    # the shift as in the paper's stable form (the reference writes it as eps e^m before the shift)
    one = torch.tensor(2.0, dtype=torch.float64).log().view(1, 1, 1, 1)
    for weights in (softpick(one), softpick_weights(one, causal=False)):
        assert weights.item() == pytest.approx(1 / (1 + 2 * EPS), rel=1e-15)


@pytest.mark.parametrize("causal, t, s", [(True, 6, 6), (True, 3, 7), (False, 5, 6)])
def test_attention_equals_the_reference(causal, t, s):
    """Random logits spread over [-6, 6], with a K/V cache when s > t: the weights to 1e-12 (float64; the shifted
    and the unshifted form differ by rounding only) and the output to the reference weights times v."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, t, 8, dtype=torch.float64) * 1.5, torch.randn(2, 2, s, 8, dtype=torch.float64), \
        torch.randn(2, 2, s, 5, dtype=torch.float64)
    out, weights = attention(q, k, v, causal=causal, normalizer=softpick, return_weights=True)
    z = q @ k.repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8)
    expected = softpick_weights(z, causal=causal)
    torch.testing.assert_close(weights, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out, expected @ v.repeat_interleave(2, 1), rtol=1e-12, atol=1e-14)
    assert (weights.sum(-1) <= 1 + 1e-12).all() and (weights.sum(-1) < 0.999).any()  # no mass is forced


def test_a_hidden_key_is_in_neither_sum():
    """A boolean mask that hides key 2 gives what attention over the other keys gives (float64, to 1e-13)."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) * 2 for _ in range(3))
    seen = torch.ones(5, dtype=torch.bool)
    seen[2] = False
    masked = attention(q, k, v, normalizer=softpick, attn_mask=seen)
    dropped = attention(q, k[:, :, seen], v[:, :, seen], normalizer=softpick)
    torch.testing.assert_close(masked, dropped, rtol=1e-13, atol=1e-14)


def _layer(**kw) -> Attention:
    torch.manual_seed(2)
    cfg = AttentionConfig(n_head=4, n_kv_head=2, bias=True, dropout=0.0, normalizer="softpick", **kw)
    return Attention(cfg, 32).double()


@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_with_grouped_heads_computes_the_reference(causal):
    layer = _layer(causal=causal)
    x = torch.randn(2, 9, 32, dtype=torch.float64) * 2
    q, k, v = layer.project(x)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # GQA: query head h reads K/V head h // 2
    expected = softpick_weights(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), causal=causal)
    out = layer.run(x, return_weights=True)
    torch.testing.assert_close(out.weights, expected, rtol=1e-10, atol=1e-12)  # float64, one rounding order apart
    y = layer.out_proj((expected @ v).transpose(1, 2).flatten(-2))
    torch.testing.assert_close(out.y, y, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(layer.run(x).y, out.y, rtol=0, atol=0)  # with or without weights: one path


def test_gradients():
    """gradcheck (finite differences, float64, its default tolerances) on the attention path at a small shape with
    grouped heads, and the path's gradients equal those of the reference formula (autograd through the row loop)
    to 1e-10."""
    torch.manual_seed(3)
    q = (torch.randn(1, 2, 4, 3, dtype=torch.float64) * 2).requires_grad_()
    k = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b, c: attention(a, b, c, causal=True, normalizer=softpick), (q, k, v))
    g = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    ours = torch.autograd.grad((attention(q, k, v, causal=True, normalizer=softpick) * g).sum(), (q, k, v))
    kk, vv = k.expand(1, 2, 4, 3), v.expand(1, 2, 4, 3)
    ref = softpick_weights(q @ kk.transpose(-1, -2) / math.sqrt(3), causal=True) @ vv
    theirs = torch.autograd.grad((ref * g).sum(), (q, k, v))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sign", [1.0, -1.0, 0.0])
def test_extreme_logits_and_near_duplicate_keys_stay_finite_in_float32(sign):
    """Logits of +-80 in float32 (e^80 ~ 5.5e34, near float32's limit when squared in a derivative) on keys that
    differ by 1e-6: the output and the gradients are finite. sign 0 alternates +80 and -80 along the keys."""
    t = 8
    q, k, v = extreme_logit_inputs(sign, t)
    out, weights = attention(q, k, v, causal=True, scale=1.0, normalizer=softpick, return_weights=True)
    out.sum().backward()
    assert all(torch.isfinite(x).all() for x in (out, weights, q.grad, k.grad, v.grad))
    if sign < 0:
        assert (weights == 0).all() and (out == 0).all()  # every logit -80: no key is picked


def test_the_first_query_sees_one_key():
    """Query 0 sees key 0 only: weight (e^z - 1) / (e^z - 1 + eps e^z) when z > 0, and 0 when z <= 0."""
    v = torch.randn(1, 1, 3, 2, dtype=torch.float64)
    for z in (2.0, -1.0):
        q, k = torch.full((1, 1, 3, 1), z, dtype=torch.float64), torch.ones(1, 1, 3, 1, dtype=torch.float64)
        _, weights = attention(q, k, v, causal=True, scale=1.0, normalizer=softpick, return_weights=True)
        grown = math.exp(z) - 1
        expected = max(grown, 0.0) / (abs(grown) + EPS * math.exp(max(z, 0.0)))
        assert weights[0, 0, 0, 0].item() == pytest.approx(expected, rel=1e-14)


def test_explicit_path_cache_and_variant():
    cfg = AttentionConfig(normalizer="softpick")
    assert route(cfg) == route(cfg, return_weights=True) and route(cfg).path == "explicit" and route(cfg).cacheable
    one_line_error(lambda: AttentionConfig(normalizer="softpick", backend="sdpa"), "backend='sdpa' cannot compute",
                   "normalizer='softpick'")
    with pytest.raises(ValueError, match="backend='sdpa' cannot compute a normalizer other than 'softmax'"):
        attention(*(torch.randn(1, 1, 2, 2) for _ in range(3)), normalizer=softpick, backend="sdpa")
    torch.manual_seed(4)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, attention="softpick")).eval()
    prompt = torch.randint(0, 11, (2, 3))
    assert torch.equal(model.generate(prompt, 9, temperature=0.0, use_cache=True),
                       model.generate(prompt, 9, temperature=0.0, use_cache=False))
    assert family("softpick") == "dilution"


@pytest.mark.parametrize("bad, patterns", [
    (dict(kernel="rbf"), ["normalizer='softpick' needs kernel='dot'", "kernel='rbf'"]),
    (dict(mask_form="renormalize"), ["normalizer='softpick' needs mask_form='additive'", "'renormalize'"]),
    (dict(count_prior=True), ["count_prior=true needs causal softmax", "normalizer='softpick'"]),
    (dict(magnitude={"form": "causal", "apply": "logits"}), ["apply='logits'", "normalizer='softpick'"]),
    (dict(ssmax=True), ["ssmax=true", "normalizer='softpick'"]),
])
def test_switches_that_do_not_compose_are_one_line_errors(bad, patterns):
    one_line_error(lambda: AttentionConfig(normalizer="softpick", **bad), *patterns)
