"""Magnitude as a logit prior (magnitude_apply="logits"): the control for the magnitude write-up's argument.

    p_ij proportional to max(w, floor)_ij exp(z_ij),  i.e.  softmax(z_ij + log max(w_ij, floor))     floor = PRIOR_FLOOR

w is mu_j (global), w_j (key j inside its own prefix, "causal") or M_ij (key j inside query i's prefix, "prefix").
The layer is checked against float64 numpy written from that formula, with the weights from numpy solves of
(Z + eps I) mu = 1 (not attnlab's solver), and on the magnitude write-up's hijacking example, whose numbers are closed forms.
"""

import math

import numpy as np
import pytest
import torch

from attnlab import Attention, AttentionConfig, get_variant, variant_info
from attnlab.config import ProjectionConfig
from attnlab.config import MagnitudeConfig
from attnlab.attention_config import route
from attnlab.functional import attention
from attnlab.mechanisms.magnitude import reference as M
from attnlab.mechanisms.magnitude import fused as K
from attnlab.mechanisms.magnitude.module import MagnitudeGate
from helpers import one_line_error

F64 = torch.float64
FLOOR = M.PRIOR_FLOOR


def numpy_weights(keys, t, eps):
    """For keys [S, d]: (mu over all keys [S], w_j inside {1..j} [S], M_ij inside {1..i} [S, S]) by numpy solves."""
    k = np.asarray(keys, dtype=np.float64)
    s, d = k.shape
    z = np.exp(-t * ((k[:, None, :] - k[None, :, :]) ** 2).sum(-1) / d) + eps * np.eye(s)
    m = np.zeros((s, s))
    for i in range(s):
        m[i, : i + 1] = np.linalg.solve(z[: i + 1, : i + 1], np.ones(i + 1))
    return np.linalg.solve(z, np.ones(s)), np.diag(m).copy(), m


def prior_attention_ref(q, k, v, w, causal):
    """o_i = sum_j p_ij v_j with p_ij = max(w_ij, floor) exp(z_ij) / sum_{l visible} max(w_il, floor) exp(z_il),
    z_ij = q_i.k_j / sqrt(d), one query row at a time. q [T, d], k, v [S, d], w [S] (per key) or [T, S]."""
    t_, d = q.shape
    s_ = k.shape[0]
    out, p = np.zeros((t_, v.shape[1])), np.zeros((t_, s_))
    for i in range(t_):
        wi = w if w.ndim == 1 else w[i]
        num = np.array([max(wi[j], FLOOR) * math.exp(q[i] @ k[j] / math.sqrt(d)) if (j <= i or not causal) else 0.0
                        for j in range(s_)])
        p[i] = num / num.sum()
        out[i] = p[i] @ v
    return out, p


# ------------------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize("bad, patterns", [
    ({"magnitude": {"apply": "scores"}}, ["magnitude.apply='scores'", "'values'", "'logits'"]),
    ({"magnitude_apply": "logits"}, ["magnitude_apply", "magnitude is off", "'global', 'causal' or 'prefix'"]),
    ({"magnitude": {"form": "causal", "apply": "logits"}, "normalizer": "none"},
     ["magnitude.apply='logits'", "normalizer='none'", "'softmax'"]),
])
def test_bad_values_give_one_line(bad, patterns):
    one_line_error(lambda: AttentionConfig.from_dict(bad), *patterns)


def test_every_form_takes_the_prior_and_keeps_sdpa():
    assert MagnitudeConfig().apply == "values"  # today's gate stays the default
    for form, causal in (("global", False), ("causal", True), ("prefix", True)):
        cfg = AttentionConfig(magnitude=MagnitudeConfig(form, apply="logits"), causal=causal, backend="sdpa")
        assert route(cfg).path == "sdpa"
    assert route(AttentionConfig(magnitude=MagnitudeConfig("prefix"))).path == "explicit"  # the value gate per (i, j) still does not


def test_variants_are_registered():
    for name, form in (("magnitude-causal-logits", "causal"), ("magnitude-prefix-logits", "prefix")):
        cfg, info = get_variant(name), variant_info(name)
        assert (cfg.magnitude.form, cfg.magnitude.apply, cfg.causal) == (form, "logits", True)
        assert "Magnitude Attention write-up" in info.source and info.notes


def test_the_floor_is_documented_where_it_is_used():
    assert FLOOR == 1e-4
    w = torch.tensor([-3.0, 0.0, 1e-5, 1e-4, 0.5, 2.0], dtype=F64)
    torch.testing.assert_close(M.log_prior(w), torch.tensor([1e-4, 1e-4, 1e-4, 1e-4, 0.5, 2.0], dtype=F64).log())
    from pathlib import Path

    doc = (Path(__file__).parents[1] / "docs" / "magnitude.md").read_text()
    assert "1e-4" in doc and "1e-4" in _field_doc("apply")


def _field_doc(name):
    import inspect

    src = inspect.getsource(MagnitudeConfig)
    return src[src.index(f"    {name}:"):].split('"""')[1]


def test_no_gate_parameters_and_t_learns_through_the_sdpa_mask():
    """The prior has no gate: no beta or gamma. On the SDPA path the prior is the float attn_mask, and the gradient
    reaches log t through it (a fused kernel that dropped the mask's gradient would leave it 0)."""
    base = get_variant("magnitude-causal-logits")
    cfg = base.replace(n_head=2, n_kv_head=1, magnitude=base.magnitude.replace(t=0.5))
    layer = Attention(cfg, 16)
    assert route(cfg).path == "sdpa" and layer.magnitude.beta is None and layer.magnitude.gamma is None
    assert {n for n, _ in layer.magnitude.named_parameters()} == {"log_t"}
    layer(torch.randn(2, 12, 16)).square().sum().backward()
    grad = layer.magnitude.log_t.grad
    assert grad is not None and torch.isfinite(grad) and grad.abs() > 0
    stats = layer.magnitude.last_stats
    assert "gate_mean" not in stats and 0 <= stats["prior_floored"] <= 1


# ------------------------------------------------------------------------------- the layer against numpy


@pytest.mark.parametrize("form, causal", [("global", False), ("causal", True), ("prefix", True)])
@pytest.mark.parametrize("n_kv_head", [2, 1])
@pytest.mark.parametrize("t", [0.6, 0.05])
def test_layer_matches_the_formula_in_float64(form, causal, n_kv_head, t):
    """Weights (explicit path, return_weights) and outputs (SDPA with the float mask, and explicit) against
    p_ij ~ max(w, floor)_ij exp(z_ij) in numpy. t = 0.05 on 9 keys in R^8 gives negative weights, so the floor binds."""
    torch.manual_seed(2)
    eps = 1e-3
    cfg = AttentionConfig(n_head=2, n_kv_head=n_kv_head, causal=causal, magnitude=MagnitudeConfig(form, t=t, eps=eps, apply="logits", allow_future_leak=True))
    layer = Attention(cfg, 16).double().eval()
    t = layer.magnitude.t.item()  # the config's t up to the float32 rounding of the stored log t
    x = torch.randn(2, 9, 16, dtype=F64)
    with torch.no_grad():
        y_sdpa = layer(x)
        y_explicit, p = layer(x, return_weights=True)
        q, k, v = (layer._heads(proj(x), n).numpy() for proj, n in
                   ((layer.q_proj, 2), (layer.k_proj, n_kv_head), (layer.v_proj, n_kv_head)))
    out, want_p = np.zeros((2, 2, 9, 8)), np.zeros((2, 2, 9, 9))
    floored = 0
    for b in range(2):
        for h in range(2):
            g = h // (2 // n_kv_head)
            mu, w, m = numpy_weights(k[b, g], t, eps)
            weights = {"global": mu, "causal": w, "prefix": m}[form]
            floored += int((weights[np.tril_indices(9)] if form == "prefix" else weights).min() < FLOOR)
            out[b, h], want_p[b, h] = prior_attention_ref(q[b, h], k[b, g], v[b, g], weights, causal)
    if t < 0.1:
        assert floored > 0  # the floor is exercised
    want = layer.out_proj(torch.from_numpy(out).transpose(1, 2).flatten(-2))
    np.testing.assert_allclose(p.numpy(), want_p, rtol=1e-10, atol=1e-12)
    for y in (y_sdpa, y_explicit):
        torch.testing.assert_close(y, want, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("variant", ["magnitude-causal-logits", "magnitude-prefix-logits"])
@pytest.mark.parametrize("kernel", ["dot", "rbf"])
def test_sdpa_and_explicit_paths_agree_in_float32(variant, kernel):
    torch.manual_seed(3)
    base = get_variant(variant).replace(n_head=4, n_kv_head=2, kernel=kernel)
    sdpa, explicit = Attention(base.replace(backend="sdpa"), 32), Attention(base.replace(backend="explicit"), 32)
    renorm = Attention(base.replace(mask_form="renormalize"), 32)  # the masking write-up's form 2: the same weights
    explicit.load_state_dict(sdpa.state_dict())
    renorm.load_state_dict(sdpa.state_dict())
    x = torch.randn(2, 40, 32)
    torch.testing.assert_close(sdpa(x), explicit(x), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(renorm(x), explicit(x), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------ the magnitude write-up's hijacking example


def harmonic(m, eps=0.0):
    return sum(1.0 / (r + eps) for r in range(1, m + 1))


@pytest.mark.parametrize("eps", [1e-3, 1e-2])
@pytest.mark.parametrize("form", ["prefix", "causal", "values"])
def test_seed_example_through_the_layer(form, eps):
    """One key with e^z = 20 against 50 exact clones with e^z = 1 (the magnitude write-up): softmax gives it 20/70. The layer
    reads x itself (identity Q, K, V, no W_o, one head of width 4): 50 zero rows (the clones, z = 0), then
    u = (a, 0, 0, 0) with a^2 / sqrt(4) = ln 20, so the last query (u itself) has e^z = 20 on u and 1 on each clone.
    t = 100 puts u far from the clones (Z = e^-150), so the weights are the closed forms: u gets 1/(1 + eps), and
    the r-th clone 1/(50 + eps) in the prefix form (row 51 of M), 1/(r + eps) in the causal form (its own prefix).

    Prefix: p_u = 20 a / (20 a + b), a = 1/(1 + eps), b = 50/(50 + eps). At eps = 0 that is 20/21; b/a = 1 + r with
    r = eps 49/(50 + eps) in [0, eps), so 0 <= 20/21 - p_u = 20 r / (21 (20 + b/a)) <= 20 eps / 441: the tolerance.
    Causal: p_u = 20 a / (20 a + S), S = sum_r 1/(r + eps): at eps = 0, 20/(20 + H_50) = 0.8163. With
    c = (1 + eps) S, H_50 - eps pi^2/6 <= S <= H_50 gives |c - H_50| <= eps H_50 (+ eps^2), so
    |p_u - 20/(20 + H_50)| <= 20 eps H_50 / (20 + H_50)^2 (+ eps^2): the tolerance.
    "values" (the gate on the values) leaves the weights at softmax's 20/70."""
    a = math.sqrt(2 * math.log(20))
    cfg = AttentionConfig(n_head=1, n_kv_head=1, projections=ProjectionConfig(q_mode="identity", k_mode="identity", v_mode="identity", out_proj=False), bias=False, magnitude=MagnitudeConfig("prefix" if form == "values" else form, apply="values" if form == "values" else "logits", t=100.0, eps=eps))
    layer = Attention(cfg, 4).double().eval()
    x = torch.zeros(1, 51, 4, dtype=F64)
    x[0, 50, 0] = a
    with torch.no_grad():
        _, p = layer(x, return_weights=True)
        y = layer(x)  # SDPA (float mask) for the logits forms; v = x, so the last output is p_u * u
    p_u, clones = p[0, 0, 50, 50].item(), p[0, 0, 50, :50]
    h50 = harmonic(50)
    if form == "values":
        assert p_u == pytest.approx(20 / 70, abs=1e-12)
        return
    if form == "prefix":
        exact = 20 / (1 + eps) / (20 / (1 + eps) + 50 / (50 + eps))
        ideal, tol = 20 / 21, 20 * eps / 441
        torch.testing.assert_close(clones, torch.full_like(clones, (1 - p_u) / 50), rtol=1e-9, atol=0)
        assert p_u <= ideal
    else:
        exact = 20 / (1 + eps) / (20 / (1 + eps) + harmonic(50, eps))
        ideal, tol = 20 / (20 + h50), 20 * eps * h50 / (20 + h50) ** 2 + eps ** 2
        want = torch.tensor([1 / (r + eps) for r in range(1, 51)], dtype=F64) * (p_u * (1 + eps) / 20)
        torch.testing.assert_close(clones, want, rtol=1e-9, atol=0)  # clone r's share is 1/(r + eps): harmonic
    assert p_u == pytest.approx(exact, abs=1e-9)
    assert abs(p_u - ideal) <= tol
    assert y[0, 50, 0].item() == pytest.approx(p_u * a, abs=1e-9)


@pytest.mark.parametrize("form", ["prefix", "causal"])
@pytest.mark.parametrize("where", [0, 25, 50])
def test_seed_example_in_any_order(form, where):
    """The unique key at position 0, 25 or 50 among the 50 clones, read by a last query with e^z = 20 on it and 1
    on the clones: since u is far from the clones (Z = e^-150), the two blocks decouple and the order does not
    matter; the prefix form gives 20/21, the causal form 20/(20 + H_50) (at eps = 1e-6, within 1e-5)."""
    a, eps = math.sqrt(2 * math.log(20)), 1e-6
    keys = torch.zeros(1, 1, 51, 4, dtype=F64)
    keys[0, 0, where, 0] = a
    q = torch.zeros(1, 1, 51, 4, dtype=F64)
    q[..., 0] = a  # q.u / sqrt(4) = ln 20, q.clone = 0
    prior = MagnitudeGate(form, t=100.0, eps=eps, apply_to="logits").double()(keys)
    _, p = attention(q, keys, keys, causal=True, logit_prior=prior, return_weights=True)
    want = 20 / 21 if form == "prefix" else 20 / (20 + harmonic(50))
    assert p[0, 0, 50, where].item() == pytest.approx(want, abs=1e-5)


# --------------------------------------------------------------------------------------------------- gradients


@pytest.mark.parametrize("form", ["causal", "prefix"])
@pytest.mark.parametrize("backend", ["sdpa", "explicit"])
def test_gradcheck_through_the_prior(form, backend, monkeypatch):
    """float64 gradcheck of (q, k, v, t) -> attention(q, k, v, prior = log max(w(k, t), floor)) on both paths
    (GQA: 2 query heads on 1 K/V head); BLOCK = 4 makes the fused kernel's recursion run. The prefix form has
    negative weights here (floored: gradient 0 through them), the causal form none."""
    monkeypatch.setattr(K, "BLOCK", 4)
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 2, 7, 3, generator=g, dtype=F64, requires_grad=True)
    k, v = (torch.randn(1, 1, 7, 3, generator=g, dtype=F64, requires_grad=True) for _ in range(2))
    t = torch.tensor(0.9, dtype=F64, requires_grad=True)

    def fn(q, k, v, t):
        w = K.gaussian_key_weights(k, t, 1e-2, form=form)[0]
        seen = w[..., torch.ones(7, 7, dtype=torch.bool).tril()] if form == "prefix" else w
        assert (seen - FLOOR).abs().min() > 1e-3  # away from the clamp's kink (gradcheck steps by 1e-6)
        return attention(q, k, v, causal=True, logit_prior=M.log_prior(w), backend=backend)

    assert torch.autograd.gradcheck(fn, (q, k, v, t))


def test_prior_arguments_are_checked():
    q = torch.randn(1, 2, 5, 3)
    with pytest.raises(ValueError, match="logit_prior must have shape"):
        attention(q, q, q, causal=True, logit_prior=torch.zeros(1, 2, 4))
    with pytest.raises(ValueError, match="normalizer='softmax'"):
        attention(q, q, q, causal=True, normalizer="none", logit_prior=torch.zeros(1, 2, 5))


def test_hijack_share_against_m_matches_closed_forms():
    """attnlab.experiments.magnitude_demo.hijack_share_against_m (the mechanism table of the capability study)
    against the closed forms, written from the formulas: the clones sit far from the unique key (Z ~ 1e-11 between
    them), so the unique key's weight is a = 1/(1 + eps), a clone's 1/(m + eps) in the prefix form and the r-th
    clone's 1/(r + eps) in the causal form. Share of the unique key, s = 20: softmax s/(s + m); linear gate and
    logit prior s a / (s a + sum_c w_c); clamp gate s sig(a) / (s sig(a) + sum_c sig(w_c)). Tolerance 1e-9: the
    closed forms drop only the e^-25 coupling between the clones and the unique key."""
    from attnlab.experiments.magnitude_demo import hijack_share_against_m

    eps, s = 1e-3, 20.0
    sig = lambda x: 1 / (1 + math.exp(-x))
    a = 1 / (1 + eps)
    for m, row in hijack_share_against_m((0, 4, 16, 64), s, eps).items():
        clones = {"prefix": [1 / (m + eps)] * m, "causal": [1 / (r + eps) for r in range(1, m + 1)]}
        assert row["softmax"] == pytest.approx(s / (s + m), abs=1e-12)
        for form, w in clones.items():
            linear = s * a / (s * a + sum(w))
            assert row[f"logits/{form}"] == pytest.approx(linear, abs=1e-9)
            assert row[f"values/{form}/linear"] == pytest.approx(linear, abs=1e-9)
            clamp = s * sig(a) / (s * sig(a) + sum(map(sig, w)))
            assert row[f"values/{form}/clamp"] == pytest.approx(clamp, abs=1e-9)
    assert row["logits/prefix"] > 0.95 > row["logits/causal"] > 0.8 > row["values/prefix/clamp"] > row["softmax"]
