"""GPT.save_pretrained / from_pretrained: every registered variant round-trips exactly, with
every parameter moved off its initial value first (so a parameter that failed to save or load would show)."""

import json

import pytest
import torch

from attnlab import GPT, ConfigError, GPTConfig
from attnlab.registry import variants
from helpers import fit_rank, one_line_error


@pytest.mark.parametrize("name", variants())
def test_every_variant_round_trips_exactly(name, tmp_path):
    cfg = GPTConfig(vocab_size=30, block_size=16, n_layer=2, n_head=4, n_embd=32, attention=fit_rank(name, 16),
                    pos_encoding="rope")
    torch.manual_seed(0)
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.01 * torch.randn_like(p))  # off the init: learned t, beta, gamma, landmarks, gains included
    model.save_pretrained(tmp_path / "m")
    loaded = GPT.from_pretrained(tmp_path / "m")
    ours, theirs = model.state_dict(), loaded.state_dict()
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    assert loaded.lm_head.weight is loaded.wte.weight  # the tie survives
    idx = torch.randint(0, 30, (2, 16))
    model.eval(), loaded.eval()  # deterministic forwards (coda samples its logits in training)
    assert torch.equal(model(idx)[0], loaded(idx)[0])
    saved = json.loads((tmp_path / "m" / "config.json").read_text())
    assert saved["model_type"] == "attnlab-gpt" and saved["attnlab_variant"] == (name if cfg.attention == name else None)
    assert isinstance(saved["config"]["attention"], dict)  # the full AttentionConfig, not a name


def test_a_directory_that_is_not_ours_is_one_line(tmp_path):
    one_line_error(lambda: GPT.from_pretrained(tmp_path), "is not an attnlab model directory")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    (tmp_path / "model.safetensors").write_bytes(b"")
    one_line_error(lambda: GPT.from_pretrained(tmp_path), "model_type='gpt2'", "from_hf_gpt2")
