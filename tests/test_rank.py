"""The Boneless write-up's pseudo-rank: the two measures on spectra with known answers, the spectra against SVDs of the
weights extracted by hand (attnlab and Hugging Face GPT-2 layouts), and the rank / rank-sweep commands."""

import json
import math

import numpy as np
import pytest
import torch

from attnlab import GPT, ConfigError, GPTConfig
from attnlab.analysis.rank import participation_ratio, pseudo_rank, rank_metrics, singular_spectra
from attnlab.experiments.sweep import rank_sweep
from attnlab.cli import main
from attnlab.configio import apply_overrides
from attnlab.presets import load_preset


@pytest.mark.parametrize("k, n", [(1, 8), (5, 16), (19, 40), (7, 7)])
def test_k_equal_singular_values(k, n):
    s = torch.linalg.svdvals(torch.diag(torch.tensor([1.0] * k + [0.0] * (n - k), dtype=torch.float64)))
    assert participation_ratio(s) == pytest.approx(k)
    assert pseudo_rank(s) == pytest.approx(k / n)  # ceil(0.95 k) = k for k < 20


def test_pseudo_rank_counts_energy_not_the_plain_sum():
    assert pseudo_rank([1.0] * 40) == pytest.approx(38 / 40)  # ceil(0.95 * 40) = 38 of 40 equal values
    s = [4.0] + [1.0] * 9  # energy 16 + 9 = 25: 9 values hold 24 >= 23.75; the plain sum would need all 10
    assert pseudo_rank(s) == pytest.approx(0.9)
    assert pseudo_rank(s[::-1]) == pytest.approx(0.9)  # order does not matter
    assert pseudo_rank([0.0] * 5) == 0.0 and participation_ratio([0.0] * 5) == 0.0


def test_geometric_spectrum_against_closed_forms():
    n, r = 30, 0.8
    s = r ** np.arange(n)
    q = r * r
    energy = [(1 - q**k) / (1 - q**n) for k in range(1, n + 1)]  # sum_{i<k} q^i / sum_{i<n} q^i
    k_star = next(k for k, e in enumerate(energy, 1) if e >= 0.95)
    assert pseudo_rank(s) == pytest.approx(k_star / n)
    pr = ((1 - q**n) / (1 - q)) ** 2 / ((1 - q ** (2 * n)) / (1 - q**2))  # (sum q^i)^2 / sum q^2i
    assert participation_ratio(s) == pytest.approx(pr, rel=1e-12)
    batched = torch.stack([torch.from_numpy(s), torch.ones(n, dtype=torch.float64)])
    want = torch.tensor([k_star / n, math.ceil(0.95 * n) / n], dtype=torch.float64)
    assert torch.allclose(pseudo_rank(batched), want)


def test_square_gaussian_matrix_has_participation_ratio_n_over_2():
    # Marchenko-Pastur with aspect ratio 1: E[lambda^2] / E[lambda]^2 = 2 for lambda = s^2, so PR / n -> 1/2
    n = 400
    s = torch.linalg.svdvals(torch.randn(n, n, dtype=torch.float64, generator=torch.Generator().manual_seed(0)))
    assert participation_ratio(s) / n == pytest.approx(0.5, abs=0.02)


def test_spectra_against_svd_of_the_weights_by_hand():
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=2, n_head=4, n_embd=32, attention="gqa"))
    h, h_kv, d = 4, model.config.resolved_attention().n_kv_head, 8
    assert h_kv < h
    spectra = singular_spectra(model)
    for block, sp in zip(model.blocks, spectra):
        a = block.attn
        for m, lin in (("q", a.q_proj), ("k", a.k_proj), ("v", a.v_proj), ("o", a.out_proj)):
            want = torch.linalg.svdvals(lin.weight.detach().double())
            assert torch.allclose(sp[m], want, atol=1e-12), m
        wq, wk = a.q_proj.weight.detach().double(), a.k_proj.weight.detach().double()  # [out, in]
        for head in range(h):
            g = head // (h // h_kv)
            prod = wq[head * d:(head + 1) * d].T @ wk[g * d:(g + 1) * d]  # W_q^h W_k^g' [C, C], x W convention
            assert torch.allclose(sp["qk"][head], torch.linalg.svdvals(prod)[:d], atol=1e-12)
    metrics = rank_metrics(model)
    want_keys = {f"{kind}/{m}/{where}" for kind in ("pseudo_rank", "participation_ratio")
                 for m in ("q", "k", "v", "o", "qk") for where in ("L0", "L1", "mean")}
    assert set(metrics) == want_keys
    assert metrics["pseudo_rank/qk/L1"] == pytest.approx(float(pseudo_rank(spectra[1]["qk"]).mean()))
    assert metrics["participation_ratio/v/mean"] == pytest.approx(
        (participation_ratio(spectra[0]["v"]) + participation_ratio(spectra[1]["v"])) / 2)
    assert set(rank_metrics(model, per_layer=False)) == {k for k in want_keys if k.endswith("mean")}


def test_residual_projection_enters_as_w_plus_identity():
    projections = pytest.importorskip("attnlab.mechanisms.projections.module")
    if not hasattr(projections, "Residual"):
        pytest.skip("no Residual projection in this tree")
    model = GPT(GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=2, n_embd=16))
    attn = model.blocks[0].attn
    inner = attn.q_proj
    attn.q_proj = projections.Residual(inner)
    want = torch.linalg.svdvals(inner.weight.detach().double().T + torch.eye(16, dtype=torch.float64))
    assert torch.allclose(singular_spectra(model)[0]["q"], want, atol=1e-12)


# ------------------------------------------------------------------------------------------ commands


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """The tiny preset, 4 steps, weight decay 0 and 10, seeds 0-2 (data cache in a temporary directory)."""
    root = tmp_path_factory.mktemp("sweep")
    cfg = apply_overrides(load_preset("tiny"), [
        f"data.cache_dir={root / 'cache'}", "train.max_steps=4", "train.warmup_steps=1", "train.eval_interval=0",
        "train.sample_tokens=0", "train.eval_tokens=256"])
    report = rank_sweep(cfg, [0, 10], root / "sweep", seeds=[0, 1, 2])
    return cfg, root / "sweep", report


def test_rank_sweep_table_and_runs(sweep):
    cfg, out, report = sweep
    rows = report["rows"]
    assert [(r["weight_decay"], r["seed"]) for r in rows] == [(w, s) for w in (0.0, 10.0) for s in (0, 1, 2)]
    for r in rows:
        assert r["status"] == "finished" and math.isfinite(r["final_val_loss"])
        assert 0 < r["metrics"]["pseudo_rank/qk/mean"] <= 1 and r["metrics"]["participation_ratio/q/mean"] >= 1
        run = out / f"wd{r['weight_decay']:g}" / f"seed{r['seed']}"
        saved = (run / "config.toml").read_text()
        assert f"weight_decay = {r['weight_decay']}" in saved and f"seed = {r['seed']}" in saved
        assert (run / "rank" / "spectra.png").exists()
    saved = json.loads((out / "sweep.json").read_text())
    assert [r["final_val_loss"] for r in saved["rows"]] == [r["final_val_loss"] for r in rows]
    assert "| 10 | 3 |" in (out / "sweep.md").read_text()
    # seeds differ: the same lambda gives different losses from different initialisations and data orders
    assert len({r["final_val_loss"] for r in rows if r["weight_decay"] == 0}) == 3
    # decay 10 x lr shrinks the decayed attention weights: the Frobenius norm is smaller than without decay
    from attnlab.train import load_run

    models = [load_run(out / f"wd{w}" / "seed0")[0] for w in (0, 10)]
    norms = [sum(float(b.attn.q_proj.weight.detach().norm()) for b in m.blocks) for m in models]
    assert norms[1] < norms[0]
    again = rank_sweep(cfg, [0, 10], out, seeds=[0, 1, 2])  # resumes: finished runs are kept
    assert [r["final_val_loss"] for r in again["rows"]] == [r["final_val_loss"] for r in rows]
    with pytest.raises(ConfigError, match="different sweep"):
        rank_sweep(cfg, [0, 1], out)
    with pytest.raises(ConfigError, match="distinct integers"):
        rank_sweep(cfg, [0, 10], out, seeds=[1, 1])


def test_rank_sweep_statistics_against_scipy(sweep):
    """Each row of the differences table against scipy on the runs' own numbers, paired by seed, and Holm's
    step-down correction written out here over the whole family."""
    from scipy import stats

    _, out, report = sweep
    by = {(r["weight_decay"], r["seed"]): r for r in report["rows"]}

    def value(r, metric):
        return r["final_val_loss"] if metric == "final_val_loss" else r["metrics"][metric]

    rows = report["stats"]
    assert [s["metric"] for s in rows] == ["final_val_loss"] + [f"pseudo_rank/{m}/mean" for m in "q k v o qk".split()]
    raw = []
    for s in rows:
        a = np.array([value(by[(10.0, k)], s["metric"]) for k in (0, 1, 2)])
        b = np.array([value(by[(0.0, k)], s["metric"]) for k in (0, 1, 2)])
        assert s["seeds"] == [0, 1, 2] and s["ci"]["difference"] == pytest.approx((a - b).mean(), abs=1e-12)
        d = a - b
        if np.ptp(d) == 0:  # pseudo-ranks move in steps of 1/n: a difference equal in every seed has no t-test
            assert s["test"]["p"] is None and "zero variance" in s["test"]["reason"]
            raw.append(None)
            continue
        assert s["test"]["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-9)
        raw.append(stats.ttest_rel(a, b).pvalue)
        assert s["ci"]["low"] <= d.mean() <= s["ci"]["high"]
    tested = sorted((p, i) for i, p in enumerate(raw) if p is not None)
    m, running, want = len(tested), 0.0, [None] * len(raw)
    for k, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - k) * p))
        want[i] = running
    assert [s["holm_p"] for s in rows] == pytest.approx(want)
    assert "Holm's correction over every row" in (out / "sweep.md").read_text()


def test_rank_sweep_export_reports_without_checkpoints(sweep, tmp_path):
    from attnlab.experiments.sweep import export_sweep, write_sweep_report

    _, out, report = sweep
    dest = export_sweep(out, tmp_path / "shipped")
    assert not list(dest.rglob("checkpoint")) and not list(dest.rglob("*.png"))
    for summary in dest.rglob("summary.json"):  # a git checkout writes files in any order: summaries after rank.json
        summary.touch()
    again = write_sweep_report(dest)  # the copied rank.json files stand in for the models
    assert [r["metrics"] for r in again["rows"]] == [r["metrics"] for r in report["rows"]]
    assert (dest / "sweep.md").read_text() == (out / "sweep.md").read_text()
    with pytest.raises(ConfigError, match="not a rank sweep"):
        write_sweep_report(tmp_path)


def test_rank_command_on_a_run(sweep, tmp_path, capsys):
    _, out, report = sweep
    run = out / "wd0" / "seed0"
    assert main(["rank", str(run), "--out", str(tmp_path / "r")]) == 0
    text = capsys.readouterr().out
    assert "| 1 | qk (mean of 2 heads) | 16 |" in text
    saved = json.loads((tmp_path / "r" / "rank.json").read_text())
    assert saved["metrics"] == pytest.approx(report["rows"][0]["metrics"])
    assert (tmp_path / "r" / "spectra.png").exists()


def test_rank_command_on_hugging_face_gpt2(tmp_path, capsys):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=2, n_head=4)
    hf = transformers.GPT2LMHeadModel(cfg)
    hf.save_pretrained(tmp_path / "gpt2")
    assert main(["rank", str(tmp_path / "gpt2"), "--out", str(tmp_path / "r")]) == 0
    assert "Hugging Face GPT-2" in capsys.readouterr().out
    spectra = json.loads((tmp_path / "r" / "rank.json").read_text())["spectra"]
    for layer, block in zip(spectra, hf.transformer.h):
        w = block.attn.c_attn.weight.detach().double()  # Conv1D [C, 3C]: x W, columns q | k | v
        for i, m in enumerate("qkv"):
            want = torch.linalg.svdvals(w[:, 32 * i:32 * (i + 1)])
            assert np.allclose(layer[m], want.numpy(), atol=1e-6), m
        assert np.allclose(layer["o"], torch.linalg.svdvals(block.attn.c_proj.weight.detach().double()).numpy(),
                           atol=1e-6)
        wq, wk = w[:, :32], w[:, 32:64]
        for h in range(4):
            prod = wq[:, 8 * h:8 * (h + 1)] @ wk[:, 8 * h:8 * (h + 1)].T
            assert np.allclose(layer["qk"][h], torch.linalg.svdvals(prod)[:8].numpy(), atol=1e-6)


def test_rank_command_errors(tmp_path, capsys):
    missing = tmp_path / "nothing"
    assert main(["rank", str(missing)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and str(missing) in err
    (tmp_path / "bert").mkdir()
    (tmp_path / "bert" / "config.json").write_text('{"model_type": "bert"}')
    assert main(["rank", str(tmp_path / "bert")]) == 2
    assert "model_type='bert'" in capsys.readouterr().err
