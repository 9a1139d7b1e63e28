"""The low-rank causal magnitude solver (attnlab.mechanisms.magnitude.lowrank) against independent
references: a dense float64 solve of every prefix system of the same approximated matrix, the exact Cholesky prefix
forms of attnlab.mechanisms.magnitude.reference, and the exact similarity when the landmarks are the points themselves."""

import numpy as np
import pytest
import torch

from attnlab.mechanisms.magnitude.reference import prefix_factor, prefix_weight_matrix_from_factor, similarity
from attnlab.config import MagnitudeConfig
from attnlab.mechanisms.magnitude.reference import own_prefix_weights_from_factor, prefix_weights
from attnlab.mechanisms.magnitude.lowrank import lowrank_prefix, nystrom_features, prefix_weight_matrix_lowrank


def _problem(seed=0, batch=2, n=37, r=6, dim=5, t=0.7, eps=0.01):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, n, dim, generator=g, dtype=torch.float64)
    landmarks = torch.randn(batch, r, dim, generator=g, dtype=torch.float64)
    phi, d = nystrom_features(x, landmarks, t)
    return x, landmarks, phi, d + eps


@pytest.mark.parametrize("chunk", [1, 5, 8, 64])
def test_every_prefix_matches_a_dense_float64_solve_of_the_same_matrix(chunk):
    """For A = diag(lam) + Phi Phi' and every prefix i, np.linalg.solve(A_i, 1) gives mu^(i): its last entry is w_i,
    it is row i of M, and its sum is cumsum(y^2)_i. Tolerance 1e-10: the systems have cond < 1e3 here, so float64
    rounding stays near 1e-13; any error in the block algebra is of order 1. Chunk sizes that divide T = 37, that
    do not, and that exceed it."""
    _, _, phi, lam = _problem()
    w, y, c = lowrank_prefix(phi, lam, chunk)
    m = prefix_weight_matrix_lowrank(phi, lam, c)
    a = (torch.diag_embed(lam) + phi @ phi.mT).numpy()
    for b in range(a.shape[0]):
        for i in range(1, a.shape[1] + 1):
            mu = np.linalg.solve(a[b, :i, :i], np.ones(i))
            assert abs(w[b, i - 1].item() - mu[-1]) < 1e-10
            np.testing.assert_allclose(m[b, i - 1, :i].numpy(), mu, rtol=0, atol=1e-10)
            assert np.all(m[b, i - 1, i:].numpy() == 0)
            assert abs((y[b, :i] ** 2).sum().item() - mu.sum()) < 1e-10
            # c_i = S_i^-1 u_i = Phi_i' mu^(i) (Woodbury)
            np.testing.assert_allclose(c[b, i - 1].numpy(), phi[b, :i].numpy().T @ mu, rtol=0, atol=1e-10)


def test_agrees_with_the_exact_cholesky_prefix_forms_on_the_approximated_similarity():
    """prefix_factor (one dense Cholesky of Z + eps I) on Z = Phi Phi' + D gives the same w and M."""
    _, _, phi, lam = _problem(seed=1, n=50, r=8)
    eps = 0.01
    z = phi @ phi.mT + torch.diag_embed(lam - eps)
    L, y_exact, _ = prefix_factor(z, eps)
    w, y, c = lowrank_prefix(phi, lam, chunk=16)
    torch.testing.assert_close(w, own_prefix_weights_from_factor(L, y_exact), rtol=0, atol=1e-10)
    torch.testing.assert_close(y, y_exact, rtol=0, atol=1e-10)
    torch.testing.assert_close(prefix_weight_matrix_lowrank(phi, lam, c),
                               prefix_weight_matrix_from_factor(L, y_exact), rtol=0, atol=1e-10)


def test_nystrom_features_bound_the_kernel_and_are_exact_with_the_points_as_landmarks():
    """Phi Phi' <= Z in the PSD order (so d = 1 - ||phi||^2 is in [0, 1] and Phi Phi' + D has the exact unit diagonal);
    with the points themselves as landmarks, Phi Phi' = Z up to the landmark jitter, and the weights are the exact
    prefix weights of the magnitude write-up's similarity (prefix_weights) to 1e-6 (jitter 1e-6 against cond(Z) ~ 1e2 here)."""
    x, landmarks, phi, _ = _problem(n=30, r=10)
    t = 0.7
    z = similarity(x, t)
    _, d = nystrom_features(x, landmarks, t)
    assert torch.linalg.eigvalsh(z - phi @ phi.mT).min() > -1e-10
    assert d.min() >= 0 and d.max() <= 1
    torch.testing.assert_close(torch.diagonal(phi @ phi.mT + torch.diag_embed(d), dim1=-2, dim2=-1),
                               torch.ones_like(d), rtol=0, atol=1e-12)
    x_small = x[:, :12]
    phi_all, d_all = nystrom_features(x_small, x_small, t)
    torch.testing.assert_close(phi_all @ phi_all.mT, similarity(x_small, t), rtol=0, atol=1e-5)
    eps = 0.1
    w, _, _ = lowrank_prefix(phi_all, d_all + eps, chunk=4)
    torch.testing.assert_close(w, prefix_weights(x_small, t, eps=eps), rtol=0, atol=1e-4)


def test_outputs_before_a_perturbed_key_do_not_change():
    """Causality: perturbing key k changes no w_j, y_j, c_j for j < k (k inside a chunk, at its start, in the last
    one); tolerance 1e-12 for the rounding of batched LAPACK calls on different right-hand sides."""
    x, landmarks, _, _ = _problem(seed=2, batch=1, n=40, r=5)
    base = lowrank_prefix(*_features(x, landmarks), chunk=8)
    for k in (3, 16, 39):
        x2 = x.clone()
        x2[:, k] += 3.0
        out = lowrank_prefix(*_features(x2, landmarks), chunk=8)
        for a, b in zip(base, out):
            torch.testing.assert_close(a[:, :k], b[:, :k], rtol=0, atol=1e-12)
            assert (a[:, k] - b[:, k]).abs().max() > 1e-6  # the perturbation does reach position k


def _features(x, landmarks, t=0.7, eps=0.01):
    phi, d = nystrom_features(x, landmarks, t)
    return phi, d + eps


def test_gradients_match_finite_differences():
    """gradcheck (float64) of w, y and M through the Nystrom features and the chunked solve, w.r.t. the points, the
    landmarks and t."""
    x, landmarks, _, _ = _problem(seed=3, batch=1, n=9, r=3, dim=2)
    t = torch.tensor(0.7, dtype=torch.float64, requires_grad=True)

    def f(x, landmarks, t):
        phi, lam = _features(x, landmarks, t)
        w, y, c = lowrank_prefix(phi, lam, chunk=4)
        return w, y, prefix_weight_matrix_lowrank(phi, lam, c)

    assert torch.autograd.gradcheck(f, (x.requires_grad_(), landmarks.requires_grad_(), t))


def test_duplicate_keys_stay_finite_and_share_a_unit_of_weight():
    """Exact duplicate keys at a landmark: no NaN or inf, and m clones inside the prefix share about one unit of
    weight (their M entries sum to ~1 when the kernel is captured exactly: phi = the landmark's features)."""
    dim = 4
    landmarks = torch.randn(1, 3, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(4)) * 3
    x = landmarks[:, :1].expand(1, 8, dim).clone()  # 8 copies of landmark 0
    phi, d = nystrom_features(x, landmarks, 1.0)
    assert d.abs().max() < 1e-5  # on a landmark the features hold the whole kernel
    w, y, c = lowrank_prefix(phi, d + 1e-3, chunk=3)
    m = prefix_weight_matrix_lowrank(phi, d + 1e-3, c)
    assert all(torch.isfinite(v).all() for v in (w, y, c, m))
    torch.testing.assert_close(m[0, -1].sum(), torch.tensor(8 / (8 + 1e-3), dtype=torch.float64), rtol=1e-4, atol=0)


# ------------------------------------------------------------------------------------ in a model (AttentionConfig)


def _lowrank(form="causal", **kw):
    """The low-rank solver in form ``form``; kw: MagnitudeConfig fields."""
    from attnlab import AttentionConfig

    return AttentionConfig(magnitude={"form": form, "solver": "lowrank", **kw})


@pytest.mark.parametrize("bad,patterns", [
    ({"rank": 0}, ["attention.magnitude.rank=0"]),
    ({"chunk": 0}, ["attention.magnitude.chunk=0"]),
    ({"eps": 0.0}, ["attention.magnitude.eps=0.0", "eps > 0"]),
    ({"kernel": "laplacian"}, ["'lowrank' approximates the Gaussian kernel", "'laplacian'"]),
])
def test_bad_lowrank_settings_get_one_line_errors(bad, patterns):
    from helpers import one_line_error

    one_line_error(lambda: _lowrank(**bad), *patterns)


def test_lowrank_needs_a_causal_form_and_at_most_block_size_landmarks():
    from attnlab import AttentionConfig, GPTConfig
    from helpers import one_line_error

    one_line_error(lambda: AttentionConfig(magnitude=MagnitudeConfig("global", solver="lowrank"), causal=False),
                   "form 'causal' or 'prefix'", "form='global'")
    one_line_error(lambda: GPTConfig(block_size=16, n_head=2, n_embd=16, attention=_lowrank(rank=17)),
                   "attention.magnitude.rank=17", "allowed 1..16")


@pytest.mark.parametrize("form", ["causal", "prefix"])
def test_gate_with_the_keys_as_landmarks_gives_the_exact_gate(form):
    """A lowrank MagnitudeGate whose landmarks are the keys themselves (r = T, so the Nystrom features hold the
    whole kernel) gates as the exact Cholesky gate does, to 1e-4 (float64; the landmark jitter 1e-6 against
    cond(Z + eps I) < 1e3 here)."""
    from attnlab.mechanisms.magnitude.module import MagnitudeGate

    torch.manual_seed(0)
    keys = torch.randn(2, 3, 12, 4, dtype=torch.float64)
    exact = MagnitudeGate(form, eps=0.05, gate="linear").double()
    low = MagnitudeGate(form, eps=0.05, gate="linear", solver="lowrank", rank=12, chunk=5, n_heads=3,
                        head_dim=4).double()
    with torch.no_grad():
        low.landmarks.copy_(keys[0])  # batch 0: landmarks = that batch's keys, per head
    torch.testing.assert_close(low(keys)[0], exact(keys)[0], rtol=0, atol=1e-4)
    assert (low(keys)[1] - exact(keys)[1]).abs().max() > 1e-3  # batch 1's keys are not the landmarks


@pytest.mark.parametrize("apply", ["values", "logits"])
@pytest.mark.parametrize("form", ["causal", "prefix"])
def test_lowrank_does_not_leak_the_future_with_several_chunks(form, apply):
    """The perturbation leak test (tests/test_causal_leak.py's bound) with chunks of 4 and 5 positions at T = 16."""
    from helpers import LEAK_TOL, build, max_leak

    for chunk in (4, 5):
        cfg = _lowrank(form, rank=8, chunk=chunk, apply=apply)
        assert max_leak(build(cfg, "rope")) < LEAK_TOL


@pytest.mark.slow
@pytest.mark.parametrize("form", ["causal", "prefix"])
def test_lowrank_does_not_leak_at_t_256(form):
    """The same at T = 256 with the default rank and chunk (4 chunks of 64) and with chunks of 48 (the last one
    padded)."""
    from attnlab import GPT, GPTConfig
    from helpers import LEAK_TOL, VOCAB

    for chunk in (64, 48):
        torch.manual_seed(0)
        model = GPT(GPTConfig(vocab_size=VOCAB, block_size=256, n_layer=2, n_head=4, n_embd=64,
                              attention=_lowrank(form, chunk=chunk))).double().eval()
        idx = torch.randint(0, VOCAB, (1, 256), generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            base = model(idx)[0]
            for i in (0, 63, 64, 130, 254):
                perturbed = idx.clone()
                perturbed[:, i + 1:] = (idx[:, i + 1:] + 1) % VOCAB
                out = model(perturbed)[0]
                assert (out[:, : i + 1] - base[:, : i + 1]).abs().max().item() < LEAK_TOL
                assert (out[:, i + 1:] - base[:, i + 1:]).abs().max() > 1e-6


def test_landmarks_are_not_weight_decayed():
    """split_params: the landmarks are points in key space, not weights (decay would pull them to the origin)."""
    from attnlab import GPT, GPTConfig
    from attnlab.train.optim import split_params

    model = GPT(GPTConfig(vocab_size=20, block_size=16, n_layer=1, n_head=2, n_embd=16,
                          attention=_lowrank(rank=4)))
    decay, no_decay = split_params(model)
    assert any(n.endswith("landmarks") for n, _ in no_decay) and not any(n.endswith("landmarks") for n, _ in decay)


# ------------------------------------------------------------------------------------------ the error study


def test_error_rows_match_numpy_prefix_solves_of_the_exact_and_the_nystrom_matrices():
    """lowrank_error.error_rows against numpy alone: the exact Gaussian similarity and the Nystrom matrix
    K_nL (K_LL + 1e-6 I)^-1 K_Ln + D built from the formulas, every prefix solved by np.linalg.solve; the median,
    95th percentile and max of |w - w exact| and of the gate errors agree to 1e-9."""
    from attnlab.experiments.lowrank_error import error_rows

    rng = np.random.default_rng(0)
    x, a, t, eps, n, dim = rng.normal(size=(10, 3)), rng.normal(size=(4, 3)), 0.8, 0.01, 10, 3
    kern = lambda p, q: np.exp(-t * ((p[:, None] - q[None]) ** 2).sum(-1) / dim)
    z = kern(x, x)
    k_nl = kern(x, a)
    low = k_nl @ np.linalg.solve(kern(a, a) + 1e-6 * np.eye(4), k_nl.T)
    approx = low + np.diag(1 - np.diag(low))
    w_exact, w_low = np.zeros(n), np.zeros(n)
    for i in range(1, n + 1):
        w_exact[i - 1] = np.linalg.solve(z[:i, :i] + eps * np.eye(i), np.ones(i))[-1]
        w_low[i - 1] = np.linalg.solve(approx[:i, :i] + eps * np.eye(i), np.ones(i))[-1]
    rows = error_rows(torch.from_numpy(x)[None], torch.from_numpy(a)[None], t, eps, chunk=3)
    err = np.abs(w_low - w_exact)
    clamp = lambda w: 1 / (1 + np.exp(-np.clip(w, 0, 1)))
    for key, values in (("w", err), ("w_exact", np.abs(w_exact)),
                        ("gate_clamp", np.abs(clamp(w_low) - clamp(w_exact))),
                        ("gate_linear", np.abs(np.clip(w_low, 0, 1) - np.clip(w_exact, 0, 1)))):
        expect = {"median": np.median(values), "p95": np.quantile(values, 0.95), "max": values.max()}
        for stat, value in expect.items():
            assert rows[key][stat] == pytest.approx(value, abs=1e-9), (key, stat)
    assert rows["w"]["max"] > 1e-3  # 4 landmarks for 10 points: an approximation, not the exact matrix


def test_benchmark_scaling_exponent_is_the_log_log_slope():
    """benchmarks/magnitude.py's "scaling": a time proportional to T^3 gives 3, T^1 gives 1; a row timed at one T
    gets none."""
    from helpers import script

    bench = script("benchmarks/magnitude.py", "bench_magnitude")
    rows = [{"row": "cubic", "seq": t, "fwd_bwd_ms": 2e-6 * t ** 3} for t in (256, 1024, 4096)]
    rows += [{"row": "linear", "seq": t, "fwd_bwd_ms": 0.01 * t} for t in (512, 2048)]
    rows += [{"row": "once", "seq": 1024, "fwd_bwd_ms": 5.0}]
    assert bench.scaling_exponents(rows) == {"cubic": 3.0, "linear": 1.0}


def test_exact_kernel_chunks_its_matrices_on_every_device():
    """The exact kernel keeps each [chunk, N, N] buffer bounded on devices other than CPU too (1 GiB; CPU 16 MiB):
    at N = 4096 in float32 a 64 MiB matrix, so 16 per chunk, not all B x H at once."""
    from attnlab.mechanisms.magnitude.fused import CHUNK_BYTES, DEVICE_CHUNK_BYTES, _chunk_size

    meta = torch.empty(0, device="meta")  # any device that is not the CPU
    assert _chunk_size(64, 4096, meta) == DEVICE_CHUNK_BYTES // (4096 * 4096 * 4) == 16
    assert _chunk_size(64, 256, meta) == 64  # small matrices: one chunk
    assert _chunk_size(64, 512, torch.empty(0)) == CHUNK_BYTES // (512 * 512 * 4) == 16


def test_front_ends_take_the_lowrank_solver():
    """attnlab.prefix_magnitude / prefix_weights / prefix_weight_matrix with solver="lowrank": numpy in, numpy out;
    with the points themselves as landmarks the exact prefix forms to 1e-4 (as above); a bad rank or the global
    form get a clear error."""
    import attnlab
    from attnlab.mechanisms.magnitude.reference import prefix_weight_matrix

    x = np.random.default_rng(5).normal(size=(12, 4))
    kw = {"eps": 0.1, "t": 0.7}
    for fn in (attnlab.prefix_magnitude, prefix_weights, prefix_weight_matrix):
        low = fn(x, solver="lowrank", landmarks=x, chunk=5, **kw)
        assert isinstance(low, np.ndarray)
        np.testing.assert_allclose(low, fn(x, **kw), rtol=0, atol=1e-4)
    default = attnlab.prefix_magnitude(x, solver="lowrank", rank=6, **kw)
    assert default.shape == (12,) and np.all(np.diff(default) >= -1e-12)  # prefix magnitude never decreases
    with pytest.raises(ValueError, match=r"rank=13 is out of range; allowed 1..12"):
        attnlab.prefix_magnitude(x, solver="lowrank", rank=13, **kw)
    with pytest.raises(ValueError, match="causal forms only"):
        attnlab.magnitude_weights(x, solver="lowrank", **kw)


def test_trained_rows_read_each_gate_s_keys_t_and_landmarks(tmp_path):
    """lowrank_error.trained_rows on a run trained (2 steps) with the low-rank solver: the keys it captures are the
    ones each gate reads (the gate run on them gives the output a forward hook saw during the model's forward),
    and its "trained" row equals a numpy prefix solve of the exact and the Nystrom matrices built from those keys,
    the gate's own landmarks, learned t and eps (medians and maxima of |w - w exact| to 1e-9, pooled over layers)."""
    from attnlab.configio import apply_overrides
    from attnlab.experiments.lowrank_error import gate_keys, trained_rows
    from attnlab.mechanisms.magnitude.module import magnitude_gates
    from attnlab.train import load_run, train
    from helpers import tiny

    overrides = ["data.source=task:mqar", "data.task.n_pairs=4", "data.task.n_keys=8", "data.task.n_values=8",
                 "data.task.seq_len=24", "model.n_layer=2", "model.attention=magnitude-causal",
                 "model.attention.magnitude_solver=lowrank", "model.attention.magnitude_rank=4"]
    cfg = apply_overrides(tiny(tmp_path / "run", tmp_path / "cache", train__max_steps=2, train__warmup_steps=1,
                               train__eval_interval=2, train__sample_tokens=4), overrides)
    train(cfg, quiet=True)
    model, _, _ = load_run(tmp_path / "run")
    gates = magnitude_gates(model)
    x = torch.randint(0, model.config.vocab_size, (2, 24))
    seen = []
    hooks = [g.register_forward_hook(lambda mod, args, out: seen.append(out)) for g in gates]
    keys = gate_keys(model, x)
    for h in hooks:
        h.remove()
    assert len(keys) == len(gates) == 2 and keys[0].shape[-2] == 24
    for gate, k, out in zip(gates, keys, seen):
        with torch.no_grad():
            torch.testing.assert_close(gate(k), out, rtol=0, atol=0)

    rows = trained_rows(tmp_path / "run", ranks=(4,), epss=(gates[0].eps,), n_sets=1)
    assert [r["landmarks"] for r in rows] == ["init", "sampled", "trained"]
    row = rows[-1]
    from attnlab.data import prepare
    x_val = next(iter(prepare(cfg.data).val_batches(None, 1, 24)))[0]
    w_err, w_abs = [], []
    for gate, k in zip(gates, gate_keys(model, x_val)):
        t, eps, dim = float(gate.t.detach()), gate.eps, k.shape[-1]
        for h in range(k.shape[1]):
            p, a = k[0, h].double().numpy(), gate.landmarks[h].detach().double().numpy()
            kern = lambda u, v: np.exp(-t * ((u[:, None] - v[None]) ** 2).sum(-1) / dim)
            k_pl = kern(p, a)
            low = k_pl @ np.linalg.solve(kern(a, a) + 1e-6 * np.eye(len(a)), k_pl.T)
            approx, z = low + np.diag(1 - np.diag(low)), kern(p, p)
            for i in range(1, 25):
                exact = np.linalg.solve(z[:i, :i] + eps * np.eye(i), np.ones(i))[-1]
                w_err.append(abs(np.linalg.solve(approx[:i, :i] + eps * np.eye(i), np.ones(i))[-1] - exact))
                w_abs.append(abs(exact))
    assert row["w"]["median"] == pytest.approx(np.median(w_err), abs=1e-9)
    assert row["w"]["max"] == pytest.approx(np.max(w_err), abs=1e-9)
    assert row["w_exact"]["median"] == pytest.approx(np.median(w_abs), abs=1e-9)
    assert row["t"] == [round(float(g.t.detach()), 4) for g in gates] and row["rank"] == 4 and row["solver"] == "lowrank"
