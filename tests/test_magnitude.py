"""attnlab's magnitude library (the magnitude write-up) against closed forms and independent solves, in float64.

Oracles: the closed forms of docs/magnitude.md (two points, equidistant sets, clones, far-apart sets, products, the
variational lower bound, the one-point extension), Leinster's formula for subsets of the line (Laplacian kernel),
and direct torch.linalg.solve / numpy solves of (Z + eps I) mu = 1 on every prefix for the causal identities.
Tolerances: float64 throughout; 1e-10 where only rounding separates two exact computations of well-conditioned
systems (cond(Z) < 1e4 here, so errors stay below ~1e-12), looser ones stated where a limit is approximated.
"""

import math
import warnings

import numpy as np
import pytest
import torch

import attnlab
from attnlab.mechanisms.magnitude import reference as M

F64 = torch.float64


def simplex(n, a=1.0, batch=()):
    """n points a e_i in R^n: all pairwise squared distances 2 a^2 (a may be a tensor over the batch dims)."""
    a = torch.as_tensor(a, dtype=F64)
    return torch.eye(n, dtype=F64).expand(*batch, n, n) * a[..., None, None]


def numpy_similarity(x, t, kernel="gaussian"):
    """Z from explicit differences, one pair at a time (independent of attnlab's vectorised kernel)."""
    x = np.asarray(x, dtype=np.float64)
    n, d = x.shape
    z = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            r2 = float(np.sum((x[i] - x[j]) ** 2))
            z[i, j] = math.exp(-t * r2 / d) if kernel == "gaussian" else math.exp(-t * math.sqrt(r2))
    return z


# ------------------------------------------------------------------------------------------------ closed forms


@pytest.mark.parametrize("solver", ["cholesky", "cg"])
@pytest.mark.parametrize("kernel", ["gaussian", "laplacian"])
def test_two_points(kernel, solver):
    r, t, d = 1.3, 0.8, 2
    x = torch.tensor([[0.0, 0.0], [r, 0.0]], dtype=F64)
    s = t * r * r / d if kernel == "gaussian" else t * r  # similarity exp(-s)
    mu = attnlab.magnitude_weights(x, t, kernel=kernel, solver=solver)
    np.testing.assert_allclose(mu.numpy(), [1 / (1 + math.exp(-s))] * 2, rtol=1e-12)
    assert attnlab.magnitude(x, t, kernel=kernel, solver=solver).item() == pytest.approx(2 / (1 + math.exp(-s)), rel=1e-12)


@pytest.mark.parametrize("eps", [0.0, 0.05])
@pytest.mark.parametrize("kernel", ["gaussian", "laplacian"])
def test_equidistant_points_with_leading_batch_dims(kernel, eps):
    n, t = 5, 0.7
    a = torch.tensor([[0.3, 1.0, 2.0], [0.1, 0.5, 4.0]], dtype=F64)  # batch [2, 3] of scales
    x = simplex(n, a, batch=(2, 3))
    r2 = 2 * a * a
    q = torch.exp(-t * r2 / n) if kernel == "gaussian" else torch.exp(-t * r2.sqrt())
    want = n / (1 + eps + (n - 1) * q)  # N / (1 + eps + (N - 1) q); constant row sums: mu_i = 1 / row sum
    got, info = attnlab.magnitude(x, t, eps=eps, kernel=kernel, return_info=True)
    assert got.shape == (2, 3) and info.residual.shape == (2, 3)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=0)
    torch.testing.assert_close(attnlab.magnitude_weights(x, t, eps=eps, kernel=kernel), (want / n)[..., None].expand(2, 3, n),
                               rtol=1e-12, atol=0)


def test_identical_points_with_eps():
    n, eps = 7, 1e-2
    x = torch.zeros(n, 3, dtype=F64) + torch.tensor([1.0, -2.0, 0.5], dtype=F64)
    for solver in ("cholesky", "cg"):
        assert attnlab.magnitude(x, 1.0, eps=eps, solver=solver).item() == pytest.approx(n / (n + eps), rel=1e-12)
        torch.testing.assert_close(attnlab.magnitude_weights(x, 1.0, eps=eps, solver=solver),
                                   torch.full((n,), 1 / (n + eps), dtype=F64), rtol=1e-12, atol=0)


def test_far_apart_sets_add_and_t_to_infinity_gives_n():
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 3, generator=g, dtype=F64), torch.randn(4, 3, generator=g, dtype=F64)
    far = torch.cat([x, y + 1e3], dim=0)  # cross similarities exp(-3e6 t / 3) = 0 exactly in float64
    # 1e-9: squared distances from norms and dot products lose ~1e-16 ||y + 1e3||^2 ~ 3e-10 absolutely
    assert attnlab.magnitude(far).item() == pytest.approx(attnlab.magnitude(x).item() + attnlab.magnitude(y).item(), rel=1e-9)
    assert attnlab.magnitude(far, 1e8).item() == pytest.approx(10.0, rel=1e-12)  # Z = I: every point one unit


def test_gaussian_magnitude_of_a_product_is_the_product():
    # Z on X x Y (concatenated coordinates, d = d1 + d2) is Z_X(t d1/d) (x) Z_Y(t d2/d), so |X x Y| = |X| |Y|.
    g = torch.Generator().manual_seed(1)
    x, y, t = torch.randn(4, 2, generator=g, dtype=F64), torch.randn(3, 3, generator=g, dtype=F64), 0.9
    xy = torch.cat([x.repeat_interleave(3, 0), y.repeat(4, 1)], dim=1)
    want = attnlab.magnitude(x, t * 2 / 5) * attnlab.magnitude(y, t * 3 / 5)
    assert attnlab.magnitude(xy, t).item() == pytest.approx(want.item(), rel=1e-10)


def test_laplacian_on_the_line_matches_leinster():
    # Subsets of R with exp(-t|x - y|): |X| = 1 + sum over consecutive gaps g of tanh(t g / 2) (Leinster 2013).
    pts = np.array([-1.0, 0.2, 0.3, 1.7, 4.0, 4.05])
    for t in (0.3, 1.0, 5.0):
        want = 1 + np.tanh(t * np.diff(pts) / 2).sum()
        assert attnlab.magnitude(pts[:, None], t, kernel="laplacian") == pytest.approx(want, rel=1e-12)


def test_variational_lower_bound_and_one_point_extension():
    g = torch.Generator().manual_seed(2)
    x, t = torch.randn(9, 4, generator=g, dtype=F64), 0.6
    z = torch.as_tensor(numpy_similarity(x.numpy(), t))
    mag = attnlab.magnitude(x, t).item()
    for _ in range(200):  # (1'w)^2 / (w'Zw) <= |X| for every w
        w = torch.randn(9, generator=g, dtype=F64)
        assert (w.sum() ** 2 / (w @ z @ w)).item() <= mag * (1 + 1e-12)
    mu = attnlab.magnitude_weights(x, t)
    assert (mu.sum() ** 2 / (mu @ z @ mu)).item() == pytest.approx(mag, rel=1e-12)  # attained at w = mu
    # adding a point p: |X u p| - |X| = (1 - z'mu)^2 / (1 - z' Z^-1 z), z_i = similarity of p to x_i (notes)
    p = torch.randn(1, 4, generator=g, dtype=F64)
    zp = torch.as_tensor(numpy_similarity(torch.cat([x, p]).numpy(), t))[-1, :-1]
    gain = (1 - zp @ mu) ** 2 / (1 - zp @ torch.linalg.solve(z, zp))
    assert attnlab.magnitude(torch.cat([x, p]), t).item() - mag == pytest.approx(gain.item(), rel=1e-9)


def test_numpy_in_numpy_out_and_torch_in_torch_out():
    x = np.random.default_rng(0).normal(size=(2, 5, 3))
    mu, info = attnlab.magnitude_weights(x, 0.5, return_info=True)
    assert isinstance(mu, np.ndarray) and mu.shape == (2, 5) and isinstance(info.residual, np.ndarray)
    assert isinstance(attnlab.magnitude(x), np.ndarray) and isinstance(attnlab.prefix_magnitude(x), np.ndarray)
    want = np.linalg.solve(numpy_similarity(x[1], 0.5), np.ones(5))
    np.testing.assert_allclose(mu[1], want, rtol=1e-10)
    assert torch.is_tensor(attnlab.magnitude(torch.from_numpy(x)))
    assert attnlab.magnitude([[0, 0], [0, 3]]).dtype == np.float64  # integer array-likes become float64


def test_bad_arguments_name_the_value():
    x = torch.randn(4, 2, dtype=F64)
    for kwargs, pattern in [(dict(t=0.0), "t=0.0"), (dict(eps=-1.0), "eps=-1.0"), (dict(kernel="cosine"), "kernel='cosine'"),
                            (dict(solver="lu"), "solver='lu'")]:
        with pytest.raises(ValueError, match=pattern):
            attnlab.magnitude_weights(x, **kwargs)
    with pytest.raises(ValueError, match="Cholesky"):
        attnlab.prefix_magnitude(x, solver="cg")


# ------------------------------------------------------------------------------------------------------ solvers


def test_cg_converges_to_the_direct_solve_and_reports_its_residual():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(3, 20, 6, generator=g, dtype=F64)
    z = torch.as_tensor(np.stack([numpy_similarity(xi, 1.0) for xi in x.numpy()]))
    direct = torch.linalg.solve(z, torch.ones(3, 20, dtype=F64))
    mu, info = attnlab.magnitude_weights(x, solver="cg", tol=1e-12, max_iter=200, return_info=True)
    torch.testing.assert_close(mu, direct, rtol=1e-8, atol=1e-8)
    assert info.iterations < 200 and (info.residual <= 1e-11).all()
    mu5, info5 = attnlab.magnitude_weights(x, solver="cg", max_iter=5, return_info=True)  # truncated: honest report
    assert info5.iterations == 5
    recomputed = (1 - (z @ mu5[..., None])[..., 0]).norm(dim=-1) / math.sqrt(20)
    torch.testing.assert_close(info5.residual, recomputed, rtol=1e-10, atol=0)
    assert (info5.residual > 1e-6).all()


def test_the_measured_cg_and_eps_numbers():
    """Notes, N=256 keys ~ N(0, I_64): 5 CG iterations give 0.2% error in |X| at t=1, 15% at t=0.1; eps=1e-2 biases
    |X| by -30% at t=0.1; iterations to 1e-3: 9 at t=1, 28 at t=0.1. Ranges allow for a different random draw."""
    x = torch.randn(256, 64, generator=torch.Generator().manual_seed(0), dtype=F64)
    err, its = {}, {}
    for t in (1.0, 0.1):
        exact = attnlab.magnitude(x, t).item()
        err[t] = abs(attnlab.magnitude(x, t, solver="cg", max_iter=5).item() / exact - 1)
        its[t] = attnlab.magnitude_weights(x, t, solver="cg", max_iter=500, tol=1e-3, return_info=True)[1].iterations
    assert err[1.0] < 0.01 and 0.05 < err[0.1] < 0.30
    assert 5 <= its[1.0] <= 14 and 18 <= its[0.1] <= 45
    bias = attnlab.magnitude(x, 0.1, eps=1e-2).item() / attnlab.magnitude(x, 0.1).item() - 1
    assert -0.36 < bias < -0.24


def test_weights_are_not_sign_definite():
    g = torch.Generator().manual_seed(4)
    low_rank = torch.randn(256, 4, generator=g, dtype=F64) @ torch.randn(4, 64, generator=g, dtype=F64)
    mu = attnlab.magnitude_weights(low_rank, 0.1)
    assert mu.min() < -100 and mu.max() > 1 and (mu < 0).float().mean() > 0.1


def test_cholesky_retries_duplicates_with_jitter_and_warns():
    x = torch.zeros(6, 3, dtype=F64)  # Z = J: singular
    with pytest.warns(RuntimeWarning, match="jitter"):
        mu, info = attnlab.magnitude_weights(x, return_info=True)
    assert torch.isfinite(mu).all() and info.jitter.max() > 0
    assert mu.sum().item() == pytest.approx(1.0, abs=1e-6)  # any solution of J mu = 1 sums to 1


def test_causal_jitter_leaves_earlier_rows_untouched():
    """A duplicate appended at the end makes the factorisation fail at the last pivot; the causal retry puts the
    jitter on that pivot only, so rows 1..N of L (and every prefix quantity) are bit-identical."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(6, 3, generator=g, dtype=F64)
    xx = torch.cat([x, x[2:3]])
    z, zz = M.similarity(x, 1.0), M.similarity(xx, 1.0)
    L, y, _ = M.prefix_factor(z)
    with pytest.warns(RuntimeWarning, match="jitter"):
        LL, yy, jitter = M.prefix_factor(zz)
    assert jitter[:6].abs().max() == 0 and jitter[6] > 0
    assert torch.equal(LL[:6, :6], L) and torch.equal(yy[:6], y)
    with pytest.warns(RuntimeWarning):
        L_uniform, _ = M.cholesky_jitter(zz)  # the symmetric retry moves every row: not causal
    assert not torch.equal(L_uniform[:6, :6], L)


# ----------------------------------------------------------------------------------------- causal identities


@pytest.mark.parametrize("eps", [0.0, 1e-2])
def test_prefix_identities_match_a_direct_solve_on_every_prefix(eps):
    g = torch.Generator().manual_seed(6)
    x = torch.randn(2, 3, 10, 4, generator=g, dtype=F64)
    t = 0.8
    pm = attnlab.prefix_magnitude(x, t, eps=eps)
    w = M.prefix_weights(x, t, eps=eps)
    m = M.prefix_weight_matrix(x, t, eps=eps)
    for b in range(2):
        for h in range(3):
            z = numpy_similarity(x[b, h].numpy(), t) + eps * np.eye(10)
            for i in range(10):
                mu_i = np.linalg.solve(z[: i + 1, : i + 1], np.ones(i + 1))  # weights of the prefix {1..i}
                assert pm[b, h, i].item() == pytest.approx(mu_i.sum(), rel=1e-10)
                assert w[b, h, i].item() == pytest.approx(mu_i[-1], rel=1e-10, abs=1e-12)
                np.testing.assert_allclose(m[b, h, i, : i + 1].numpy(), mu_i, rtol=1e-10, atol=1e-12)
                assert (m[b, h, i, i + 1:] == 0).all()
    torch.testing.assert_close(m.sum(-1), pm, rtol=1e-10, atol=0)  # row i of M sums to |X_1..i|
    assert (pm.diff(dim=-1) >= 0).all()  # magnitude is monotone under inclusion
    torch.testing.assert_close(pm[..., -1], attnlab.magnitude(x, t, eps=eps), rtol=1e-10, atol=0)


def test_pivots_are_the_gaussian_process_novelty():
    # L_jj^2 = 1 - z_j' Z_<j^-1 z_j: the posterior variance of key j given the earlier keys (notes).
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(7), dtype=F64)
    z = numpy_similarity(x.numpy(), 1.0)
    L, _, _ = M.prefix_factor(torch.as_tensor(z))
    for j in range(1, 7):
        zj = z[:j, j]
        assert L[j, j].item() ** 2 == pytest.approx(1 - zj @ np.linalg.solve(z[:j, :j], zj), rel=1e-10)


def test_prefix_forms_are_causal():
    g = torch.Generator().manual_seed(8)
    x = torch.randn(12, 4, generator=g, dtype=F64)
    y = x.clone()
    y[7:] = torch.randn(5, 4, generator=g, dtype=F64)  # change the future of position 6
    for fn in (attnlab.prefix_magnitude, M.prefix_weights):
        assert torch.equal(fn(x, eps=1e-3)[:7], fn(y, eps=1e-3)[:7])
    assert torch.equal(M.prefix_weight_matrix(x)[:7], M.prefix_weight_matrix(y)[:7])
    assert not torch.equal(attnlab.magnitude_weights(x)[:7], attnlab.magnitude_weights(y)[:7])  # global mu is not


# ---------------------------------------------------------------------------------------------------- gradients


def _points(n=5, d=3, seed=9):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=F64).requires_grad_()


@pytest.mark.parametrize("solver, max_iter", [("cholesky", None), ("cg", 3), ("cg", 5)])
@pytest.mark.parametrize("kernel", ["gaussian", "laplacian"])
def test_gradcheck_weights(solver, max_iter, kernel):
    x, t = _points(), torch.tensor(0.7, dtype=F64, requires_grad=True)
    fn = lambda x, t: attnlab.magnitude_weights(x, t, eps=1e-2, kernel=kernel, solver=solver, max_iter=max_iter)
    assert torch.autograd.gradcheck(fn, (x, t))


def test_gradcheck_prefix_forms_and_gates():
    x, t = _points(6, 2, seed=10), torch.tensor(1.3, dtype=F64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, t: attnlab.prefix_magnitude(x, t), (x, t))
    assert torch.autograd.gradcheck(lambda x, t: M.prefix_weights(x, t, eps=1e-3), (x, t))
    assert torch.autograd.gradcheck(lambda x, t: M.prefix_weight_matrix(x, t), (x, t))
    w = torch.tensor([-3.0, 0.3, 0.55, 1.6], dtype=F64, requires_grad=True)  # away from the clamp's kinks
    beta, gamma = torch.tensor(1.5, dtype=F64, requires_grad=True), torch.tensor(-0.3, dtype=F64, requires_grad=True)
    for form in M.GATES:
        assert torch.autograd.gradcheck(lambda w, b, c: M.gate(w, b, c, form), (w, beta, gamma))


def _near_clones(spacing, dtype=F64, n=12, m=5, d=4):
    g = torch.Generator().manual_seed(11)
    x = torch.randn(n, d, generator=g, dtype=F64)
    x[:m] = x[0] + spacing * torch.randn(m, d, generator=g, dtype=F64)
    return x.to(dtype)


def _max_grad(x, eps, form="clamp", fn=attnlab.magnitude_weights):
    x = x.clone().requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        g = M.gate(fn(x, 1.0, eps=eps), 1.0, 0.0, form)
    r = torch.randn(g.shape, generator=torch.Generator().manual_seed(12), dtype=F64).to(g.dtype)
    (g * r).sum().backward()
    assert torch.isfinite(g).all() and torch.isfinite(x.grad).all()
    return x.grad.abs().max().item()


@pytest.mark.parametrize("fn", [attnlab.magnitude_weights, M.prefix_weights, M.prefix_weight_matrix],
                         ids=["global", "causal", "prefix"])
def test_no_exploding_gradients_with_near_identical_keys(fn):
    """With eps = 1e-3 (the module default) the gradient stays O(1/eps) for keys 1e-7 apart; without eps it is the
    ill-conditioning of Z (cond ~ 1/spacing^2) that shows."""
    near = _near_clones(1e-7)
    bounded = _max_grad(near, 1e-3, fn=fn)
    assert bounded * 1e-3 < 1.0
    assert _max_grad(near, 0.0, fn=fn) > 100 * bounded


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("form", M.GATES)
@pytest.mark.parametrize("fn", [attnlab.magnitude_weights, M.prefix_weights, M.prefix_weight_matrix],
                         ids=["global", "causal", "prefix"])
def test_duplicates_and_near_duplicates_stay_finite(fn, form, dtype):
    for spacing in (0.0, 1e-9, 1e-4):  # forward and backward, with and without eps (eps = 0: the jitter retry)
        for eps in (0.0, 1e-3):
            _max_grad(_near_clones(spacing, dtype), eps, form, fn)


# ---------------------------------------------------------------------------------------- the magnitude write-up's numbers


def test_demo_reproduces_the_seed():
    from attnlab.experiments.magnitude_demo import run_demo

    eps = 1e-3
    out = run_demo(eps)
    h = out["hijacking"]
    assert h["softmax"]["unique"] == pytest.approx(20 / 70, abs=1e-12)  # write-up: 0.2857 (attention's own weights)
    assert h["softmax"]["cluster"] == pytest.approx(50 / 70, abs=1e-12)  # write-up: 0.7143
    assert h["weights"]["global"]["cluster_sum"] == pytest.approx(50 / (50 + eps), rel=1e-9)  # the cluster is 1 unit
    assert h["value_mass"]["global/linear"]["cluster"] == pytest.approx(50 / 70 / (50 + eps), rel=1e-9)
    assert h["value_mass"]["prefix/linear"]["cluster"] == pytest.approx(50 / 70 / (50 + eps), rel=1e-9)
    assert h["value_mass"]["global/sigmoid"]["cluster"] == pytest.approx(50 / 70 / (1 + math.exp(-1 / (50 + eps))), rel=1e-9)
    c = out["cluster_collapse"]
    assert c["mu_each"] == pytest.approx(1 / (50 + eps), rel=1e-12) and c["mu_spread"] < 1e-12
    assert c["magnitude"] == pytest.approx(50 / (50 + eps), rel=1e-12)
    assert c["causal_form_cluster_units"] == pytest.approx(sum(1 / (j + eps) for j in range(1, 51)), rel=1e-10)
    e = out["effective_number"]
    assert e["clones"] == pytest.approx(1.0, abs=1e-6) and e["clones_eps_1e-3"] == pytest.approx(3 / 3.001, rel=1e-12)
    assert e["far_apart"] == pytest.approx(3.0, rel=1e-12)
    mags = [b["magnitude"] for b in e["between"]]
    for b in e["between"]:
        assert b["magnitude"] == pytest.approx(3 / (1 + 2 * math.exp(-b["t"] * 2 / 3)), rel=1e-12)
    assert mags == sorted(mags) and 1 < mags[0] < mags[-1] <= 3


def test_gate_measurement_runs_small():
    from attnlab.experiments.magnitude_demo import measure_gates

    rows = measure_gates(n=24, d=8)
    assert len(rows) == 5 * 2 * 3 and all(r[f]["finite"] for r in rows for f in M.GATES)
