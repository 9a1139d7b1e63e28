"""`attnlab heads`: the JS divergence against scipy's, head similarity of identical heads, the
knockout of a head that is zero by construction (and of any head, against zeroing its columns of W_o), the MoH
router usage against moh_gates recomputed from each layer's input, and the command on a tiny trained MoH run."""

import json
import math
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.spatial.distance import jensenshannon

from attnlab import GPT, GPTConfig
from attnlab.analysis.heads import head_knockout, head_similarity, js_divergence, mean_loss, moh_usage
from attnlab.cli import main
from attnlab.experiments.heads import heads_table, write_heads
from attnlab.mechanisms.heads.functional import moh_gates
from attnlab.rundir import CHECKPOINT_DIR
from attnlab.train import train
from helpers import one_line_error, tiny


def _random_distributions(rng, n, s, zero_fraction):
    p = rng.random((n, s)) * (rng.random((n, s)) >= zero_fraction)
    p[:, 0] += 0.1  # no empty row
    return p / p.sum(1, keepdims=True)


def test_js_divergence_matches_scipy_with_zeros_in_both():
    rng = np.random.default_rng(0)
    p, q = _random_distributions(rng, 200, 12, 0.4), _random_distributions(rng, 200, 12, 0.4)
    p[:5, 6:], q[5:10, 6:] = 0.0, 0.0  # masked keys: zeros in p only, in q only, and (by chance) in both
    p[:5] /= p[:5].sum(1, keepdims=True)
    q[5:10] /= q[5:10].sum(1, keepdims=True)
    assert ((p == 0) & (q > 0)).any() and ((q == 0) & (p > 0)).any() and ((p == 0) & (q == 0)).any()
    want = jensenshannon(p, q, axis=1) ** 2  # scipy returns sqrt(JS), natural log by default
    got = js_divergence(torch.from_numpy(p), torch.from_numpy(q)).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])), math.log(2))


def test_head_similarity_is_symmetric_and_zero_for_identical_heads():
    torch.manual_seed(0)
    logits = torch.randn(3, 1, 6, 6).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    same = torch.softmax(logits, -1).expand(3, 4, 6, 6)
    s = head_similarity(same)
    assert s.shape == (4, 4) and (s == 0).all()
    other = torch.softmax(torch.randn(3, 4, 6, 6, dtype=torch.float64).masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), -1e9), -1)
    s = head_similarity(other)
    assert (s == s.T).all() and (s.diagonal() == 0).all() and (s + torch.eye(4) > 0).all()
    want = np.mean([jensenshannon(other[b, 1, i], other[b, 3, i]) ** 2 for b in range(3) for i in range(6)])
    assert s[1, 3].item() == pytest.approx(want, rel=1e-10)


def _loss(model, windows):
    with torch.no_grad():
        return np.mean([F.cross_entropy(model(x)[0].flatten(0, 1), y.flatten()).item() for x, y in windows])


def test_knockout_of_a_zero_head_is_zero_and_equals_zeroing_its_output_columns():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=12, n_layer=2, n_head=4, n_embd=16)).double().eval()
    d = 16 // 4
    with torch.no_grad():
        model.blocks[1].attn.out_proj.weight[:, 2 * d:3 * d] = 0  # head 2 of layer 1 writes nothing
    g = torch.Generator().manual_seed(1)
    windows = [(torch.randint(0, 20, (3, 12), generator=g), torch.randint(0, 20, (3, 12), generator=g))
               for _ in range(2)]
    deltas = head_knockout(model, windows)
    assert deltas.shape == (2, 4) and deltas.dtype == torch.float64
    assert abs(deltas[1, 2].item()) <= 1e-12
    assert (deltas.abs() > 1e-9).sum() == 7  # every other head changes the loss
    base = _loss(model, windows)
    for layer, head in ((0, 0), (0, 3), (1, 1)):  # masking a head = zeroing the columns of W_o that read it
        ablated = GPT(model.config).double().eval()
        ablated.load_state_dict(model.state_dict())
        with torch.no_grad():
            ablated.blocks[layer].attn.out_proj.weight[:, head * d:(head + 1) * d] = 0
        assert deltas[layer, head].item() == pytest.approx(_loss(ablated, windows) - base, abs=1e-12)
    xi = torch.ones(2, 4)
    xi[0, 1] = 0.0  # the mask is an argument of the forward: nothing is left on the model
    ablated = GPT(model.config).double().eval()
    ablated.load_state_dict(model.state_dict())
    with torch.no_grad():
        ablated.blocks[0].attn.out_proj.weight[:, d:2 * d] = 0
    assert mean_loss(model, windows, xi) == pytest.approx(_loss(ablated, windows), abs=1e-12)
    assert mean_loss(model, windows) == pytest.approx(base, abs=1e-15)
    with pytest.raises(ValueError, match=r"head_mask must have shape \[n_layer, n_head\] = \[2, 4\]"):
        model(windows[0][0], head_mask=torch.ones(4))


def test_moh_usage_is_the_mean_of_the_gates():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=20, block_size=12, n_layer=2, n_head=6, n_embd=24, attention="moh"))
    model = model.double().train()  # moh_usage runs in eval mode and restores the mode
    idx = torch.randint(0, 20, (4, 12), generator=torch.Generator().manual_seed(2))
    usage = moh_usage(model, idx)
    assert model.training
    model.eval()
    x = model.embed(idx)
    for block, u in zip(model.blocks, usage):
        router, h = block.attn.router, block.ln_1(x)
        gates = moh_gates(router.w_shared(h), router.w_routed(h), router.w_group(h), router.top_k)[0]
        assert (u["shared"], u["top_k"]) == (3, 1)
        torch.testing.assert_close(u["weight"], gates.flatten(0, 1).mean(0).double(), rtol=1e-12, atol=1e-12)
        top = np.argsort(-router.w_routed(h).detach().numpy(), axis=-1)[..., : router.top_k]  # top-k of W_r x
        want = np.array([(top == i).any(-1).mean() for i in range(3)])
        np.testing.assert_allclose(u["selected"].numpy(), want)
        assert u["selected"].sum().item() == pytest.approx(router.top_k)
        x = block(x, model.rope).y
    assert moh_usage(GPT(GPTConfig(vocab_size=20, block_size=12, n_layer=1, n_head=2, n_embd=8)), idx) == [None]


def test_cli_on_a_tiny_moh_run(tmp_path, capsys):
    run = tmp_path / "run"
    train(tiny(run, tmp_path / "cache", train__max_steps=2, train__warmup_steps=1, train__eval_interval=0,
               train__sample_tokens=0, model__attention="moh", model__n_head=4), quiet=True)
    assert main(["heads", str(run), "--windows", "3"]) == 0
    out = capsys.readouterr().out
    assert "most important head" in out and "layer 1 MoH router" in out
    assert sorted(p.name for p in (run / "heads").iterdir()) == ["heads.json", "js.png", "knockout.png"]
    assert all((run / "heads" / name).stat().st_size > 1000 for name in ("js.png", "knockout.png"))
    report = json.loads((run / "heads" / "heads.json").read_text())
    assert len(report["layers"]) == 2 and report["windows"] == 3
    for row in report["layers"]:
        assert np.array(row["js"]).shape == (4, 4) and len(row["knockout"]) == 4
        assert row["base_loss"] == report["base_loss"] and math.isfinite(report["base_loss"])
        assert len(row["moh"]["weight"]) == 4 and sum(row["moh"]["selected"]) == pytest.approx(1.0)
    again = write_heads(run, tmp_path / "again", windows=3)["report"]  # fixed windows: the same numbers
    assert again["layers"] == report["layers"]
    table = heads_table({"moh run": report}).splitlines()  # the docs' HEADS block: a row per layer
    assert table[0].count("delta h") == 4 and len(table) == 2 + 2
    row = table[3].split(" | ")
    assert row[1] == "1" and float(row[4 + 2]) == pytest.approx(report["layers"][1]["knockout"][2], abs=1e-4)
    assert row[-1].rstrip(" |").split() == [f"{g:.2f}" for g in report["layers"][1]["moh"]["weight"]]
    text = write_heads(run, tmp_path / "text", text="To be, or not", windows=3)["report"]
    assert text["layers"][0]["knockout"] == report["layers"][0]["knockout"] and text["js_on"].startswith("--text")
    assert text["layers"][0]["js"] != report["layers"][0]["js"]

    one_line_error(lambda: write_heads(run, text=""), "--text='' is empty")
    assert main(["heads", str(run), "--text", ""]) == 2
    assert "--text='' is empty" in capsys.readouterr().err
    bare = tmp_path / "bare"
    shutil.copytree(run, bare)
    shutil.rmtree(bare / CHECKPOINT_DIR)
    one_line_error(lambda: write_heads(bare), str(bare), "has no checkpoint")
    one_line_error(lambda: write_heads(run, windows=0), "--windows=0 must be >= 1")
