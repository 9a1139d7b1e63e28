"""ALiBi (Press, Smith and Lewis 2022, arXiv:2108.12409): the slopes against the paper's closed form and
x-transformers, the layer against x-transformers' Attention with its AlibiPositionalBias and against a float64
reference written from the formula, the GPT's wiring and the one-line errors. The causal leak test
(tests/test_causal_leak.py) and the K/V-cache test (tests/test_kv_cache.py) run every variant with
pos_encoding='alibi' too."""

import math

import pytest
import torch
from x_transformers.x_transformers import AlibiPositionalBias

from attnlab import GPT, AttentionConfig, GPTConfig
from attnlab.attention_config import route
from attnlab.functional import alibi_bias, alibi_slopes
from attnlab.nn import Attention
from helpers import one_line_error
from xt_oracle import N_EMBD, N_HEAD, twins

TOL = dict(rtol=1e-10, atol=1e-12)  # float64 on both sides, sums in another order: ~1e-15 relative; margin kept


def test_slopes_are_the_papers_geometric_sequences():
    """Section 3: for 8 heads 1/2, 1/4, ..., 1/256; for 16 heads the sequence from 1/sqrt(2), ratio 1/sqrt(2)."""
    torch.testing.assert_close(alibi_slopes(8), torch.tensor([2.0 ** -h for h in range(1, 9)], dtype=torch.float64),
                               rtol=0, atol=0)
    torch.testing.assert_close(alibi_slopes(16), torch.tensor([2.0 ** (-h / 2) for h in range(1, 17)],
                                                              dtype=torch.float64), rtol=1e-15, atol=0)
    # n not a power of 2: 4 heads' slopes, then every other slope of 8 heads' (1/sqrt(2)^(odd h) ... as 2^(-h) for
    # odd h = 1, 3 of the 8-head sequence 2^(-h))
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([1 / 4, 1 / 16, 1 / 64, 1 / 256, 1 / 2, 1 / 8],
                                                             dtype=torch.float64), rtol=0, atol=0)


@pytest.mark.parametrize("n_head", [1, 2, 3, 5, 6, 7, 8, 12, 16, 24])
def test_slopes_equal_x_transformers(n_head):
    """x-transformers multiplies the ratio in step by step, we take each power at once: a few ulps apart (4e-15)."""
    expected = torch.tensor(AlibiPositionalBias._get_slopes(n_head), dtype=torch.float64)
    torch.testing.assert_close(alibi_slopes(n_head), expected, rtol=4e-15, atol=0)


@pytest.mark.parametrize("t, s", [(7, 7), (3, 10), (1, 5)])
def test_bias_equals_x_transformers(t, s):
    """-m_h |pos_i - j| with the queries at the last t of s positions (a K/V cache), as x-transformers places them."""
    expected = AlibiPositionalBias(heads=6).double()(t, s)  # [H, t, s]
    torch.testing.assert_close(alibi_bias(alibi_slopes(6), t, s), expected, rtol=4e-15, atol=0)


def test_bias_keeps_distances_exact_for_low_precision_slopes():
    """A model cast to bfloat16 casts its slopes too; positions above 256 must not round (bfloat16 keeps 8 bits), or
    the last query's nearest keys would be 0 apart. Powers of 2 slopes are exact in bfloat16, so the bias is exact."""
    got = alibi_bias(alibi_slopes(4).to(torch.bfloat16), 1, 1001)[:, 0, -3:]  # query 1000 over keys 998, 999, 1000
    assert got.dtype == torch.float32
    expected = -alibi_slopes(4).float().view(-1, 1) * torch.tensor([2.0, 1.0, 0.0])
    torch.testing.assert_close(got, expected, rtol=0, atol=0)


@pytest.mark.parametrize("bad", [0, -2, 2.5, True])
def test_bad_head_counts_are_one_line_errors(bad):
    with pytest.raises(ValueError, match=f"n_head={bad!r} must be a positive integer"):
        alibi_slopes(bad)


def _with_alibi(ours: Attention, **changes) -> Attention:
    """A copy of the layer ours with alibi=True (and changes): the same parameters; the slopes are a buffer."""
    layer = Attention(ours.config.replace(alibi=True, **changes), N_EMBD).double()
    layer.load_state_dict(ours.state_dict())
    return layer


@pytest.mark.parametrize("n_kv_head", [4, 2])  # MHA, GQA
@pytest.mark.parametrize("causal", [True, False])
def test_the_layer_equals_x_transformers_attention_with_alibi(n_kv_head, causal):
    oracle, ours, perm = twins(n_kv_head, causal)
    ours = _with_alibi(ours)
    slopes = torch.empty(N_HEAD, dtype=torch.float64)
    slopes[perm] = alibi_slopes(N_HEAD)  # x-transformers' head perm[h] is our head h: give it head h's slope
    rel_pos = AlibiPositionalBias(heads=N_HEAD, slopes=slopes.tolist()).double()
    x = torch.randn(2, 9, N_EMBD, dtype=torch.float64)
    expected, inter = oracle(x, rel_pos=rel_pos, return_intermediates=True)
    explicit = ours.run(x, return_weights=True)
    torch.testing.assert_close(explicit.weights, inter.post_softmax_attn[:, perm], **TOL)
    torch.testing.assert_close(explicit.y, expected, **TOL)
    torch.testing.assert_close(ours(x), expected, **TOL)  # the SDPA path: the bias as a float mask


def _reference(layer: Attention, x: torch.Tensor) -> torch.Tensor:
    """float64, straight from the formula, one (head, query) at a time: p_i = softmax_j<=i(q_i.k_j / sqrt(d) -
    m_h (i - j)), o_i = sum_j p_ij v_j, then W_o (biases included), with head h reading K/V head h // (H / Hkv)."""
    q, k, v = layer.project(x)
    b, h, t, d = q.shape
    rep = h // k.shape[1]
    m = [2.0 ** (-8.0 * (hh + 1) / h) for hh in range(h)]  # h a power of 2 here
    out = torch.zeros(b, h, t, d, dtype=torch.float64)
    for hh in range(h):
        for i in range(t):
            z = torch.stack([(q[:, hh, i] * k[:, hh // rep, j]).sum(-1) / math.sqrt(d) - m[hh] * (i - j)
                             for j in range(i + 1)], dim=-1)  # [B, i + 1]
            p = torch.softmax(z, dim=-1)
            out[:, hh, i] = (p.unsqueeze(-1) * v[:, hh // rep, :i + 1]).sum(1)
    return layer.out_proj(out.transpose(1, 2).flatten(-2))


@pytest.mark.parametrize("n_kv_head", [4, 1])  # MHA, MQA
def test_the_layer_equals_the_float64_reference(n_kv_head):
    torch.manual_seed(0)
    layer = Attention(AttentionConfig(n_head=4, n_kv_head=n_kv_head, alibi=True), N_EMBD).double()
    x = torch.randn(2, 11, N_EMBD, dtype=torch.float64)
    expected = _reference(layer, x)
    torch.testing.assert_close(layer(x), expected, **TOL)
    torch.testing.assert_close(_with_alibi(layer, backend="explicit")(x), expected, **TOL)


def test_alibi_adds_to_a_magnitude_prior_and_leaves_the_prefix_blocks():
    """The low-rank prefix prior with ALiBi: off the prefix blocks (which add no per-(i, j) bias) and off the Triton
    kernels, onto the float mask; its output is the prior's layer's output with -m_h |i - j| in the logits, which the
    explicit path (a different code path: logits + prior, then the softmax) computes too."""
    cfg = AttentionConfig(n_head=4, n_kv_head=4, magnitude={"form": "prefix", "apply": "logits", "solver": "lowrank", "rank": 8})
    assert route(cfg).path == "prefix_blocks"
    with_alibi = cfg.replace(alibi=True)
    assert route(with_alibi).path == "sdpa" and route(with_alibi, device="cuda").path == "sdpa"
    one_line_error(lambda: with_alibi.replace(backend="triton"), "backend='triton'", "alibi=true")
    torch.manual_seed(0)
    layer = Attention(with_alibi, N_EMBD).double()
    x = torch.randn(2, 10, N_EMBD, dtype=torch.float64)
    explicit = Attention(with_alibi.replace(backend="explicit"), N_EMBD).double()
    explicit.load_state_dict(layer.state_dict())
    torch.testing.assert_close(layer(x), explicit(x), **TOL)
    plain = Attention(cfg, N_EMBD).double()
    plain.load_state_dict(layer.state_dict())
    assert (plain(x) - layer(x)).abs().max() > 1e-3  # the bias does change the output


def test_a_gpt_with_alibi_has_no_position_parameters_and_every_layer_biased():
    config = GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=4, n_embd=32, pos_encoding="alibi")
    model = GPT(config)
    assert model.pos is None and model.rope is None
    assert not any("pos" in name for name, _ in model.named_parameters())
    assert all(block.attn.config.alibi for block in model.blocks)
    assert "alibi_slopes" not in "".join(model.state_dict())  # fixed slopes: not saved, recomputed from n_head
    assert not GPTConfig(n_layer=1, n_head=2, n_embd=16).resolved_attention().alibi


def test_refused_combinations_are_one_line_errors():
    one_line_error(lambda: GPTConfig(n_layer=1, n_head=2, n_embd=16, attention="softpick", pos_encoding="alibi"),
                   "pos_encoding='alibi'", "normalizer='softpick'", "'softmax'")
    one_line_error(lambda: GPTConfig(n_layer=1, n_head=2, n_embd=16, attention=AttentionConfig(alibi=True)),
                   "attention.alibi=true", "pos_encoding='learned'", "pos_encoding='alibi'")
    one_line_error(lambda: AttentionConfig(alibi="yes"), "attention.alibi='yes'", "true or false")
