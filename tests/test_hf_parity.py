"""attnlab.GPT.from_hf_gpt2 reproduces transformers' GPT2LMHeadModel on the same weights."""

import json

import pytest
import torch

from attnlab import GPT, ConfigError

transformers = pytest.importorskip("transformers")


def _hf_model(tmp_path, safetensors=True, **overrides):
    cfg = transformers.GPT2Config(vocab_size=101, n_positions=40, n_embd=48, n_layer=3, n_head=4, **overrides)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # random LayerNorm/bias values too, so that no mapping error hides behind ones/zeros
        for name, p in model.named_parameters():
            if name.endswith("bias") or ".ln_" in name:
                p.add_(0.1 * torch.randn_like(p))
    model.save_pretrained(tmp_path)
    if not safetensors:  # the older pytorch_model.bin layout
        (tmp_path / "model.safetensors").unlink()
        torch.save(model.state_dict(), tmp_path / "pytorch_model.bin")
    return model


@pytest.mark.parametrize("safetensors", [True, False], ids=["safetensors", "bin"])
@pytest.mark.parametrize("overrides", [{}, {"scale_attn_weights": False}, {"activation_function": "gelu"}],
                         ids=["gpt2", "unscaled", "exact-gelu"])
def test_logits_match_transformers(tmp_path, safetensors, overrides):
    hf = _hf_model(tmp_path, safetensors, **overrides)
    ours = GPT.from_hf_gpt2(tmp_path).eval()
    idx = torch.randint(0, 101, (2, 40))
    with torch.no_grad():
        want = hf(idx).logits
        got, _ = ours(idx)
    assert (got - want).abs().max().item() < 1e-4


def test_other_attention_over_pretrained_weights(tmp_path):
    _hf_model(tmp_path)
    model = GPT.from_hf_gpt2(tmp_path, attention="rbf")
    assert model.config.resolved_attention().kernel == "rbf"
    with pytest.raises(ConfigError, match="cannot load them"):
        GPT.from_hf_gpt2(tmp_path, attention="mqa")
    for name, missing in (("qk-norm", "qk_gain"), ("low-rank", "_proj.down"), ("magnitude-causal", "magnitude")):
        with pytest.raises(ConfigError, match=f"attention='{name}' cannot load GPT-2 weights") as info:
            GPT.from_hf_gpt2(tmp_path, attention=name)
        assert missing in str(info.value) and "\n" not in str(info.value)


def test_unsupported_and_missing(tmp_path):
    with pytest.raises(ConfigError, match="config.json missing"):
        GPT.from_hf_gpt2(tmp_path)
    _hf_model(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["scale_attn_by_inverse_layer_idx"] = True
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="scale_attn_by_inverse_layer_idx"):
        GPT.from_hf_gpt2(tmp_path)


@pytest.mark.slow
def test_logits_match_transformers_at_gpt2_small_shape(tmp_path):
    """The real GPT-2 small shape (12 layers, 12 heads, width 768, 50257 tokens, 1024 positions; 124M parameters),
    built from config with random weights (nothing is downloaded), at a 1024-token context: the mapping holds at
    full size, where a transposed square weight or a wrong head split would still type-check."""
    cfg = transformers.GPT2Config()  # the defaults are GPT-2 small
    torch.manual_seed(0)
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    hf.save_pretrained(tmp_path)
    ours = GPT.from_hf_gpt2(tmp_path).eval()
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in hf.parameters())
    idx = torch.randint(0, cfg.vocab_size, (1, cfg.n_positions))
    with torch.no_grad():
        want = hf(idx).logits
        got, _ = ours(idx)
    # float32 through 12 layers: the two implementations sum in different orders; logits are O(1) here
    assert (got - want).abs().max().item() < 1e-3
    assert torch.equal(got.argmax(-1), want.argmax(-1))
