"""Magnitude attention (the magnitude write-up) in the model: config, the gate module, the attention layer, causality, gradients.

The layer is checked against an independent float64 computation: Z from explicit differences in numpy, the weights
from numpy solves of (Z + eps I) mu = 1 (over all keys, over key j's own prefix, over query i's prefix), the
attention weights from tests/reference.py. Only rounding separates them: 1e-10.
"""

import math
import warnings

import numpy as np
import pytest
import torch

from attnlab import GPT, Attention, AttentionConfig, GPTConfig, get_variant, variant_info
from attnlab.config import MagnitudeConfig
from attnlab.attention_config import route
from attnlab.functional import attention, uses_sdpa
from attnlab.mechanisms.magnitude import reference as M
from attnlab.mechanisms.magnitude import fused as K
from attnlab.mechanisms.magnitude.module import MagnitudeGate, magnitude_stats
from helpers import LEAK_TOL, attention_ref, build, max_leak, one_line_error, tiny

F64 = torch.float64


def numpy_weights(keys, t, eps):
    """For keys [S, d]: (mu over all keys [S], w_j inside {1..j} [S], M_ij inside {1..i} [S, S]) by numpy solves."""
    k = np.asarray(keys, dtype=np.float64)
    s, d = k.shape
    z = np.exp(-t * ((k[:, None, :] - k[None, :, :]) ** 2).sum(-1) / d) + eps * np.eye(s)
    mu = np.linalg.solve(z, np.ones(s))
    m = np.zeros((s, s))
    for i in range(s):
        m[i, : i + 1] = np.linalg.solve(z[: i + 1, : i + 1], np.ones(i + 1))
    return mu, np.diag(m).copy(), m


def numpy_gate(w, beta, gamma, form):
    sig = lambda a: 1 / (1 + np.exp(-a))
    return {"sigmoid": sig(beta * w + gamma), "clamp": sig(beta * np.clip(w, 0, 1) + gamma),
            "linear": np.clip(beta * w + gamma, 0, 1)}[form]


# ------------------------------------------------------------------------------------------------------- config


def test_defaults_keep_todays_behaviour():
    cfg = AttentionConfig()
    assert cfg.magnitude is None and route(cfg).path == "sdpa"
    assert Attention(cfg.replace(n_head=2, n_kv_head=2), 16).magnitude is None


@pytest.mark.parametrize("bad, patterns", [
    ({"magnitude": "on"}, ["form='on'", "'global'", "'causal'", "'prefix'"]),
    ({"magnitude": {"t": 0.0}}, ["magnitude.t=0.0", "> 0"]),
    ({"magnitude": {"eps": -1e-3}}, ["magnitude.eps=-0.001", ">= 0"]),
    ({"magnitude": {"kernel": "cosine"}}, ["magnitude.kernel='cosine'", "'laplacian'"]),
    ({"magnitude": {"solver": "lu"}}, ["magnitude.solver='lu'", "'cg'"]),
    ({"magnitude": {"cg_iters": 0}}, ["magnitude.cg_iters=0", ">= 1"]),
    ({"magnitude": {"gate": "tanh"}}, ["magnitude.gate='tanh'", "'sigmoid'", "'clamp'"]),
    ({"magnitude": {"beta": "big"}}, ["magnitude.beta='big'", "number"]),
    ({"magnitude": {"allow_future_leak": "yes"}}, ["allow_future_leak='yes'", "true or false"]),
    ({"magnitude": "global"}, ["form='global'", "causal=true", "leaks the future", "allow_future_leak=true"]),
    ({"magnitude": {"form": "causal", "solver": "cg"}}, ["form='causal'", "solver='cholesky'"]),
    ({"magnitude": "prefix", "causal": False}, ["form='prefix'", "causal=true"]),
    ({"magnitude": "prefix", "backend": "sdpa"}, ["backend='sdpa'", "form 'prefix'"]),
    ({"magnitude_t": 2.0}, ["magnitude_t", "magnitude is off"]),  # an old flat key without a form
])
def test_bad_magnitude_values(bad, patterns):
    one_line_error(lambda: AttentionConfig.from_dict(bad), *patterns)


def test_old_flat_magnitude_keys_are_folded_into_the_table():
    """Older configs wrote the switches flat (magnitude = "prefix", magnitude_t = 2.0, allow_future_leak = true):
    from_dict, TOML files and overrides fold them into the magnitude table, the same config as the nested form."""
    flat = {"magnitude": "global", "magnitude_t": 2.0, "magnitude_gate": "seed", "allow_future_leak": True}
    nested = AttentionConfig(magnitude=MagnitudeConfig("global", t=2.0, gate="sigmoid", allow_future_leak=True))
    assert AttentionConfig.from_dict(flat) == nested
    assert AttentionConfig.from_dict({"magnitude": "off"}) == AttentionConfig()
    assert AttentionConfig(magnitude="causal") == AttentionConfig(magnitude=MagnitudeConfig("causal"))
    assert GPTConfig(n_head=2, n_embd=16, attention=flat).resolved_attention().magnitude == nested.magnitude


def test_global_form_is_refused_in_a_causal_gpt_unless_opted_in():
    one_line_error(lambda: GPTConfig(n_head=2, n_embd=16, attention={"magnitude": "global"}), "leaks the future")
    GPTConfig(n_head=2, n_embd=16, attention={"magnitude": "global", "allow_future_leak": True})
    GPTConfig(n_head=2, n_embd=16, attention={"magnitude": "global", "causal": False})


def test_per_key_forms_keep_sdpa_and_the_prefix_form_does_not():
    assert route(AttentionConfig(magnitude=MagnitudeConfig("causal"), backend="sdpa")).path == "sdpa"
    assert route(AttentionConfig(magnitude=MagnitudeConfig("global"), causal=False, backend="sdpa")).path == "sdpa"
    assert route(AttentionConfig(magnitude=MagnitudeConfig("prefix"))).path == "explicit"


def test_variants_are_registered_with_notes():
    assert get_variant("magnitude-causal").magnitude == MagnitudeConfig("causal")
    assert get_variant("magnitude-prefix").magnitude == MagnitudeConfig("prefix")
    for name in ("magnitude-causal", "magnitude-prefix"):
        info = variant_info(name)
        assert "Magnitude Attention write-up" in info.source and info.notes and info.config.causal


# ------------------------------------------------------------------------------------------ value_gate in attention


@pytest.mark.parametrize("h_kv", [4, 2])
def test_value_gate_multiplies_each_weight(h_kv):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, h, 6, 5, generator=g, dtype=F64) for h in (4, h_kv, h_kv))
    gate = torch.rand(2, h_kv, 6, 6, generator=g, dtype=F64)
    _, p = attention_ref(q, k, v, causal=True)
    want = (p * np.repeat(gate.numpy(), 4 // h_kv, axis=1)) @ np.repeat(v.numpy(), 4 // h_kv, axis=1)
    out, w = attention(q, k, v, causal=True, value_gate=gate, return_weights=True)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(w.numpy(), p, rtol=1e-10, atol=1e-12)  # the returned weights stay p
    torch.testing.assert_close(attention(q, k, v, causal=True, value_gate=torch.ones_like(gate)),
                               attention(q, k, v, causal=True), rtol=1e-12, atol=1e-12)
    assert not uses_sdpa(causal=True, value_gate=True)
    with pytest.raises(ValueError, match="value_gate"):
        attention(q, k, v, causal=True, value_gate=gate, backend="sdpa")
    with pytest.raises(ValueError, match="shape"):
        attention(q, k, v, causal=True, value_gate=gate[..., :5])


# --------------------------------------------------------------------------------------------- the gate module


def test_t_stays_positive_and_everything_learns():
    gate = MagnitudeGate("causal", t=0.5).double()
    assert gate.t.item() == pytest.approx(0.5)
    k = torch.randn(2, 3, 8, 4, dtype=F64)
    gate(k).sum().backward()
    for p in (gate.log_t, gate.beta, gate.gamma):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs() > 0
    with torch.no_grad():
        gate.log_t.fill_(-60.0)  # any real log t is a positive t
    assert gate.t.item() > 0


@pytest.mark.parametrize("form, solver", [("global", "cholesky"), ("global", "cg"), ("causal", "cholesky"),
                                          ("prefix", "cholesky")])
def test_last_stats_are_the_logged_quantities(form, solver):
    k = torch.randn(2, 3, 10, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    gate = MagnitudeGate(form, t=0.8, eps=1e-3, solver=solver, cg_iters=3).double()
    g = gate(k)
    s = gate.last_stats
    t = gate.t.item()  # 0.8 up to the float32 rounding of the stored log t
    mags, lo, hi = [], [], []
    for kb in k.reshape(-1, 10, 4).numpy():
        mu, w, m = numpy_weights(kb, t, 1e-3)
        mags.append(mu.sum())
        weights = {"global": mu, "causal": w, "prefix": m[np.tril_indices(10)]}[form]
        lo.append(weights.min())
        hi.append(weights.max())
    assert s["t"] == pytest.approx(0.8, rel=1e-6)
    assert s["magnitude_over_n"] == pytest.approx(np.mean(mags) / 10, rel=1e-9 if solver == "cholesky" else 0.2)
    if solver == "cholesky":
        assert s["residual"] < 1e-12 and s["mu_min"] == pytest.approx(min(lo)) and s["mu_max"] == pytest.approx(max(hi))
    else:  # CG truncated at 3 iterations: the residual is reported, not hidden
        assert 1e-4 < s["residual"] < 1
    assert s["jitter"] == 0 and 0 < s["gate_mean"] < 1
    assert g.shape == ((2, 3, 10, 10) if form == "prefix" else (2, 3, 10))


# ------------------------------------------------------------------------------- the layer against numpy


@pytest.mark.parametrize("form, gate, causal", [("global", "sigmoid", False), ("global", "clamp", True),
                                                ("causal", "clamp", True), ("causal", "linear", True),
                                                ("prefix", "sigmoid", True), ("prefix", "clamp", True)])
@pytest.mark.parametrize("n_kv_head", [2, 1])
def test_layer_matches_independent_float64_computation(form, gate, causal, n_kv_head):
    torch.manual_seed(2)
    t, eps, beta, gamma = 0.6, 1e-3, 2.0, -0.5
    cfg = AttentionConfig(n_head=2, n_kv_head=n_kv_head, causal=causal, magnitude=MagnitudeConfig(form, t=t, eps=eps, gate=gate, beta=beta, gamma=gamma, allow_future_leak=True))
    layer = Attention(cfg, 16).double().eval()
    t = layer.magnitude.t.item()  # the config's t up to the float32 rounding of the stored log t
    x = torch.randn(2, 7, 16, dtype=F64)
    with torch.no_grad():
        y = layer(x)
        q, k, v = (layer._heads(p(x), n).numpy() for p, n in
                   ((layer.q_proj, 2), (layer.k_proj, n_kv_head), (layer.v_proj, n_kv_head)))
        out_proj = layer.out_proj
    gates = np.zeros(k.shape[:2] + ((7, 7) if form == "prefix" else (7,)))
    for b in range(2):
        for h in range(n_kv_head):
            mu, w, m = numpy_weights(k[b, h], t, eps)
            gates[b, h] = numpy_gate({"global": mu, "causal": w, "prefix": m}[form], beta, gamma, gate)
    if form == "prefix":
        _, p = attention_ref(q, k, v, causal=causal)
        out = (p * np.repeat(gates, 2 // n_kv_head, axis=1)) @ np.repeat(v, 2 // n_kv_head, axis=1)
    else:
        out, _ = attention_ref(q, k, v * gates[..., None], causal=causal)
    want = out_proj(torch.from_numpy(out).transpose(1, 2).flatten(-2))
    torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("form", ["causal", "global"])
def test_per_key_forms_give_the_same_output_on_sdpa_and_explicit_paths(form):
    torch.manual_seed(3)
    base = AttentionConfig(n_head=2, n_kv_head=2, magnitude=MagnitudeConfig(form), causal=form == "causal")
    sdpa, explicit = Attention(base.replace(backend="sdpa"), 16), Attention(base.replace(backend="explicit"), 16)
    explicit.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 9, 16)
    torch.testing.assert_close(sdpa(x), explicit(x), rtol=1e-5, atol=1e-6)  # float32 rounding of two paths


# ------------------------------------------------------------------------------------------------- causality


def test_the_seed_as_written_leaks_the_future_when_opted_in():
    """The global form over all keys, in a causal GPT (allow_future_leak=True): the causal leak test catches it."""
    leak = max_leak(build(AttentionConfig(magnitude=MagnitudeConfig("global", allow_future_leak=True))))
    assert leak > 10 * LEAK_TOL
    cg = max_leak(build(AttentionConfig(magnitude=MagnitudeConfig("global", solver="cg", gate="sigmoid", allow_future_leak=True))))
    assert cg > 10 * LEAK_TOL


@pytest.mark.parametrize("form", ["causal", "prefix"])
def test_the_jitter_retry_is_causal(form):
    """eps = 0 and duplicates only after position 5: the factorisation fails there and is retried with jitter from
    the failing pivot on. The gates of positions <= 5 must be bit-identical to those of a future without duplicates
    (a jitter on the whole diagonal would move them, by ~1e-16: rounding-sized, but a leak)."""
    _assert_jitter_keeps_prefix(form, seed=4, n_early=6, repeats=[0, 1, 0, 2])  # keys 7..10 repeat keys 1, 2, 1, 3


def _assert_jitter_keeps_prefix(form, seed, n_early, repeats):
    """Gates of the first n_early keys: bit-identical whether later keys repeat earlier ones (eps = 0, so the
    factorisation fails and is retried with jitter) or are new random keys."""
    g = torch.Generator().manual_seed(seed)
    early = torch.randn(1, 2, n_early, 4, generator=g, dtype=F64)
    dup_future = torch.cat([early, early[:, :, repeats]], dim=2)
    new_future = torch.cat([early, torch.randn(1, 2, len(repeats), 4, generator=g, dtype=F64)], dim=2)
    gate = MagnitudeGate(form, eps=0.0).double()
    with pytest.warns(RuntimeWarning, match="jitter"):
        a = gate(dup_future)
    assert gate.last_stats["jitter"] > 0
    b = gate(new_future)
    head = (..., slice(0, n_early), slice(None)) if form == "prefix" else (..., slice(0, n_early))
    assert torch.equal(a[head], b[head])


@pytest.mark.parametrize("variant", ["magnitude-causal", "magnitude-prefix", "magnitude-causal-logits",
                                     "magnitude-prefix-logits"])
def test_no_leak_with_exact_duplicate_keys(variant):
    """Repeated tokens with RoPE are exact duplicate keys (the gate reads the keys before rotation). With eps = 0
    a future full of repeats makes the factorisation fail and a future without repeats does not: no leak either way."""
    base = get_variant(variant)
    model = build(base.replace(magnitude=base.magnitude.replace(eps=0.0)), "rope").double().eval()
    idx = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 8, 1, 1, 2, 2, 3, 3, 1, 1]] * 2)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        base = model(idx)[0]
        for i in (3, 7):
            fresh = idx.clone()
            fresh[:, i + 1:] = torch.arange(20, 20 + 15 - i)  # distinct tokens: no duplicate keys
            assert (model(fresh)[0][:, : i + 1] - base[:, : i + 1]).abs().max() < LEAK_TOL
    assert any("jitter" in str(w.message) for w in caught)  # the retry did run


# --------------------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("form", ["global", "causal", "prefix"])
@pytest.mark.parametrize("gate", ["clamp", "sigmoid", "linear"])
def test_training_step_is_finite_with_repeated_tokens(form, gate):
    """float32, a sequence of one repeated token (all keys identical) and near-copies: loss and every gradient
    finite, at the default eps; stats recorded per layer."""
    attn = dict(magnitude=MagnitudeConfig(form, gate=gate, allow_future_leak=True))
    model = GPT(GPTConfig(vocab_size=11, block_size=12, n_layer=2, n_head=2, n_embd=16, pos_encoding="rope",
                          attention=attn))
    idx = torch.tensor([[3] * 12, [3, 3, 3, 4, 3, 3, 3, 3, 4, 3, 3, 3]])
    _, loss = model(idx, idx)
    loss.backward()
    assert torch.isfinite(loss)
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    stats = magnitude_stats(model)
    for layer in (0, 1):
        for key in ("t", "magnitude_over_n", "residual", "mu_min", "mu_max"):
            assert math.isfinite(stats[f"blocks.{layer}.attn.magnitude.{key}"])


def test_gate_is_solved_in_float32_under_bfloat16_autocast():
    gate = MagnitudeGate("prefix")
    k = torch.randn(2, 2, 9, 4)
    want = gate(k)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = gate(k)
        got_half = gate(k.bfloat16())
    assert got.dtype == torch.float32 and torch.equal(got, want)
    torch.testing.assert_close(got_half, want, rtol=0, atol=0.05)  # bfloat16 keys: ~3 significant digits


# ---------------------------------------------------------------------------------------------------- training


def test_training_logs_each_layers_stats_on_logged_steps_only(tmp_path, monkeypatch):
    """model.attention=magnitude-causal: every row of a trained step carries mag/L<i>/<stat> for both layers, finite,
    t > 0, |X|/N in (0, 1]; the gates record on the logged steps only (eval and the other steps pay nothing)."""
    from attnlab.train import read_metrics, train

    recorded = []
    record = MagnitudeGate._record
    monkeypatch.setattr(MagnitudeGate, "_record", lambda self, *args: (recorded.append(1), record(self, *args)))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model gains nothing from threads
    try:
        train(tiny(tmp_path / "run", tmp_path / "cache", model__attention="magnitude-causal", train__max_steps=6,
                   train__log_interval=3, train__eval_interval=0, train__sample_tokens=0), quiet=True)
    finally:
        torch.set_num_threads(threads)
    rows = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [3, 6]
    for row in rows:
        for layer in (0, 1):
            s = {key: row[f"mag/L{layer}/{key}"] for key in ("t", "magnitude_over_n", "residual", "mu_min", "mu_max")}
            assert all(isinstance(v, float) and math.isfinite(v) for v in s.values()), s
            assert s["t"] > 0 and 0 < s["magnitude_over_n"] <= 1 and s["mu_min"] <= s["mu_max"] and s["residual"] < 1e-3
    assert len(recorded) == 2 * 2  # two logged steps x two layers; not on steps 1, 2, 4, 5 nor in the evaluation


# ------------------------------------------------------------------------------ the fused fast path of the gate


def _general_weights(keys, t, eps, form, solver, max_iter=5):
    """The gate's weights from the general functions (similarity, solve_weights, prefix_factor, ...)."""
    z = M.similarity(keys, t)
    if form == "global":
        return M.solve_weights(z, eps, solver=solver, max_iter=max_iter)[0]
    L, y, _ = M.prefix_factor(z, eps)
    return M.own_prefix_weights_from_factor(L, y) if form == "causal" else M.prefix_weight_matrix_from_factor(L, y)


FAST_FORMS = [("global", "cholesky"), ("global", "cg"), ("causal", "cholesky"), ("prefix", "cholesky")]


@pytest.mark.parametrize("form, solver", FAST_FORMS)
@pytest.mark.parametrize("n, block, chunk_bytes", [(10, 64, 2**24), (150, 64, 2**24), (40, 8, 4000)])
def test_fast_path_is_the_general_functions_in_float64(form, solver, n, block, chunk_bytes, monkeypatch):
    """gaussian_key_weights (one matmul for Z, L^-1 by recursion on halves, hand-derived gradients, chunks of the
    batch) against the composition of the general functions, differentiated by autograd: weights, |X| and the
    gradients in keys and t agree to rounding (1e-9 of the largest entry; cond(Z + eps I) < 1e4 here). Small
    BLOCK / CHUNK_BYTES make the recursion and the chunk loop run at small sizes."""
    monkeypatch.setattr(K, "BLOCK", block)
    monkeypatch.setattr(K, "CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(5)
    keys = torch.randn(2, 3, n, 8, generator=g, dtype=F64, requires_grad=True)
    t = torch.tensor(0.7, dtype=F64, requires_grad=True)
    want = _general_weights(keys, t, 1e-3, form, solver)
    got, mag, info = K.gaussian_key_weights(keys, t, 1e-3, form=form, solver=solver, max_iter=5, with_residual=True)
    r = torch.randn(got.shape, generator=g, dtype=F64)  # prefix: M_ij above the diagonal is a constant 0
    grads_want = torch.autograd.grad((want * r).sum(), (keys, t))
    grads_got = torch.autograd.grad((got * r).sum(), (keys, t))
    for a, b in ((got, want), *zip(grads_got, grads_want)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9 * b.abs().max().item())
    want_mag = want.sum(-1) if form == "global" else M.magnitude(keys.detach(), t.detach(), eps=1e-3)
    torch.testing.assert_close(mag, want_mag, rtol=1e-9, atol=0)
    assert info.jitter.shape == (2, 3, n) and info.residual.shape == (2, 3)
    assert (info.residual < 1e-12).all() if solver == "cholesky" else (info.residual > 1e-6).all()


@pytest.mark.parametrize("form, solver", [*FAST_FORMS[:-1], pytest.param(*FAST_FORMS[-1], marks=pytest.mark.slow)])
def test_fast_path_gradcheck(form, solver, monkeypatch):
    monkeypatch.setattr(K, "BLOCK", 4)
    monkeypatch.setattr(K, "CHUNK_BYTES", 2000)  # one matrix per chunk
    keys = torch.randn(3, 11, 3, generator=torch.Generator().manual_seed(6), dtype=F64, requires_grad=True)
    t = torch.tensor(0.9, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda k, t: K.gaussian_key_weights(k, t, 1e-2, form=form, solver=solver)[0],
                                    (keys, t))


@pytest.mark.parametrize("form", ["causal", "prefix"])
def test_fast_path_jitter_retry_is_causal_across_blocks(form, monkeypatch):
    """As test_the_jitter_retry_is_causal, with the recursion on: BLOCK = 4 splits 12 keys 8 | 4 and 4 | 4, and the
    duplicates after key 9 make the Schur complement of the last block fail; gates of keys <= 9 stay bit-identical."""
    monkeypatch.setattr(K, "BLOCK", 4)
    _assert_jitter_keeps_prefix(form, seed=7, n_early=9, repeats=[0, 4, 7])


@pytest.mark.parametrize("form", ["global", "causal", "prefix"])
def test_fast_path_float32_error(form):
    """The model runs the gate in float32 (no float64 upcast). At N = 256 iid keys in R^64, t = 1, eps = 1e-3 (the
    defaults) the float32 weights are within 2e-5 of the float64 ones (relative to the largest; measured 2e-6) and the
    clamp gates within 1e-5 (measured 5e-7). Harder keys lose more: rank-4 or clustered keys at t = 0.1 reach 2e-3
    in the Cholesky forms, as the general functions do in float32 (truncated CG in float32 can differ by 10% and more:
    its first residual cancels; not asserted here)."""
    keys = torch.randn(4, 256, 64, generator=torch.Generator().manual_seed(8), dtype=F64)
    w64 = _general_weights(keys, 1.0, 1e-3, form, "cholesky")
    w32 = K.gaussian_key_weights(keys.float(), 1.0, 1e-3, form=form)[0]
    assert w32.dtype == torch.float32
    assert ((w32.double() - w64).abs().max() / w64.abs().max()).item() < 2e-5
    assert (M.gate(w32.double(), 1.0, 0.0) - M.gate(w64, 1.0, 0.0)).abs().max().item() < 1e-5


def test_the_gate_once_named_seed_is_still_accepted_as_sigmoid():
    """Old configs wrote magnitude_gate="seed" for the write-up's sigmoid(beta w + gamma): the config stores today's
    name, and the function takes either; the value is the closed form."""
    assert AttentionConfig(magnitude=MagnitudeConfig("causal", gate="seed")).magnitude.gate == "sigmoid"
    w = torch.tensor([-2.0, 0.25, 3.0], dtype=torch.float64)
    want = 1.0 / (1.0 + np.exp(-(1.5 * w.numpy() - 0.5)))
    for name in ("seed", "sigmoid"):
        np.testing.assert_allclose(M.gate(w, 1.5, -0.5, name).numpy(), want, rtol=1e-15)
