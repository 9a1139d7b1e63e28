"""Gated attention (attention.output_gate, variant gated; Qiu et al. 2025, arXiv:2505.06708): the layer against
x-transformers' Attention with gate_values (an independent implementation of the same G1 elementwise sigmoid gate
of the layer's input on the attention output, before W_o), against the float64 reference with a gate bias (which
x-transformers lacks), with GQA, a K/V cache, near-duplicate keys and the first query; that the gate learns.
The leak test (tests/test_causal_leak.py) covers it as a registered variant."""

from __future__ import annotations

import pytest
import torch

from attnlab import GPT, AttentionConfig, ConfigError, GPTConfig
from attnlab.mechanisms.gated.reference import gated_output
from attnlab.nn import Attention
from xt_oracle import N_EMBD, twins


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])  # MHA, GQA, MQA
@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_equals_x_transformers_gated_values(n_kv_head, causal):
    oracle, ours, _ = twins(n_kv_head, causal, gate_values=True)
    x = torch.randn(2, 9, N_EMBD, dtype=torch.float64)
    expected = oracle(x)
    # float64 on both sides, the same sums in another order: agreement to ~1e-15 relative; 1e-10 leaves margin
    torch.testing.assert_close(ours(x), expected, rtol=1e-10, atol=1e-12)  # SDPA path
    torch.testing.assert_close(ours.run(x, return_weights=True).y, expected, rtol=1e-10, atol=1e-12)  # explicit


def _pair(**kw) -> tuple[Attention, Attention]:
    """A gated layer with a gate bias and no W_o (so y is concat_h o'_h), and its ungated twin (y = concat_h o_h)."""
    torch.manual_seed(1)
    cfg = AttentionConfig(n_head=4, n_kv_head=2, bias=True, dropout=0.0, output_gate=True,
                          projections=dict(out_proj=False), **kw)
    gated = Attention(cfg, N_EMBD).double()
    with torch.no_grad():
        for p in gated.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    plain = Attention(cfg.replace(output_gate=False), N_EMBD).double()
    plain.load_state_dict(gated.state_dict(), strict=False)
    return gated, plain


@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_computes_the_reference_with_a_gate_bias(causal):
    gated, plain = _pair(causal=causal)
    x = torch.randn(2, 7, N_EMBD, dtype=torch.float64)
    o = plain(x).unflatten(-1, (4, 8)).transpose(1, 2)  # [B, H, T, d], the heads' outputs before any gate
    gate = gated.output_gate.proj
    expected = gated_output(o, x, gate.weight.detach(), gate.bias.detach()).transpose(1, 2).flatten(-2)
    torch.testing.assert_close(gated(x), expected, rtol=1e-12, atol=1e-14)  # float64, one product apart


def test_the_gate_is_per_head_and_per_coordinate():
    """Gate logit h d + c gates coordinate c of head h and nothing else: with W_g = 0 and b = 0 every output is
    halved (sigmoid(0)), and a bias of -1e4 on that one logit (sigmoid = 0 in float64) zeroes that one coordinate."""
    gated, plain = _pair()
    row = 2 * 8 + 5  # head 2, coordinate 5
    with torch.no_grad():
        gated.output_gate.proj.weight.zero_()
        gated.output_gate.proj.bias.zero_()
        gated.output_gate.proj.bias[row] = -1e4
    x = torch.randn(1, 5, N_EMBD, dtype=torch.float64)
    expected = 0.5 * plain(x)
    expected[..., row] = 0.0
    torch.testing.assert_close(gated(x), expected, rtol=1e-14, atol=0)  # a product by 0.5 or 0: exact


def test_the_first_query_and_near_duplicate_keys():
    gated, plain = _pair()
    x = torch.randn(1, 1, N_EMBD, dtype=torch.float64).expand(1, 6, N_EMBD).clone()
    x[:, 1:] += 1e-9 * torch.randn(1, 5, N_EMBD, dtype=torch.float64)  # near-duplicate tokens, keys and values
    out = gated.run(x, return_weights=True)
    assert torch.isfinite(out.y).all() and torch.isfinite(out.weights).all()
    torch.testing.assert_close(out.weights[..., 0, 0], torch.ones(1, 4, dtype=torch.float64))
    v0 = plain.project(x)[2][:, :, 0].repeat_interleave(2, dim=1)  # [1, H, d]: query 0 sees v_0, o_0 = v_0
    gate = gated.output_gate.proj
    expected = gated_output(v0.view(1, 4, 1, 8), x[:, :1], gate.weight.detach(), gate.bias.detach())
    torch.testing.assert_close(out.y[:, 0], expected.reshape(1, N_EMBD), rtol=1e-12, atol=1e-14)


def test_generation_with_the_cache_equals_recomputation():
    torch.manual_seed(2)
    model = GPT(GPTConfig(vocab_size=11, block_size=16, n_layer=2, n_head=2, n_embd=16, attention="gated")).eval()
    prompt = torch.randint(0, 11, (2, 3))
    assert model.cache_exact
    assert torch.equal(model.generate(prompt, 9, temperature=0.0, use_cache=True),
                       model.generate(prompt, 9, temperature=0.0, use_cache=False))


def test_the_gate_starts_like_the_q_projection_and_learns():
    """In a GPT the gate's W_g is drawn like W_q (normal, std 0.02; bias 0), as the authors' gate is rows of the
    query projection: every gate starts near sigmoid(0) = 0.5. Both W_g and b receive gradients."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=2, n_embd=64, bias=True, attention="gated"))
    gate = model.blocks[0].attn.output_gate.proj
    assert gate.weight.shape == (64, 64) and (gate.bias == 0).all()
    assert abs(gate.weight.std().item() - 0.02) < 0.002  # 4096 draws: the sample std is within ~1% of 0.02
    idx = torch.randint(0, 11, (2, 8))
    model(idx, idx)[1].backward()
    assert gate.weight.grad.abs().sum() > 0 and gate.bias.grad.abs().sum() > 0


def test_the_switch_is_a_bool():
    with pytest.raises(ConfigError, match="^attention.output_gate='yes' must be true or false$"):
        AttentionConfig(output_gate="yes")
