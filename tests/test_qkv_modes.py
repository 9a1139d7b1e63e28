"""Q/K/V modes (the Boneless write-up's six steps), QK-norm, low-rank projections and MLA, against computations by hand."""

import math

import numpy as np
import pytest
import torch

from attnlab import GPT, Attention, AttentionConfig, GPTConfig, get_variant
from attnlab.config import ProjectionConfig
from attnlab.config import MagnitudeConfig
from attnlab.functional import qk_normalize
from attnlab.mechanisms.projections.module import IdentityInitLinear, LowRankLinear
from helpers import LEAK_TOL, attention_ref, build, max_leak, one_line_error

C, H, D, B, T = 32, 4, 8, 2, 9  # n_embd, n_head, head_dim, batch, sequence


def layer(attention, n_head=H, n_embd=C, **model) -> Attention:
    """The first attention layer of a GPT built with ``attention`` (so GPT's own initialisation has run), in float64."""
    cfg = GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=n_head, n_embd=n_embd, attention=attention, **model)
    return GPT(cfg).blocks[0].attn.double().eval()


def x_(n_embd=C) -> torch.Tensor:
    return torch.randn(B, T, n_embd, dtype=torch.float64)


def lin(m, a):
    """a W' + b in numpy from a module's weight and bias."""
    w = m.weight.detach().numpy()
    return a @ w.T + (0.0 if m.bias is None else m.bias.detach().numpy())


def heads(a, n, d=D):
    """[B, T, n d] -> [B, n, T, d] in numpy."""
    return a.reshape(a.shape[0], a.shape[1], n, d).transpose(0, 2, 1, 3)


def merge(o):
    """[B, n, T, d] -> [B, T, n d] in numpy."""
    return o.transpose(0, 2, 1, 3).reshape(o.shape[0], o.shape[2], -1)


def causal_softmax(z):
    t = z.shape[-1]
    z = np.where(np.tril(np.ones((t, t), dtype=bool)), z, -np.inf)
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def n_params(module) -> int:
    return sum(p.numel() for p in module.parameters())


# --- the Boneless write-up, steps 1-3: boneless attention ---------------------------------------------------------------------

@pytest.mark.parametrize("n_head", [1, H])
def test_boneless_corr_is_x_xt_x_with_the_future_zeroed(n_head):
    attn, x = layer("boneless-corr", n_head=n_head), x_()
    assert n_params(attn) == 0
    xn = x.numpy()
    want = np.concatenate([
        (np.tril(xh @ xh.transpose(0, 2, 1)) @ xh)  # (x_h x_h') x_h, weights of keys j > i set to 0
        for xh in np.split(xn, n_head, axis=-1)
    ], axis=-1)
    np.testing.assert_allclose(attn(x).detach().numpy(), want, rtol=1e-12, atol=1e-10)
    if n_head == 1:  # the write-up's formula literally, on the whole vector
        np.testing.assert_allclose(want, np.tril(xn @ xn.transpose(0, 2, 1)) @ xn, rtol=1e-12)


def test_boneless_gpt_has_no_attention_parameters():
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=H, n_embd=C, attention="boneless-corr"))
    assert all(n_params(block.attn) == 0 for block in model.blocks)
    assert n_params(layer("boneless-softmax")) == 0


@pytest.mark.parametrize("n_head", [1, H])
@pytest.mark.parametrize("backend", ["auto", "explicit"])
def test_boneless_softmax_is_softmax_of_x_xt(n_head, backend):
    attn, x = layer(get_variant("boneless-softmax").replace(backend=backend), n_head=n_head), x_()
    d = C // n_head
    want = np.concatenate([
        causal_softmax(xh @ xh.transpose(0, 2, 1) / math.sqrt(d)) @ xh
        for xh in np.split(x.numpy(), n_head, axis=-1)
    ], axis=-1)
    np.testing.assert_allclose(attn(x).detach().numpy(), want, rtol=1e-10, atol=1e-12)


def test_boneless_value_mixes_value_projected_tokens_by_correlation_of_x():
    attn, x = layer("boneless-value"), x_()
    assert isinstance(attn.q_proj, torch.nn.Identity) and isinstance(attn.k_proj, torch.nn.Identity)
    xn = x.numpy()
    xh, vh = heads(xn, H), heads(lin(attn.v_proj, xn), H)
    o = causal_softmax(xh @ xh.transpose(0, 1, 3, 2) / math.sqrt(D)) @ vh
    np.testing.assert_allclose(attn(x).detach().numpy(), lin(attn.out_proj, merge(o)), rtol=1e-10, atol=1e-12)


# --- the Boneless write-up, steps 5-6: identity-initialised and residual projections ------------------------------------------

def test_identity_init_starts_as_identity_then_trains_away():
    torch.manual_seed(1)
    trained = layer("identity-qk")  # built inside a GPT: its N(0, 0.02) init must not overwrite the identity
    for proj in (trained.q_proj, trained.k_proj):
        assert isinstance(proj, IdentityInitLinear)
        assert torch.equal(proj.weight, torch.eye(C, dtype=torch.float64)) and not proj.bias.any()
    fixed = Attention(AttentionConfig(n_head=H, n_kv_head=H, projections=ProjectionConfig(q_mode="identity", k_mode="identity")), C).double()
    fixed.v_proj.load_state_dict(trained.v_proj.state_dict())
    fixed.out_proj.load_state_dict(trained.out_proj.state_dict())
    x = x_()
    torch.testing.assert_close(trained(x), fixed(x), rtol=0, atol=1e-14)  # equal at initialisation

    opt = torch.optim.Adam(trained.parameters(), lr=1e-2)
    trained.train()
    trained(x).pow(2).mean().backward()
    opt.step()
    assert not torch.equal(trained.q_proj.weight, torch.eye(C, dtype=torch.float64))
    assert (trained(x) - fixed(x)).abs().max() > 1e-4  # diverged after one step


def test_residual_projection_is_wx_plus_x():
    attn, x = layer("residual-qk"), x_()
    xn = x.numpy()
    for proj in (attn.q_proj, attn.k_proj):
        assert isinstance(proj.proj, torch.nn.Linear) and proj.proj.weight.abs().max() > 0
        np.testing.assert_allclose(proj(x).detach().numpy(), lin(proj.proj, xn) + xn, rtol=1e-12)
    q, k = heads(lin(attn.q_proj.proj, xn) + xn, H), heads(lin(attn.k_proj.proj, xn) + xn, H)
    o, _ = attention_ref(q, k, heads(lin(attn.v_proj, xn), H), causal=True)
    np.testing.assert_allclose(attn(x).detach().numpy(), lin(attn.out_proj, merge(o)), rtol=1e-10, atol=1e-12)


def test_residual_q_works_with_gqa_and_does_not_leak():
    cfg = AttentionConfig(projections=ProjectionConfig(q_mode="residual"), n_kv_head=2)
    assert max_leak(build(cfg)) < LEAK_TOL


# --- QK-norm -------------------------------------------------------------------------------------------------------

def test_qk_normalize_gives_unit_rows_and_scaled_cosine():
    q, k = torch.randn(2, 3, 5, 8, dtype=torch.float64), torch.randn(2, 3, 7, 8, dtype=torch.float64)
    qn, kn = qk_normalize(q, k, 2.5)
    torch.testing.assert_close(qn.norm(dim=-1), torch.full((2, 3, 5), 2.5, dtype=torch.float64))
    torch.testing.assert_close(kn.norm(dim=-1), torch.ones(2, 3, 7, dtype=torch.float64))
    cos = torch.nn.functional.cosine_similarity(q.unsqueeze(-2), k.unsqueeze(-3), dim=-1)
    torch.testing.assert_close(qn @ kn.transpose(-1, -2), 2.5 * cos)


@pytest.mark.parametrize("n_kv_head", [H, 2, 1])
@pytest.mark.parametrize("mode, g", [("fixed", 3.0), ("fixed", None), ("learned", None)])
def test_qk_norm_logits_are_g_times_cosine(mode, g, n_kv_head):
    attn = layer(AttentionConfig(qk_norm=mode, qk_norm_scale=g, n_kv_head=n_kv_head, temperature=0.5))
    x = x_()
    xn = x.numpy()
    q, k = heads(lin(attn.q_proj, xn), H), heads(lin(attn.k_proj, xn), n_kv_head)
    v = heads(lin(attn.v_proj, xn), n_kv_head)
    k, v = (np.repeat(a, H // n_kv_head, axis=1) for a in (k, v))
    norms = np.linalg.norm(q, axis=-1)[..., None] * np.linalg.norm(k, axis=-1)[..., None, :]
    cos = (q @ k.transpose(0, 1, 3, 2)) / norms
    gain = attn.qk_gain.item() if mode == "learned" else math.sqrt(D) if g is None else g  # learned: float32-rounded
    p = causal_softmax(gain * cos / 0.5)
    y, w = attn(x, return_weights=True)
    np.testing.assert_allclose(w.detach().numpy(), p, rtol=1e-10, atol=1e-13)
    np.testing.assert_allclose(y.detach().numpy(), lin(attn.out_proj, merge(p @ v)), rtol=1e-10, atol=1e-12)
    if mode == "learned":
        assert attn.qk_gain.item() == pytest.approx(math.sqrt(D))
        y.sum().backward()
        assert attn.qk_gain.grad is not None and attn.qk_gain.grad.abs() > 0


# --- low rank --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_kv_head", [H, 2, 1])
def test_low_rank_weights_have_rank_r_and_the_computed_parameter_count(n_kv_head):
    attn = layer(get_variant("low-rank").replace(n_kv_head=n_kv_head))
    kv_out = n_kv_head * D
    for proj, out in ((attn.q_proj, C), (attn.k_proj, kv_out), (attn.v_proj, kv_out)):
        r = round(0.25 * min(C, out))
        assert isinstance(proj, LowRankLinear) and proj.rank == r
        assert torch.linalg.matrix_rank(proj.weight) == r < min(C, out)
        assert n_params(proj) == r * (C + out) + out  # A [r, in], B [out, r], bias [out]
    x = x_()
    torch.testing.assert_close(attn.k_proj(x), x @ (attn.k_proj.up @ attn.k_proj.down).T + attn.k_proj.bias)
    assert n_params(attn) == (8 * (C + C) + C) + 2 * (round(0.25 * min(C, kv_out)) * (C + kv_out) + kv_out) + C * C + C
    assert max_leak(build(get_variant("low-rank").replace(n_kv_head=n_kv_head))) < LEAK_TOL


def test_low_rank_absolute_rank_and_dense_scale_init():
    attn = layer(AttentionConfig(projections=ProjectionConfig(rank=3)))
    assert all(torch.linalg.matrix_rank(p.weight) == 3 for p in (attn.q_proj, attn.k_proj, attn.v_proj))
    w = LowRankLinear(512, 512, 64).weight  # B A starts with the dense layer's entrywise std 0.02
    assert w.std().item() == pytest.approx(0.02, rel=0.05)


def test_residual_low_rank_composes():
    attn = layer(AttentionConfig(projections=ProjectionConfig(q_mode="residual", rank=4)))
    x = x_()
    torch.testing.assert_close(attn.q_proj(x), x @ attn.q_proj.proj.weight.T + attn.q_proj.proj.bias + x)
    assert torch.linalg.matrix_rank(attn.q_proj.proj.weight) == 4


# --- MLA -------------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_kv_head", [H, 2])
def test_mla_rebuilds_k_and_v_from_one_latent(n_kv_head):
    attn = layer(get_variant("mla").replace(n_kv_head=n_kv_head))
    lat, d_c, kv_out = attn.kv_latent, C // 4, n_kv_head * D
    assert not hasattr(attn, "k_proj") and not hasattr(attn, "v_proj")
    x = x_()
    xn = x.numpy()
    h = lin(lat.down, xn)
    c = h / np.sqrt((h ** 2).mean(-1, keepdims=True) + 1e-6) * lat.norm.weight.detach().numpy()  # RMSNorm
    assert c.shape[-1] == d_c
    np.testing.assert_allclose(lat.latent(x).detach().numpy(), c, rtol=1e-12)
    k, v = lin(lat.up_k, c), lin(lat.up_v, c)  # K = c W_uk', V = c W_uv'
    q, kk, vv = attn.project(x)
    np.testing.assert_allclose(merge(kk.detach().numpy()), k, rtol=1e-12)
    np.testing.assert_allclose(merge(vv.detach().numpy()), v, rtol=1e-12)
    o, _ = attention_ref(heads(lin(attn.q_proj, xn), H), heads(k, n_kv_head), heads(v, n_kv_head), causal=True)
    np.testing.assert_allclose(attn(x).detach().numpy(), lin(attn.out_proj, merge(o)), rtol=1e-10, atol=1e-12)
    # parameters: W_dkv + b, RMSNorm gain, W_uk + b, W_uv + b; then W_q, W_o as usual
    assert n_params(lat) == (C * d_c + d_c) + d_c + 2 * (d_c * kv_out + kv_out)
    assert n_params(attn) == n_params(lat) + 2 * (C * C + C)
    assert attn.kv_cache_per_token == {"cached": d_c, "kv": 2 * n_kv_head * D, "mha": 2 * C}
    assert max_leak(build(get_variant("mla").replace(n_kv_head=n_kv_head))) < LEAK_TOL


@pytest.mark.parametrize("n_embd, n_head, d_c, kv", [(128, 4, 32, 256), (768, 12, 192, 1536)])
def test_mla_kv_cache_numbers_for_the_cpu_and_gpt2_small_shapes(n_embd, n_head, d_c, kv):
    """The README's numbers: d_c = n_embd/4 floats per token per layer against 2 n_head head_dim for MHA K and V."""
    attn = GPTConfig(n_embd=n_embd, n_head=n_head, attention="mla").resolved_attention()
    from attnlab.mechanisms.projections.module import kv_cache_per_token

    assert kv_cache_per_token(attn, n_embd) == {"cached": d_c, "kv": kv, "mha": kv}
    mla = get_variant("mla").replace(projections=ProjectionConfig(kv_latent=100), n_head=n_head, n_kv_head=n_head)
    assert kv_cache_per_token(mla, n_embd)["cached"] == 100


def test_kv_cache_of_boneless_is_x_once():
    assert layer("boneless-softmax").kv_cache_per_token == {"cached": C, "kv": 2 * C, "mha": 2 * C}
    assert layer("gqa").kv_cache_per_token["cached"] == 2 * 2 * D


# --- defaults, GQA combinations, config errors ---------------------------------------------------------------------

def test_default_projections_are_plain_linear_for_hf_loading():
    attn = layer("standard")
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert type(getattr(attn, name)) is torch.nn.Linear
    assert attn.qk_gain is None and attn.kv_latent is None


@pytest.mark.parametrize("cfg", [
    AttentionConfig(qk_norm="learned", projections=ProjectionConfig(rank_fraction=0.5), n_kv_head=2),
    AttentionConfig(projections=ProjectionConfig(kv_latent=6), qk_norm="fixed", n_kv_head=1),
    AttentionConfig(projections=ProjectionConfig(q_mode="identity_init"), n_kv_head=2, normalizer="none"),
    AttentionConfig(projections=ProjectionConfig(q_mode="identity", k_mode="identity", v_mode="identity", out_proj=False), magnitude=MagnitudeConfig("causal")),
])
def test_combinations_run_and_do_not_leak(cfg):
    assert max_leak(build(cfg, "rope")) < LEAK_TOL


@pytest.mark.parametrize("bad, patterns", [
    (dict(q_mode="ident"), ["q_mode='ident'", "'identity_init'", "'residual'"]),
    (dict(out_proj="no"), ["out_proj='no'", "true or false"]),
    (dict(qk_norm="on"), ["qk_norm='on'", "'learned'"]),
    (dict(qk_norm_scale=2.0), ["qk_norm_scale=2.0", "qk_norm='fixed'"]),
    (dict(qk_norm="fixed", scale=0.5), ["qk_norm='fixed'", "scale=0.5", "qk_norm_scale"]),
    (dict(qk_norm="learned", kernel="rbf"), ["qk_norm='learned'", "kernel='rbf'"]),
    (dict(qk_norm="fixed", qk_norm_scale=0.0), ["qk_norm_scale=0.0", "> 0"]),
    (dict(rank=0), ["rank=0", ">= 1"]),
    (dict(rank_fraction=1.0), ["rank_fraction=1.0", "< 1"]),
    (dict(rank=4, rank_fraction=0.5), ["rank=4", "rank_fraction=0.5", "one of"]),
    (dict(rank=4, k_mode="identity_init"), ["rank", "identity_init"]),
    (dict(rank=4, q_mode="identity", k_mode="identity", v_mode="identity"), ["rank", "no learned"]),
    (dict(kv_latent_fraction=0.0), ["kv_latent_fraction=0.0", "> 0"]),
    (dict(kv_latent=8, kv_latent_fraction=0.5), ["kv_latent=8", "kv_latent_fraction=0.5"]),
    (dict(kv_latent=8, v_mode="identity"), ["kv_latent", "v_mode='identity'", "'projected'"]),
    (dict(n_head=4, n_kv_head=2, k_mode="residual"), ["k_mode='residual'", "n_kv_head=2", "GQA"]),
    (dict(n_head=4, n_kv_head=1, v_mode="identity"), ["v_mode='identity'", "n_kv_head=1"]),
])
def test_bad_projection_configs_give_one_line(bad, patterns):
    one_line_error(lambda: AttentionConfig.from_dict(bad), *patterns)  # the old flat keys: folded into the table


def test_size_errors_at_model_config_time():
    one_line_error(lambda: GPTConfig(n_head=4, n_embd=32, attention=get_variant("identity-qk").replace(n_kv_head=2)),
                   "k_mode='identity_init'", "n_kv_head=2")
    one_line_error(lambda: GPTConfig(n_head=4, n_embd=32, attention=AttentionConfig(projections=ProjectionConfig(rank=32))),
                   "rank=32", "full rank 32")
    one_line_error(lambda: GPTConfig(n_head=4, n_embd=32, attention=AttentionConfig(projections=ProjectionConfig(rank=8), n_kv_head=1)),
                   "rank=8", "k projection (32 -> 8)")


@pytest.mark.parametrize("variant, fused", [("standard", True), ("gqa", True), ("identity-qk", False),
                                            ("residual-qk", False), ("low-rank", False), ("mla", False)])
def test_plain_projections_run_as_one_matmul_with_the_same_result(variant, fused):
    """Attention.project stacks W_q, W_k, W_v into one matmul when all three are plain nn.Linear layers (the same
    parameters, nanoGPT's fused c_attn); its q, k, v equal the three layers applied one by one, to float64 rounding.
    Projections that are not plain linear layers (identity-initialised, residual, low-rank, MLA's latent) are applied
    one by one."""
    torch.manual_seed(0)
    cfg = GPTConfig(vocab_size=11, block_size=8, n_layer=1, n_head=4, n_embd=32, attention=variant)
    layer = Attention(cfg.resolved_attention(), 32).double()
    x = torch.randn(2, 8, 32, dtype=torch.float64)
    assert (layer._plain_qkv() is not None) == fused
    q, k, v = layer.project(x)
    by_one = [layer.q_proj(x)] + (list(layer.kv_latent(x)) if layer.kv_latent is not None
                                 else [layer.k_proj(x), layer.v_proj(x)])
    for got, ref, n in zip((q, k, v), by_one, (layer.n_head, layer.n_kv_head, layer.n_kv_head)):
        torch.testing.assert_close(got, layer._heads(ref, n), rtol=1e-12, atol=1e-12)
