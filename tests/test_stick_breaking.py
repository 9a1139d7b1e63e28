"""Stick-breaking attention (normalizer "stickbreaking", variant stick-breaking): the log-space attention path against
closed forms and against the float64 reference that breaks the stick key by key (attnlab.mechanisms.stick_breaking.
reference, a product loop written without the cumulative sum), the layer with grouped K/V heads, gradients
(gradcheck, and against the reference's), extreme logits, near-duplicate keys, a long row, the K/V cache and the
errors. The authors' package needs CUDA and Triton and is not on PyPI, so it is not an oracle here.
tests/test_causal_leak.py checks the variant for leaks from the future."""

from __future__ import annotations

import math

import pytest
import torch

from attnlab import GPT, AttentionConfig, GPTConfig
from attnlab.attention_config import route
from attnlab.experiments.leaderboard import family
from attnlab.functional.attention import attention
from attnlab.mechanisms.stick_breaking.functional import own_position, stick_breaking
from attnlab.mechanisms.stick_breaking.reference import stick_breaking_weights
from attnlab.nn import Attention
from helpers import extreme_logit_inputs, one_line_error


def _equal_logits(z: float, t: int, s: int, dtype=torch.float64):
    """Every logit z: with b = sigmoid(z), query i at position p = s - t + i gives key j < p the weight
    b (1 - b)^(p - 1 - j) and keeps (1 - b)^p on its own value; computed in log space in float64."""
    log_b, log_rest = math.log(1 / (1 + math.exp(-z))), math.log(1 / (1 + math.exp(z)))
    out = torch.zeros(1, 1, t, s, dtype=torch.float64)
    for i in range(t):
        p = s - t + i
        shares = [math.exp(log_b + (p - 1 - j) * log_rest) for j in range(p)]
        out[0, 0, i, :p] = torch.tensor(shares, dtype=torch.float64)
        out[0, 0, i, p] = math.exp(p * log_rest)
    return out.to(dtype)


def test_closed_forms():
    expected = _equal_logits(0.7, 5, 5)
    z = torch.full((1, 1, 5, 5), 0.7, dtype=torch.float64)
    keep = torch.ones(5, 5, dtype=torch.bool).tril()
    torch.testing.assert_close(stick_breaking(z, keep), expected, rtol=1e-14, atol=1e-15)  # float64 roundings
    torch.testing.assert_close(stick_breaking_weights(z), expected, rtol=1e-14, atol=1e-15)
    # two earlier keys, the nearer first: beta_1 = sigmoid(z_1) of the stick, then beta_0 of what is left
    z = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0], [math.log(3), math.log(1 / 3), 5.0]], dtype=torch.float64)
    row = stick_breaking(z.view(1, 1, 3, 3), torch.ones(3, 3, dtype=torch.bool).tril())[0, 0, 2]
    torch.testing.assert_close(row, torch.tensor([0.75 * 0.75, 0.25, 0.75 * 0.25], dtype=torch.float64),
                               rtol=1e-15, atol=1e-15)  # z_22 = 5, the query's own logit, is never used


@pytest.mark.parametrize("t, s", [(6, 6), (3, 7)])
def test_attention_equals_the_reference(t, s):
    """Random logits spread over about [-6, 6], with a K/V cache when s > t: the weights to 1e-12 (float64; the
    cumulative sum and the product loop round differently) and the output to the reference weights times v."""
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, t, 8, dtype=torch.float64) * 1.5, torch.randn(2, 2, s, 8, dtype=torch.float64), \
        torch.randn(2, 2, s, 5, dtype=torch.float64)
    out, weights = attention(q, k, v, causal=True, normalizer=stick_breaking, return_weights=True)
    expected = stick_breaking_weights(q @ k.repeat_interleave(2, 1).transpose(-1, -2) / math.sqrt(8))
    torch.testing.assert_close(weights, expected, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(out, expected @ v.repeat_interleave(2, 1), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 4, t, dtype=torch.float64), rtol=0, atol=1e-14)


def test_a_hidden_key_takes_no_share():
    """A boolean mask that hides key 1 gives what attention over the other keys gives (float64, to 1e-13)."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 5, 4, dtype=torch.float64) * 2 for _ in range(3))
    seen = torch.ones(5, dtype=torch.bool)
    seen[1] = False
    masked = attention(q, k, v, causal=True, normalizer=stick_breaking, attn_mask=seen)
    dropped = attention(q[:, :, seen], k[:, :, seen], v[:, :, seen], causal=True, normalizer=stick_breaking)
    torch.testing.assert_close(masked[:, :, seen], dropped, rtol=1e-13, atol=1e-14)


def test_the_layer_with_grouped_heads_computes_the_reference():
    torch.manual_seed(2)
    cfg = AttentionConfig(n_head=4, n_kv_head=2, bias=True, dropout=0.0, normalizer="stickbreaking")
    layer = Attention(cfg, 32).double()
    x = torch.randn(2, 9, 32, dtype=torch.float64) * 2
    q, k, v = layer.project(x)
    k, v = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)  # GQA: query head h reads K/V head h // 2
    expected = stick_breaking_weights(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]))
    out = layer.run(x, return_weights=True)
    torch.testing.assert_close(out.weights, expected, rtol=1e-10, atol=1e-12)  # float64, one rounding order apart
    torch.testing.assert_close(out.y, layer.out_proj((expected @ v).transpose(1, 2).flatten(-2)), rtol=1e-10,
                               atol=1e-12)
    torch.testing.assert_close(layer.run(x).y, out.y, rtol=0, atol=0)  # with or without weights: one path


def test_gradients():
    """gradcheck (finite differences, float64, its default tolerances) on the attention path at a small shape with
    grouped heads, and the path's gradients equal those of the product loop (autograd through it) to 1e-10."""
    torch.manual_seed(3)
    q = (torch.randn(1, 2, 4, 3, dtype=torch.float64) * 2).requires_grad_()
    k = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 1, 4, 3, dtype=torch.float64, requires_grad=True)
    fn = lambda a, b, c: attention(a, b, c, causal=True, normalizer=stick_breaking)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (q, k, v))
    g = torch.randn(1, 2, 4, 3, dtype=torch.float64)
    ours = torch.autograd.grad((fn(q, k, v) * g).sum(), (q, k, v))
    kk, vv = k.expand(1, 2, 4, 3), v.expand(1, 2, 4, 3)
    ref = stick_breaking_weights(q @ kk.transpose(-1, -2) / math.sqrt(3)) @ vv
    theirs = torch.autograd.grad((ref * g).sum(), (q, k, v))
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("sign", [1.0, -1.0, 0.0])
def test_extreme_logits_and_near_duplicate_keys_stay_finite_in_float32(sign):
    """Logits of +-80 in float32 on keys that differ by 1e-6: output and gradients finite, rows summing to 1 (to
    1e-6, float32). At -80 every key takes e^-80 of the stick and the query keeps its own value; at +80 the nearest
    key takes it all. sign 0 alternates +80 and -80 along the keys."""
    t = 8
    q, k, v = extreme_logit_inputs(sign, t)
    out, weights = attention(q, k, v, causal=True, scale=1.0, normalizer=stick_breaking, return_weights=True)
    out.sum().backward()
    assert all(torch.isfinite(x).all() for x in (out, weights, q.grad, k.grad, v.grad))
    torch.testing.assert_close(weights.sum(-1), torch.ones(1, 1, t), rtol=0, atol=1e-6)
    if sign < 0:
        torch.testing.assert_close(weights[0, 0], torch.eye(t), rtol=0, atol=1e-6)
    if sign > 0:
        torch.testing.assert_close(weights[0, 0, 1:], torch.eye(t)[:-1], rtol=0, atol=1e-6)


def test_a_long_row_in_float32_matches_the_closed_form():
    """512 keys at z = -2 (each takes 12% of the stick): float32 weights against the closed form to 1e-5 relative;
    in log space nothing underflows before the true weight does."""
    z = torch.full((1, 1, 512, 512), -2.0)
    weights = stick_breaking(z, torch.ones(512, 512, dtype=torch.bool).tril())
    torch.testing.assert_close(weights, _equal_logits(-2.0, 512, 512, torch.float32), rtol=1e-5, atol=1e-30)


def test_the_first_query_keeps_its_own_value():
    torch.manual_seed(4)
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64) for _ in range(3))
    out, weights = attention(q, k, v, causal=True, normalizer=stick_breaking, return_weights=True)
    assert weights[0, :, 0].tolist() == [[1.0, 0.0, 0.0, 0.0]] * 2 and torch.equal(out[:, :, 0], v[:, :, 0])
    assert own_position(2, 4).nonzero().tolist() == [[0, 2], [1, 3]]  # after 2 cached keys


def test_explicit_path_cache_and_variant():
    cfg = AttentionConfig(normalizer="stickbreaking")
    assert route(cfg).path == "explicit" and route(cfg).cacheable
    torch.manual_seed(5)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, attention="stick-breaking",
                          pos_encoding="none")).eval()
    prompt = torch.randint(0, 11, (2, 3))
    assert torch.equal(model.generate(prompt, 9, temperature=0.0, use_cache=True),
                       model.generate(prompt, 9, temperature=0.0, use_cache=False))
    assert family("stick-breaking") == "dilution"
    q, k, v = (torch.randn(1, 1, 4, 2, dtype=torch.float64) for _ in range(3))
    torch.testing.assert_close(attention(q, k, v, normalizer=stick_breaking),  # causal by construction
                               attention(q, k, v, causal=True, normalizer=stick_breaking), rtol=0, atol=0)
    with pytest.raises(ValueError, match="normalizer='stickbreaking': attention.. computes softmax and none itself"):
        attention(q, k, v, causal=True, normalizer="stickbreaking")


@pytest.mark.parametrize("bad, patterns", [
    (dict(causal=False), ["normalizer='stickbreaking' needs causal=true", "causal=False"]),
    (dict(kernel="rbf"), ["normalizer='stickbreaking' needs kernel='dot'", "kernel='rbf'"]),
    (dict(mask_form="renormalize"), ["normalizer='stickbreaking' needs mask_form='additive'", "'renormalize'"]),
    (dict(backend="sdpa"), ["backend='sdpa' cannot compute", "normalizer='stickbreaking'"]),
    (dict(count_prior=True), ["count_prior=true needs causal softmax", "normalizer='stickbreaking'"]),
    (dict(magnitude={"form": "causal", "apply": "logits"}), ["apply='logits'", "normalizer='stickbreaking'"]),
    (dict(ssmax=True), ["ssmax=true", "normalizer='stickbreaking'"]),
])
def test_switches_that_do_not_compose_are_one_line_errors(bad, patterns):
    one_line_error(lambda: AttentionConfig(normalizer="stickbreaking", **bad), *patterns)
