"""Positional encodings against their defining formulas, and the masking write-up's permutation invariance."""

import math

import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.functional import apply_rope, rope_angles, sinusoidal_table


def test_sinusoidal_matches_seed_002_formula():
    n, d = 50, 16
    table = sinusoidal_table(n, d, dtype=torch.float64)
    for i in range(n):
        for k in range(d // 2):
            phi = 10000 ** (2 * k / d)  # phi_k = 10000^(2k/d_model)
            assert table[i, 2 * k].item() == pytest.approx(math.sin(i / phi), abs=1e-12)
            assert table[i, 2 * k + 1].item() == pytest.approx(math.cos(i / phi), abs=1e-12)


def test_rope_is_complex_multiplication():
    """RoFormer: pair (x_2k, x_2k+1) as the complex number x_2k + i x_2k+1, multiplied by exp(i m theta_k)."""
    t, d = 10, 8
    x = torch.randn(2, 3, t, d, dtype=torch.float64)
    cos, sin = rope_angles(t, d)
    got = apply_rope(x, cos.double(), sin.double())
    theta = torch.tensor([10000 ** (-2 * k / d) for k in range(d // 2)], dtype=torch.float64)
    m = torch.arange(t, dtype=torch.float64)[:, None]
    z = torch.complex(x[..., 0::2], x[..., 1::2]) * torch.exp(1j * m * theta)
    want = torch.stack((z.real, z.imag), dim=-1).flatten(-2)
    # angles pass through float32 in rope_angles: cos/sin carry ~1e-7 relative error
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


def test_rope_scores_depend_on_offset_only():
    t, d = 16, 8
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    cos, sin = (a.double() for a in rope_angles(t, d))
    rot = lambda x, m: apply_rope(x[None], cos[m:m + 1], sin[m:m + 1])[0]  # noqa: E731
    base = rot(q, 5) @ rot(k, 2)
    for shift in (1, 4, 9):
        assert (rot(q, 5 + shift) @ rot(k, 2 + shift)).item() == pytest.approx(base.item(), abs=1e-6)


def _logits_at(model, tokens, i):
    with torch.no_grad():
        return model(tokens)[0][:, i]


@pytest.mark.parametrize("pos", ["none", "learned", "sinusoidal", "rope"])
def test_permutation_invariance_only_without_positions(pos):
    """The masking write-up appendix: without positions, one causal attention layer's output i is unchanged by permuting
    tokens 1..i-1. With positional encodings it changes."""
    torch.manual_seed(1)
    cfg = GPTConfig(vocab_size=50, block_size=16, n_layer=1, n_head=2, n_embd=32, pos_encoding=pos)
    model = GPT(cfg).double().eval()
    tokens = torch.randint(0, 50, (1, 12))
    i = 9
    perm = torch.cat((torch.randperm(i), torch.arange(i, 12)))
    change = (_logits_at(model, tokens, i) - _logits_at(model, tokens[:, perm], i)).abs().max().item()
    if pos == "none":
        assert change < 1e-10
    else:
        assert change > 1e-7  # float64 rounding is ~1e-15: any real dependence is far above it


def test_two_causal_layers_see_order_even_without_positions():
    """The invariance is a one-layer fact: from layer 2 on, the inputs at j < i are layer-1 outputs that each
    saw a different prefix, so the causal mask itself carries order (cf. Haviv et al. 2022, arXiv:2203.16634)."""
    torch.manual_seed(1)
    cfg = GPTConfig(vocab_size=50, block_size=16, n_layer=2, n_head=2, n_embd=32, pos_encoding="none")
    model = GPT(cfg).double().eval()
    tokens = torch.randint(0, 50, (1, 12))
    perm = torch.cat((torch.randperm(9), torch.arange(9, 12)))
    assert (_logits_at(model, tokens, 9) - _logits_at(model, tokens[:, perm], 9)).abs().max().item() > 1e-4
