"""The Boneless write-up's parameterless attention: consensus steps against formulas computed by hand (numpy), clusters of
blobs, the exact norm law of raw correlation x <- x x' x, and colour clustering of a synthetic image."""

import numpy as np
import pytest
import torch

from attnlab import ConfigError
from attnlab.analysis.colors import cluster_colors, load_image
from attnlab.analysis.consensus import attention_step, blobs, consensus, count_clusters, raw_correlation_growth
from attnlab.cli import main


def softmax_rows(z):
    z = z - z.max(1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(1, keepdims=True)


@pytest.fixture
def points():
    return np.random.default_rng(1).normal(size=(9, 3))


def test_one_full_step_is_softmax_of_scaled_cosines_times_x(points):
    g = 2.5
    u = points / np.linalg.norm(points, axis=1, keepdims=True)
    want = softmax_rows(g * u @ u.T) @ points  # softmax(g x^ x^') x
    x = torch.from_numpy(points)
    assert np.abs(attention_step(x, 1.0, g).numpy() - want).max() < 1e-12
    res = consensus(x, steps=1, step_size=1.0, scale=g)
    assert np.abs(res.trajectory[1].numpy() - want).max() < 1e-12


def test_step_variants_by_hand(points):
    x, g, s = torch.from_numpy(points), 0.7, 0.3
    u = points / np.linalg.norm(points, axis=1, keepdims=True)
    cases = {
        "no-qk-norm": (dict(qk_norm=False), softmax_rows(g * points @ points.T) @ points),
        "raw correlation": (dict(normalizer="none"), g * u @ u.T @ points),
        "blurring mean shift": (dict(qk_norm=False, kernel="rbf"),
                                softmax_rows(-g * ((points[:, None] - points[None]) ** 2).sum(-1) / 2) @ points),
    }
    for name, (kw, mixed) in cases.items():
        got = attention_step(x, s, g, **kw).numpy()
        assert np.abs(got - ((1 - s) * points + s * mixed)).max() < 1e-12, name


def test_cluster_rule_is_connected_components_within_radius():
    chain = np.array([[0.0, 0], [0.5, 0], [1.0, 0], [3.0, 0]])
    assert count_clusters(chain, 0.6)[0] == 2  # 0-1-2 chained, 3 alone
    assert count_clusters(chain, 0.4)[0] == 4
    assert count_clusters(chain, 2.0)[0] == 1
    x = np.random.default_rng(0).uniform(size=(200, 3))
    padded = np.concatenate([x, np.zeros((200, 9))], 1)  # d = 12: the dense path
    n3, lab3 = count_clusters(x, 0.08)
    n12, lab12 = count_clusters(padded, 0.08)
    assert n3 == n12 and 1 < n3 < 200
    assert np.array_equal(lab3, lab12)  # both label components in order of their first point


@pytest.mark.parametrize("k", [2, 3, 5])
def test_separated_blobs_end_as_their_clusters(k):
    x, truth = blobs(60, k, std=0.2, seed=k)
    res = consensus(x, steps=80, step_size=0.5, scale=10.0)
    assert res.clusters[0] > k and res.clusters[-1] == k
    pairs = {(int(a), int(b)) for a, b in zip(res.labels, truth)}
    assert len(pairs) == k  # the found partition is the true one


def test_raw_correlation_norms_follow_the_gram_spectrum():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(12, 3))
    x *= 1.3 / np.linalg.norm(x, 2)  # sigma_1 = 1.3: sigma_1^(3^5) = 4e27
    lam = np.linalg.eigvalsh(x @ x.T)[::-1]  # Gram eigenvalues lambda_j = sigma_j^2
    u, sig, _ = np.linalg.svd(x, full_matrices=False)
    g = raw_correlation_growth(torch.from_numpy(x), steps=5, max_norm=1e200)
    assert g["stopped"] is None and len(g["spectral_norm"]) == 6
    for t, (spec, rows) in enumerate(zip(g["spectral_norm"], g["max_row_norm"])):
        assert spec == pytest.approx(lam[0] ** (3**t / 2), rel=1e-9)  # ||x_t||_2 = lambda_1^(3^t / 2)
        want_rows = np.sqrt((u**2) @ sig ** (2 * 3**t)).max()  # ||x_t[i]||^2 = sum_j U_ij^2 sigma_j^(2 3^t)
        assert rows == pytest.approx(want_rows, rel=1e-9)
    logs = np.log(g["spectral_norm"])
    assert np.allclose(logs[1:] / logs[:-1], 3.0)  # log-norm grows geometrically, x3 per step


def test_raw_correlation_with_step_size_and_stop_before_overflow():
    x = np.random.default_rng(3).normal(size=(30, 2))
    s = 0.5
    g = raw_correlation_growth(torch.from_numpy(x).float(), steps=40, step_size=s)
    sig = np.linalg.svd(x, compute_uv=False)[0]
    for spec in g["spectral_norm"]:
        assert spec == pytest.approx(sig, rel=1e-3)  # float32 iterates against f^t(sigma_1) in float64
        sig = (1 - s) * sig + s * sig**3
    assert g["stopped"] and "1e+30" in g["stopped"]
    assert len(g["max_row_norm"]) < 41 and max(g["spectral_norm"]) <= 1e30
    assert np.isfinite(g["max_row_norm"]).all()


def synthetic_image(seed=0, noise=0.02):
    truth = np.array([[0.9, 0.1, 0.1], [0.1, 0.8, 0.2], [0.2, 0.2, 0.9]])
    rng = np.random.default_rng(seed)
    img = np.empty((48, 60, 3))
    img[:, :20], img[:, 20:45], img[:, 45:] = truth
    return np.clip(img + noise * rng.normal(size=img.shape), 0, 1), truth


def test_three_flat_colours_are_recovered():
    img, truth = synthetic_image()
    res = cluster_colors(img, samples=600, scale=300.0, steps=30)
    pal = res["consensus"].palette
    assert pal.shape == (3, 3)
    dist = np.linalg.norm(pal[:, None] - truth[None], axis=-1)
    assert sorted(dist.argmin(1).tolist()) == [0, 1, 2] and dist.min(1).max() < 0.01
    assert res["consensus"].mse < 1.5 * 0.02**2 < res["mean"].mse  # about the noise, far below one colour
    assert res["kmeans"].colors == 3 and res["kmeans"].mse <= 1.5 * 0.02**2


def test_cluster_colors_command_and_errors(tmp_path, capsys):
    import matplotlib.image as mpimg

    img, _ = synthetic_image(1)
    path = tmp_path / "three.png"
    mpimg.imsave(path, img)
    out = tmp_path / "out"
    assert main(["cluster-colors", str(path), "--out", str(out), "--samples", "400", "--steps", "20"]) == 0
    text = capsys.readouterr().out
    assert "consensus attention | 3 |" in text and "k-means | 3 |" in text
    for name in ("palette.png", "recolored.png", "recolored_kmeans.png", "results.json"):
        assert (out / name).stat().st_size > 0
    missing = tmp_path / "nope.jpg"
    assert main(["cluster-colors", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(missing) in err
    (tmp_path / "bad.png").write_text("not an image")
    with pytest.raises(ConfigError, match="bad.png"):
        load_image(tmp_path / "bad.png")


def test_default_image_is_matplotlibs_photograph():
    img = load_image()
    assert img.shape == (600, 512, 3) and 0.0 <= img.min() and img.max() <= 1.0


def test_consensus_command(tmp_path, capsys):
    out = tmp_path / "frames"
    assert main(["consensus", "--points", "24", "--steps", "12", "--frame-every", "4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "clusters per iteration" in text and "predicted from the SVD" in text
    assert "stopped after 3 iterations: the next would have spectral norm" in text
    assert sorted(p.name for p in out.glob("frame_*.png")) == [f"frame_{t:03d}.png" for t in (0, 4, 8, 12)]
    assert (out / "clusters.png").exists()
    assert main(["consensus", "--points", "0", "--out", str(out)]) == 2
