"""The attention module and the GPT against independent computations."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from attnlab import GPT, Attention, AttentionConfig, GPTConfig
from helpers import attention_ref


def small(**kw):
    base = dict(vocab_size=40, block_size=24, n_layer=2, n_head=4, n_embd=32)
    base.update(kw)
    return GPTConfig(**base)


@pytest.mark.parametrize("variant", ["standard", "gqa", "mqa", "rbf", "mask-renormalize"])
def test_attention_module_matches_reference(variant):
    """Projections, head split/merge and output projection written out with numpy around the loop reference."""
    cfg = small(attention=variant).resolved_attention()
    layer = Attention(cfg, 32).double().eval()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    lin = lambda m, a: a @ m.weight.detach().numpy().T + m.bias.detach().numpy()  # noqa: E731
    xn = x.numpy()
    heads = lambda a, n: a.reshape(2, 9, n, 8).transpose(0, 2, 1, 3)  # noqa: E731
    q = heads(lin(layer.q_proj, xn), 4)
    k, v = heads(lin(layer.k_proj, xn), cfg.n_kv_head), heads(lin(layer.v_proj, xn), cfg.n_kv_head)
    o, _ = attention_ref(q, k, v, causal=True, kernel=cfg.kernel, mask_form=cfg.mask_form)
    want = lin(layer.out_proj, o.transpose(0, 2, 1, 3).reshape(2, 9, 32))
    np.testing.assert_allclose(layer(x).detach().numpy(), want, rtol=1e-10, atol=1e-10)


def test_gqa_equals_mha_with_repeated_kv_weights():
    """A GQA layer equals the MHA layer whose K/V projections repeat each K/V head for its query group."""
    gqa = Attention(AttentionConfig(n_head=4, n_kv_head=2), 32)
    mha = Attention(AttentionConfig(n_head=4, n_kv_head=4), 32)
    with torch.no_grad():
        for name in ("q_proj", "out_proj"):
            getattr(mha, name).load_state_dict(getattr(gqa, name).state_dict())
        for name in ("k_proj", "v_proj"):
            src = getattr(gqa, name)
            w = src.weight.unflatten(0, (2, 8)).repeat_interleave(2, 0).flatten(0, 1)
            b = src.bias.unflatten(0, (2, 8)).repeat_interleave(2, 0).flatten(0, 1)
            getattr(mha, name).weight.copy_(w)
            getattr(mha, name).bias.copy_(b)
    x = torch.randn(3, 10, 32)
    torch.testing.assert_close(gqa(x), mha(x))


def test_gqa_with_all_heads_is_mha():
    cfg_std, cfg_gqa = small(), small(attention=AttentionConfig(n_kv_head=4))
    torch.manual_seed(3)
    a = GPT(cfg_std)
    torch.manual_seed(3)
    b = GPT(cfg_gqa)
    idx = torch.randint(0, 40, (2, 12))
    torch.testing.assert_close(a(idx)[0], b(idx)[0])


def test_loss_is_cross_entropy_of_logits():
    model = GPT(small()).eval()
    idx, tgt = torch.randint(0, 40, (3, 16)), torch.randint(0, 40, (3, 16))
    tgt[0, :5] = -1
    logits, loss = model(idx, tgt)
    lp = torch.log_softmax(logits.double(), -1)
    mask = tgt >= 0
    want = -lp[mask].gather(-1, tgt[mask][:, None]).mean()
    assert loss.item() == pytest.approx(want.item(), rel=1e-5)
    # at initialisation the model is near uniform: loss ~ ln(vocab)
    assert abs(F.cross_entropy(logits.flatten(0, 1), tgt.flatten(), ignore_index=-1).item() - np.log(40)) < 0.3


def test_weights_tied_and_param_count():
    model = GPT(small())
    assert model.lm_head.weight is model.wte.weight
    c, L, V, B = 32, 2, 40, 24
    per_block = 4 * (c * c + c) + 2 * 2 * c + (c * 4 * c + 4 * c) + (4 * c * c + c)
    assert model.num_params(non_embedding=False) == V * c + B * c + L * per_block + 2 * c
    assert model.num_params() == L * per_block + 2 * c


def test_generate_greedy_matches_manual_loop():
    model = GPT(small()).eval()
    idx = torch.randint(0, 40, (2, 5))
    out = model.generate(idx, 30, temperature=0)  # runs past block_size=24: the context is cropped
    manual = idx
    with torch.no_grad():
        for _ in range(30):
            logits = model(manual[:, -24:])[0][:, -1]
            manual = torch.cat((manual, logits.argmax(-1, keepdim=True)), 1)
    assert torch.equal(out, manual)
    assert torch.equal(model.generate(idx, 30, top_k=1), manual)  # top-1 sampling is greedy
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(model.generate(idx, 10, generator=g1), model.generate(idx, 10, generator=g2))


def test_attention_maps_are_causal_distributions():
    model = GPT(small()).eval()
    idx = torch.randint(0, 40, (2, 12))
    maps = model.attention_maps(idx)
    assert len(maps) == 2 and maps[0].shape == (2, 4, 12, 12)
    for w in maps:
        torch.testing.assert_close(w.sum(-1), torch.ones(2, 4, 12))
        assert (w.triu(1) == 0).all()
    # layer 0's map equals softmax(q k'/sqrt(d) + mask) of the first block, recomputed here
    blk = model.blocks[0]
    with torch.no_grad():
        x = blk.ln_1(model.embed(idx))
        q = blk.attn.q_proj(x).unflatten(-1, (4, 8)).transpose(1, 2)
        k = blk.attn.k_proj(x).unflatten(-1, (4, 8)).transpose(1, 2)
        z = q @ k.transpose(-1, -2) / np.sqrt(8)
        want = torch.softmax(z.masked_fill(torch.ones(12, 12).triu(1).bool(), float("-inf")), -1)
    torch.testing.assert_close(maps[0], want)


def test_bad_tokens_give_clear_errors():
    model = GPT(small())
    with pytest.raises(ValueError, match="exceeds block_size=24"):
        model(torch.zeros(1, 25, dtype=torch.long))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 40\)"):
        model(torch.full((1, 4), 40))
    with pytest.raises(ValueError, match="integer tensor"):
        model(torch.zeros(1, 4))


def _layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def test_attention_only_blocks_match_a_numpy_forward():
    """mlp_ratio = 0: blocks x <- x + Attn(LN(x)) and nothing else. Written out in float64 numpy from the formula
    (learned positions, per-head softmax(q k^T / sqrt(d) + causal mask) v, output projection, final LayerNorm,
    tied head) with the model's own weights; tolerance 1e-10 relative, float64 rounding over two layers."""
    torch.manual_seed(0)
    cfg = small(mlp_ratio=0)
    model = GPT(cfg).double().eval()
    w = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    assert not any("mlp" in k or "ln_2" in k for k in w)
    c, L, V, B, H = 32, 2, 40, 24, 4
    assert model.num_params(non_embedding=False) == V * c + B * c + L * (4 * (c * c + c) + 2 * c) + 2 * c
    idx = torch.randint(0, V, (3, 17))
    T, d = idx.shape[1], c // H
    x = w["wte.weight"][idx.numpy()] + w["pos.weight"][:T]
    causal = np.triu(np.full((T, T), -np.inf), 1)
    for layer in range(L):
        p = f"blocks.{layer}."
        h = _layer_norm(x, w[p + "ln_1.weight"], w[p + "ln_1.bias"])
        q, k, v = (h @ w[p + f"attn.{n}_proj.weight"].T + w[p + f"attn.{n}_proj.bias"] for n in "qkv")
        heads = []
        for i in range(H):
            s = slice(i * d, (i + 1) * d)
            z = q[..., s] @ k[..., s].swapaxes(-1, -2) / np.sqrt(d) + causal
            a = np.exp(z - z.max(-1, keepdims=True))
            heads.append(a / a.sum(-1, keepdims=True) @ v[..., s])
        x = x + np.concatenate(heads, -1) @ w[p + "attn.out_proj.weight"].T + w[p + "attn.out_proj.bias"]
    want = _layer_norm(x, w["ln_f.weight"], w["ln_f.bias"]) @ w["wte.weight"].T
    got, _ = model(idx)
    np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-10, atol=1e-12)


def test_mlp_ratio_below_zero_is_refused():
    with pytest.raises(Exception, match="mlp_ratio=-1 must be >= 0"):
        small(mlp_ratio=-1)


@pytest.mark.parametrize("attention", ["standard", "moh"])
def test_answers_only_is_the_full_forward_at_the_answers(attention):
    """forward(answers_only=True): logits [n, vocab] equal to the full logits at the positions with a target, and
    the same loss (auxiliary losses included: MoH's load balance) and gradients (float64: 1e-12 relative);
    text-like targets everywhere select every position."""
    torch.manual_seed(1)
    model = GPT(small(dropout=0.0, attention=attention)).double()
    idx = torch.randint(0, 40, (3, 16))
    assert bool(model.run(idx).aux_losses) == (attention == "moh")  # training mode: MoH adds its L_b
    targets = torch.full((3, 16), -1)
    targets[0, 3], targets[1, 7], targets[1, 15], targets[2, 0] = 5, 9, 0, 39
    full, loss_full = model(idx, targets)
    grads_full = torch.autograd.grad(loss_full, list(model.parameters()))
    lean, loss_lean = model(idx, targets, answers_only=True)
    grads_lean = torch.autograd.grad(loss_lean, list(model.parameters()))
    assert lean.shape == (4, 40)
    torch.testing.assert_close(lean, full[targets >= 0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(loss_lean, loss_full, rtol=1e-12, atol=0)
    for g_lean, g_full in zip(grads_lean, grads_full):
        torch.testing.assert_close(g_lean, g_full, rtol=1e-10, atol=1e-14)
    every = torch.randint(0, 40, (3, 16))
    torch.testing.assert_close(model(idx, every, answers_only=True)[0], model(idx)[0].flatten(0, 1))
    with pytest.raises(ValueError, match="answers_only=True needs targets"):
        model(idx, answers_only=True)
