"""Head recombination: talking heads and mixture of heads against float64 references written from the
papers' equations, one token and one head at a time; their causality with non-trivial mixes; their errors.

Tolerances: float64 throughout, so the references and the batched code may differ by rounding only (1e-10)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, get_variant
from attnlab.attention_config import AttentionConfig, HeadMixConfig
from attnlab.functional import attention
from attnlab.mechanisms.heads.functional import moh_balance_loss, moh_gates
from attnlab.nn import Attention
from helpers import LEAK_TOL, build, max_leak, one_line_error

TOL = 1e-10


def _softmax(z):
    e = np.exp(z - z.max())
    return e / e.sum()


def talking_heads_ref(q, k, v, p_logits, p_weights, causal=True):
    """Shazeer et al. 2020, s.3, per (b, i): J_h = q_h.k_h / sqrt(d); L_g = sum_h J_h P_l[h, g]; W_g = softmax(L_g)
    over the visible keys; U_g = sum_h W_h P_w[h, g]; o_g = U_g v_g."""
    q, k, v, pl, pw = (np.asarray(a, dtype=np.float64) for a in (q, k, v, p_logits, p_weights))
    b_, h_, t_, d = q.shape
    out = np.zeros((b_, h_, t_, v.shape[-1]))
    for b in range(b_):
        for i in range(t_):
            seen = np.arange(t_) <= i if causal else np.ones(t_, dtype=bool)
            j_logits = np.array([[q[b, h, i] @ k[b, h, j] / np.sqrt(d) for j in range(t_)] for h in range(h_)])
            mixed = np.array([sum(j_logits[h] * pl[h, g] for h in range(h_)) for g in range(h_)])
            w = np.zeros((h_, t_))
            for g in range(h_):
                w[g, seen] = _softmax(mixed[g, seen])
            u = np.array([sum(w[h] * pw[h, g] for h in range(h_)) for g in range(h_)])
            for g in range(h_):
                out[b, g, i] = u[g] @ v[b, g]
    return out


def moh_gates_ref(x, w_shared, w_routed, w_group, top_k):
    """Jin et al. 2024, s.3.2, one token at a time, with the released code's normalisation (module docstring of
    attnlab.mechanisms.heads.functional): g = [a_1 h_s softmax(W_s x), a_2 k renorm(top-k of softmax(W_r x))], a = 2 softmax(W_h x)."""
    gates = []
    for xt in np.asarray(x, dtype=np.float64).reshape(-1, x.shape[-1]):
        p = _softmax(w_routed @ xt)
        top = np.argsort(-p, kind="stable")[:top_k]
        routed = np.zeros_like(p)
        routed[top] = p[top] / p[top].sum() * top_k
        if w_shared is None:
            gates.append(routed)
            continue
        shared = _softmax(w_shared @ xt) * len(w_shared)
        a = _softmax(w_group @ xt) * 2
        gates.append(np.concatenate([a[0] * shared, a[1] * routed]))
    return np.array(gates).reshape(*x.shape[:-1], -1)


def test_talking_heads_attention_matches_the_papers_equations():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 7, 5, generator=g, dtype=torch.float64) for _ in range(3))
    pl, pw = (torch.randn(4, 4, generator=g, dtype=torch.float64) for _ in range(2))
    ours = attention(q, k, v, causal=True, head_mix=(pl, pw))
    np.testing.assert_allclose(ours.numpy(), talking_heads_ref(q, k, v, pl, pw), atol=TOL, rtol=0)


def test_talking_heads_at_the_identity_is_plain_attention_on_sdpa():
    """P_l = P_w = I: the explicit talking-heads path must give what PyTorch's fused SDPA gives (float64)."""
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(2, 4, 9, 8, generator=g, dtype=torch.float64) for _ in range(3))
    eye = torch.eye(4, dtype=torch.float64)
    ours = attention(q, k, v, causal=True, head_mix=(eye, eye))
    sdpa = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, sdpa, atol=TOL, rtol=0)


def test_talking_heads_layer_uses_its_parameters_and_starts_as_standard():
    torch.manual_seed(0)
    layer = Attention(get_variant("talking-heads").replace(n_head=4, n_kv_head=4), 32).double()
    plain = Attention(get_variant("standard").replace(n_head=4, n_kv_head=4), 32).double()
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if "talking" not in k})
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    torch.testing.assert_close(layer(x), plain(x), atol=TOL, rtol=0)  # identity mixes at init
    with torch.no_grad():
        layer.talking.logit_mix.copy_(torch.randn(4, 4))
        layer.talking.weight_mix.copy_(torch.randn(4, 4))
    q, k, v = (a.detach() for a in layer.project(x))
    heads = talking_heads_ref(q, k, v, layer.talking.logit_mix.detach(), layer.talking.weight_mix.detach())
    want = layer.out_proj(torch.from_numpy(heads).transpose(1, 2).flatten(-2))
    torch.testing.assert_close(layer(x).detach(), want.detach(), atol=TOL, rtol=0)


@pytest.mark.parametrize("shared, routed, top_k", [(2, 2, 1), (1, 3, 2), (0, 4, 2), (3, 5, 5)])
def test_moh_gates_match_the_papers_routing(shared, routed, top_k):
    g = torch.Generator().manual_seed(shared * 10 + routed)
    c = 6
    x = torch.randn(3, 5, c, generator=g, dtype=torch.float64)
    ws = torch.randn(shared, c, generator=g, dtype=torch.float64) if shared else None
    wr, wh = torch.randn(routed, c, generator=g, dtype=torch.float64), torch.randn(2, c, generator=g, dtype=torch.float64)
    gates, probs, chosen = moh_gates(None if ws is None else x @ ws.T, x @ wr.T, None if ws is None else x @ wh.T,
                                     top_k)
    want = moh_gates_ref(x.numpy(), None if ws is None else ws.numpy(), wr.numpy(), wh.numpy(), top_k)
    np.testing.assert_allclose(gates.numpy(), want, atol=TOL, rtol=0)
    assert (chosen.sum(-1) == top_k).all()
    # L_b = sum_i f_i P_i (the paper's load balance), from its definition token by token
    flat_p = torch.softmax(x @ wr.T, -1).reshape(-1, routed).numpy()
    sel = np.zeros_like(flat_p)
    for n, row in enumerate(flat_p):
        sel[n, np.argsort(-row, kind="stable")[:top_k]] = 1
    assert abs(moh_balance_loss(probs, chosen).item() - (sel.mean(0) * flat_p.mean(0)).sum()) < TOL


def test_moh_layer_weights_each_heads_output_before_w_o():
    """y = concat_h(g_th o_th) W_o with o_th plain attention of head h and g from the router (float64)."""
    torch.manual_seed(0)
    cfg = get_variant("moh").replace(n_head=4, n_kv_head=4)
    layer = Attention(cfg, 32).double()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    q, k, v = (a.detach() for a in layer.project(x))
    heads = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)  # [B, H, T, d]
    r = layer.router
    gates = moh_gates_ref(x.numpy(), r.w_shared.weight.detach().numpy(), r.w_routed.weight.detach().numpy(),
                          r.w_group.weight.detach().numpy(), 1)
    weighted = heads * torch.from_numpy(gates).transpose(1, 2).unsqueeze(-1)
    want = layer.out_proj(weighted.transpose(1, 2).flatten(-2))
    torch.testing.assert_close(layer(x).detach(), want.detach(), atol=TOL, rtol=0)


def test_moh_balance_loss_enters_the_training_loss_only():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=4, n_embd=16, attention="moh")).double()
    idx = torch.randint(0, 20, (3, 8))
    model.train()
    logits, loss = model(idx, idx)
    ce = torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten())
    aux = model.run(idx).aux_losses
    assert len(aux) == 2 and all(a.requires_grad for a in aux)
    torch.testing.assert_close(loss, ce + sum(aux), atol=TOL, rtol=0)
    model.eval()
    logits, loss = model(idx, idx)
    torch.testing.assert_close(loss, torch.nn.functional.cross_entropy(logits.flatten(0, 1), idx.flatten()))
    assert model.run(idx).aux_losses == []


@pytest.mark.parametrize("variant", ["talking-heads", "moh", "coda"])
def test_head_mixing_with_random_parameters_does_not_leak(variant):
    """Identity mixes and a near-uniform router would hide a leak across heads: randomise every parameter first."""
    model = build(variant, "rope")
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    assert max_leak(model) < LEAK_TOL


@pytest.mark.parametrize("fields, patterns", [
    ({"heads": {"mix": "tlaking"}}, ("heads.mix", "tlaking", "concat")),
    ({"heads": {"mix": "moh", "moh_top_k": 3}, "n_head": 4}, ("moh_top_k=3", "2 routed heads")),
    ({"heads": {"mix": "moh", "moh_shared": 5}, "n_head": 4}, ("moh_shared=5", "n_head=4")),
    ({"heads": "moh", "n_head": 1}, ("n_head=1",)),
    ({"heads": {"moh_top_k": 2}}, ("moh_top_k=2", "mix='moh'")),
    ({"heads": "talking", "backend": "sdpa"}, ("backend='sdpa'", "talking")),
    ({"head_mix": "moh", "moh_top_k": 3, "n_head": 4}, ("moh_top_k=3", "2 routed heads")),  # old flat keys
])
def test_bad_head_mix_settings_get_one_line_errors(fields, patterns):
    one_line_error(lambda: AttentionConfig.from_dict(fields), *patterns)


def test_old_flat_head_keys_are_folded_into_the_table():
    flat = {"head_mix": "moh", "moh_top_k": 1, "moh_balance": 0.0}
    nested = AttentionConfig(heads=HeadMixConfig("moh", moh_top_k=1, moh_balance=0.0))
    assert AttentionConfig.from_dict(flat) == nested
    assert AttentionConfig(heads="coda") == AttentionConfig(heads=HeadMixConfig("coda"))


def test_moh_with_one_head_is_refused_when_the_model_fills_in_n_head():
    one_line_error(lambda: GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8, attention="moh"),
                   "n_head=1")


def test_a_moh_run_logs_its_balance_loss_and_head_usage(tmp_path):
    from attnlab.train import read_metrics, train
    from helpers import tiny

    train(tiny(tmp_path / "run", tmp_path / "cache", model__attention="moh", model__n_head=4, train__max_steps=4,
               train__warmup_steps=2, train__log_interval=2, train__eval_interval=4, train__sample_tokens=0,
               train__track_rank=False), quiet=True)
    rows = {r["step"]: r for r in read_metrics(tmp_path / "run")}
    row = rows[2]
    balances = [v for k, v in row.items() if k.startswith("moh/L") and k.endswith("/balance")]
    assert balances and all(0 < b <= 1 for b in balances)  # sum_i f_i P_i: f, P are distributions over heads
    assert abs(row["moh/aux_loss"] - 0.01 * sum(balances)) < 1e-9
    usage = [v for k, v in row.items() if k.startswith("moh/L0/h")]
    # per token the 2 shared weights sum to 2 a_1 and the k = 1 routed weight is a_2, with a_1 + a_2 = 2
    assert len(usage) == 4 and 2 - 1e-6 <= sum(usage) <= 4 + 1e-6 and all(u >= 0 for u in usage)


def _leaky(z):
    return np.where(z > 0, z, 0.2 * z)


def coda_layer_ref(q, k, v, previous, weights, biases):
    """CODA's layer l >= 2 at evaluation, one (b, i, j) at a time (docs/heads.md, from the authors' code):
    s = q.k / sqrt(d); u = s + a_prev; a = u + f(u), f the MLP across heads; p = softmax over keys j <= i."""
    q, k, v, prev = (np.asarray(t, dtype=np.float64) for t in (q, k, v, previous))
    w = [np.asarray(t.detach(), dtype=np.float64) for t in weights]
    b = [np.asarray(t.detach(), dtype=np.float64) for t in biases]
    b_, h_, t_, d = q.shape
    a = np.zeros((b_, h_, t_, t_))
    for bb in range(b_):
        for i in range(t_):
            for j in range(t_):
                u = np.array([q[bb, h, i] @ k[bb, h, j] / np.sqrt(d) for h in range(h_)]) + prev[bb, :, i, j]
                f = _leaky(w[0] @ u + b[0])
                f = _leaky(w[1] @ f + b[1])
                a[bb, :, i, j] = u + w[2] @ f + b[2]
    out = np.zeros((b_, h_, t_, v.shape[-1]))
    for bb in range(b_):
        for h in range(h_):
            for i in range(t_):
                out[bb, h, i] = _softmax(a[bb, h, i, : i + 1]) @ v[bb, h, : i + 1]
    return out, a


def test_coda_layer_matches_the_cascade_written_out():
    torch.manual_seed(0)
    cfg = get_variant("coda").replace(n_head=4, n_kv_head=4)
    first, second = Attention(cfg, 32, layer=0).double().eval(), Attention(cfg, 32, layer=1).double().eval()
    assert first.head_mlp is None and second.head_mlp is not None
    x0, x1 = torch.randn(2, 6, 32, dtype=torch.float64), torch.randn(2, 6, 32, dtype=torch.float64)
    with torch.no_grad():
        a_prev = first.run(x0).logits  # a^1 = s^1 at evaluation
        q0, k0, _ = first.project(x0)
        torch.testing.assert_close(a_prev, q0 @ k0.transpose(-1, -2) / np.sqrt(8), atol=TOL, rtol=0)
        out = second.run(x1, previous_logits=a_prev)
        y, logits = out.y, out.logits
        q, k, v = second.project(x1)
    heads, a = coda_layer_ref(q, k, v, a_prev, second.head_mlp.weights, second.head_mlp.biases)
    np.testing.assert_allclose(logits.numpy(), a, atol=TOL, rtol=0)
    want = second.out_proj(torch.from_numpy(heads).transpose(1, 2).flatten(-2))
    torch.testing.assert_close(y, want.detach(), atol=TOL, rtol=0)


def test_coda_noise_is_unit_gaussian_in_training_and_absent_at_evaluation():
    from attnlab.mechanisms.heads.functional import cascade_logits

    scores = torch.randn(4, 4, 64, 64, dtype=torch.float64)
    noisy = cascade_logits(scores, None, None, 1.0, generator=torch.Generator().manual_seed(0)) - scores
    assert abs(noisy.mean().item()) < 0.02 and abs(noisy.std().item() - 1) < 0.02  # 65,536 draws: se ~0.004
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=8, n_layer=2, n_head=4, n_embd=16, attention="coda"))
    idx = torch.randint(0, 20, (2, 8))
    assert model(idx, idx)[1] != model(idx, idx)[1]  # training: a fresh sample each forward
    model.eval()
    assert model(idx, idx)[1] == model(idx, idx)[1] and not hasattr(model, "cascade")
