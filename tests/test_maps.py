"""`attnlab maps`: the weights it draws are the softmax of the layer's own q.k, recomputed here in
float64 from the layer's projections; the magnitude weights of the causal form are those of a dense float64 solve
of each key's prefix system; the command writes one picture per layer (and per magnitude layer)."""

import math

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig
from attnlab.analysis.maps import attention_pictures
from attnlab.cli import main
from attnlab.configio import apply_overrides
from attnlab.experiments.maps import write_maps
from attnlab.train import train
from helpers import one_line_error, tiny


def _gaussian_prefix_weight(k: np.ndarray, t: float, eps: float) -> np.ndarray:
    """w_j = mu_j of (Z + eps I) mu = 1 over keys 1..j, Z_jl = exp(-t |k_j - k_l|^2 / d) (the magnitude write-up), key by key."""
    d = k.shape[-1]
    w = np.zeros(len(k))
    for j in range(len(k)):
        sq = ((k[:j + 1, None, :] - k[None, :j + 1, :]) ** 2).sum(-1)
        mu = np.linalg.solve(np.exp(-t * sq / d) + eps * np.eye(j + 1), np.ones(j + 1))
        w[j] = mu[j]
    return w


def test_pictures_match_a_float64_recomputation():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=2, n_embd=16, attention="magnitude-causal",
                          pos_encoding="none")).double()
    idx = torch.randint(0, 30, (1, 10))
    pictures = attention_pictures(model, idx)
    x = model.embed(idx)
    for block, pic in zip(model.blocks, pictures):
        h = block.ln_1(x)
        q, k, v = (t[0].detach().numpy() for t in block.attn.project(h))  # [H, T, d]
        for head in range(2):
            z = q[head] @ k[head].T / math.sqrt(q.shape[-1])
            z[np.triu_indices(10, 1)] = -np.inf
            p = np.exp(z - z.max(1, keepdims=True))
            np.testing.assert_allclose(pic.weights[head].numpy(), p / p.sum(1, keepdims=True), atol=1e-10)
            t = float(block.attn.magnitude.t.detach())
            # the gate solves with eps = 1e-3 and a jitter retry only on a failed factor: 1e-8 is rounding
            np.testing.assert_allclose(pic.magnitude[head].numpy(), _gaussian_prefix_weight(k[head], t, 1e-3),
                                       rtol=1e-8, atol=1e-8)
        assert pic.applied_as == "gate" and pic.gates.shape == (2, 10)
        x = x + block.attn(h)
        x = x + block.mlp(block.ln_2(x))


def test_cli_writes_one_picture_per_layer_and_per_gate(tmp_path, capsys):
    run = tmp_path / "run"
    cfg = apply_overrides(tiny(run, tmp_path / "cache", train__max_steps=2, train__warmup_steps=1,
                               train__eval_interval=0, train__sample_tokens=0),
                          ["data.source=task:mqar", "model.attention=magnitude-prefix", "model.n_layer=2"])
    train(cfg, quiet=True)
    assert main(["maps", str(run), "--out", str(tmp_path / "pics")]) == 0
    written = sorted(p.name for p in (tmp_path / "pics").iterdir())
    assert written == ["layer0_attention.png", "layer0_gates.png", "layer1_attention.png", "layer1_gates.png"]
    assert all((tmp_path / "pics" / name).stat().st_size > 1000 for name in written)
    assert capsys.readouterr().out.count(".png") == 4
    one_line_error(lambda: write_maps(run, text="1 " * 500), "--text gives 500 tokens; allowed 1..32")
    assert main(["maps", str(run), "--text", "k1"]) == 2  # the CLI prints the one line and exits 2
    assert "is not a token of task 'mqar'" in capsys.readouterr().err


def test_text_runs_need_text(tmp_path):
    run = tmp_path / "lm"
    train(tiny(run, tmp_path / "cache", train__max_steps=1, train__warmup_steps=1, train__eval_interval=0,
               train__sample_tokens=0), quiet=True)
    one_line_error(lambda: write_maps(run), "give the tokens to look at with --text")
    assert main(["maps", str(run), "--text", "To be, or not"]) == 0
    assert sorted(p.name for p in (run / "maps").iterdir())[0] == "layer0_attention.png"
    with pytest.raises(ValueError, match=r"one sequence of shape \[1, T\]"):
        attention_pictures(GPT(GPTConfig(vocab_size=5, block_size=4, n_layer=1, n_head=1, n_embd=8)),
                           torch.zeros(2, 3, dtype=torch.long))
