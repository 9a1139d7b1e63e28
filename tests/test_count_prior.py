"""The duplicate-count prior (attention.count_prior, variant count-prior): the counts against a loop over the
formula, the layer against float64 attention from the formula, a closed form, causality on sequences full of
duplicates, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import GPT, AttentionConfig, GPTConfig
from attnlab.config import MagnitudeConfig
from attnlab.mechanisms.count_prior.reference import count_log_prior
from attnlab.nn import Attention
from helpers import LEAK_TOL, attention_ref, max_leak, one_line_error


def counts_ref(row) -> np.ndarray:
    """c_ij = #{l <= i : x_l = x_j} for j <= i (0 above the diagonal), by loops over the formula."""
    t = len(row)
    c = np.zeros((t, t))
    for i in range(t):
        for j in range(i + 1):
            c[i, j] = sum(row[l] == row[j] for l in range(i + 1))
    return c


def test_counts_follow_the_formula():
    idx = torch.randint(0, 4, (3, 19), generator=torch.Generator().manual_seed(0))
    prior = count_log_prior(idx, torch.float64)
    assert prior.shape == (3, 1, 19, 19)
    for b in range(3):
        c = counts_ref(idx[b].tolist())
        below = np.tril(np.ones_like(c, dtype=bool))
        np.testing.assert_allclose(prior[b, 0].numpy()[below], -np.log(c[below]), rtol=0, atol=1e-15)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_the_layer_is_softmax_with_the_prior_in_float64(n_kv_head):
    torch.manual_seed(1)
    cfg = AttentionConfig(n_head=4, n_kv_head=n_kv_head, bias=True, dropout=0.0, count_prior=True)
    layer = Attention(cfg, 32).double().eval()
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    idx = torch.randint(0, 3, (2, 13))
    prior = count_log_prior(idx, torch.float64)
    with torch.no_grad():
        y, weights = layer(x, return_weights=True, count_prior=prior)
        q, k, v = layer.project(x)
    out, want = attention_ref(q, k, v, causal=True, attn_mask=prior.numpy())
    np.testing.assert_allclose(weights.numpy(), want, rtol=0, atol=1e-12)
    with torch.no_grad():
        want_y = layer.out_proj(torch.from_numpy(out).transpose(1, 2).flatten(-2))
        sdpa = layer(x, count_prior=prior)
    torch.testing.assert_close(y, want_y, rtol=0, atol=1e-12)
    torch.testing.assert_close(sdpa, y, rtol=0, atol=1e-12)  # the SDPA path (no weights asked) agrees


def test_with_equal_logits_each_distinct_token_gets_an_equal_share():
    """Closed form: with every logit equal (W_q = 0), p_ij = (1 / c_ij) / sum_l (1 / c_il) = 1 / (number of distinct
    tokens in 1..i) / c_ij, so every distinct token's copies together get 1 / distinct."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=6, block_size=12, n_layer=1, n_head=2, n_embd=16, attention="count-prior"))
    with torch.no_grad():
        model.blocks[0].attn.q_proj.weight.zero_()
        model.blocks[0].attn.q_proj.bias.zero_()
    idx = torch.tensor([[4, 4, 4, 1, 4, 2, 2, 4, 4, 4, 1, 0]])
    weights = model.attention_maps(idx)[0][0]  # [H, T, T]
    row = idx[0].tolist()
    for i in range(len(row)):
        seen = set(row[: i + 1])
        for token in seen:
            share = sum(float(weights[h, i, j]) for h in range(1) for j in range(i + 1) if row[j] == token)
            assert share == pytest.approx(1 / len(seen), abs=1e-6)


def test_no_leak_on_sequences_full_of_duplicates():
    torch.manual_seed(0)
    for vocab in (2, 3):  # with so few tokens every perturbation changes counts of earlier tokens' ids
        model = GPT(GPTConfig(vocab_size=vocab, block_size=16, n_layer=2, n_head=4, n_embd=32,
                              attention="count-prior"))
        assert max_leak(model) < LEAK_TOL


def test_the_count_prior_needs_the_whole_prefix_and_generates():
    model = GPT(GPTConfig(vocab_size=5, block_size=8, n_layer=1, n_head=2, n_embd=8, attention="count-prior"))
    assert not model.cache_exact
    out = model.generate(torch.zeros(1, 2, dtype=torch.long), 4, temperature=0.0)
    want = torch.zeros(1, 2, dtype=torch.long)
    for _ in range(4):  # greedy decoding by full recomputation, token by token
        want = torch.cat([want, model(want)[0][:, -1:].argmax(-1)], dim=1)
    assert torch.equal(out, want)


def test_composes_with_a_magnitude_logit_prior():
    torch.manual_seed(0)
    cfg = AttentionConfig(n_head=2, n_kv_head=2, bias=True, dropout=0.0, count_prior=True, magnitude=MagnitudeConfig("causal", apply="logits"))
    layer = Attention(cfg, 16).double().eval()
    x, idx = torch.randn(1, 9, 16, dtype=torch.float64), torch.randint(0, 3, (1, 9))
    prior = count_log_prior(idx, torch.float64)
    with torch.no_grad():
        _, weights = layer(x, return_weights=True, count_prior=prior)
        q, k, v = layer.project(x)
        magnitude = layer.magnitude(k).unsqueeze(-2)  # [B, Hkv, 1, S]: log max(w_j, floor), per key
    _, want = attention_ref(q, k, v, causal=True, attn_mask=(magnitude + prior).numpy())
    np.testing.assert_allclose(weights.numpy(), want, rtol=0, atol=1e-12)


def test_errors():
    one_line_error(lambda: AttentionConfig(count_prior=True, causal=False), "count_prior=true needs causal softmax",
                   "causal=False")
    one_line_error(lambda: AttentionConfig(count_prior=True, normalizer="none"), "normalizer='none'")
    one_line_error(lambda: AttentionConfig(count_prior="yes"), "attention.count_prior='yes' must be true or false")
    layer = Attention(AttentionConfig(n_head=2, n_kv_head=2, bias=True, dropout=0.0, count_prior=True), 8)
    one_line_error(lambda: layer(torch.randn(1, 4, 8)), "needs the token ids' count prior")
