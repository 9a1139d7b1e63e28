"""attnlab attention inside Hugging Face models: attnlab-standard against HF's own sdpa and eager
implementations on small random Llama and GPT-2 models, with padding; Gemma 2's sliding window through HF's mask;
generate with HF's K/V cache against generate without it; the refusals."""

import pytest
import torch

from attnlab import AttentionConfig, ConfigError
from attnlab.config import MagnitudeConfig
from attnlab.hf import hf_refusal, hf_variants, register_attention

transformers = pytest.importorskip("transformers")

VOCAB = 97


def _config(kind):
    if kind == "llama":  # GQA (4 query heads, 2 K/V heads) and RoPE
        return transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return transformers.GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4)


def _model(kind, impl):
    torch.manual_seed(0)  # the same weights for every implementation
    return transformers.AutoModelForCausalLM.from_config(_config(kind), attn_implementation=impl).eval()


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 14), generator=g)
    mask = torch.ones(3, 14, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    mask[1, -3:] = 0  # right padding
    return ids, mask


@pytest.fixture(scope="module", autouse=True)
def registered():
    return register_attention() + register_attention(configs={
        "explicit": AttentionConfig(backend="explicit"),
        "half-scale": AttentionConfig(scale=0.25 / 2),  # head_dim 16: 1/sqrt(16) / 2
        "temperature-2": AttentionConfig(temperature=2.0),
    })


@pytest.mark.parametrize("kind", ["llama", "gpt2"])
@pytest.mark.parametrize("impl", ["attnlab-standard", "attnlab-explicit", "attnlab-mask-renormalize"])
def test_matches_hf_sdpa_and_eager_with_padding(kind, impl):
    """Logits at every real (unpadded) position equal HF's sdpa and eager implementations on the same weights.
    float32 throughout; the explicit path sums in another order than SDPA's kernel, so 1e-5."""
    ids, mask = _batch()
    with torch.no_grad():
        ours = _model(kind, impl)(input_ids=ids, attention_mask=mask).logits
        for reference in ("sdpa", "eager"):
            theirs = _model(kind, reference)(input_ids=ids, attention_mask=mask).logits
            real = mask.bool()
            torch.testing.assert_close(ours[real], theirs[real], rtol=1e-5, atol=1e-5)
    assert torch.isfinite(ours).all()  # padded positions too: a query that sees no key gives 0, not NaN


@pytest.mark.parametrize("impl", ["attnlab-rbf", "attnlab-mask-renormalize", "attnlab-standard"])
def test_generate_with_the_kv_cache_equals_generate_without_it(impl):
    """Decoding with HF's cache puts query i of T at position S - T + i; greedy tokens must equal the no-cache run
    (which recomputes the whole prefix), in a left-padded batch."""
    ids, mask = _batch()
    model = _model("llama", impl)
    kwargs = dict(input_ids=ids[:2], attention_mask=torch.ones_like(mask[:2]), max_new_tokens=10, do_sample=False,
                  pad_token_id=0)
    kwargs["attention_mask"][0, :4] = 0
    cached = model.generate(**kwargs)
    uncached = model.generate(use_cache=False, **kwargs)
    assert cached.shape == (2, 24)
    assert torch.equal(cached, uncached)


def test_custom_configs_reach_the_model():
    """scale s/2 and temperature 2 are the same logits z = q.k s / 2 by two different switches; both differ from
    standard, so the config is what runs."""
    ids, mask = _batch()
    with torch.no_grad():
        half = _model("llama", "attnlab-half-scale")(input_ids=ids, attention_mask=mask).logits
        temp = _model("llama", "attnlab-temperature-2")(input_ids=ids, attention_mask=mask).logits
        std = _model("llama", "attnlab-standard")(input_ids=ids, attention_mask=mask).logits
    real = mask.bool()
    torch.testing.assert_close(half[real], temp[real], rtol=1e-5, atol=1e-5)
    assert (half[real] - std[real]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["mla", "low-rank", "magnitude-causal", "magnitude-prefix-logits", "identity-qk",
                                  "residual-qk", "boneless-corr", "gqa", "qk-norm"])
def test_variants_that_change_the_projections_are_refused_by_name(name):
    assert name not in hf_variants() and hf_refusal(name)
    with pytest.raises(ConfigError, match=rf"^'{name}' cannot be an HF attention implementation: [^\n]+$"):
        register_attention([name])


def test_bad_names_and_configs_are_one_line_errors():
    with pytest.raises(ConfigError, match="unknown attention variant 'nope'"):
        register_attention(["nope"])
    with pytest.raises(ConfigError, match="must be an attnlab.AttentionConfig"):
        register_attention(configs={"x": {"temperature": 2}})
    with pytest.raises(ConfigError, match="magnitude gate has learned parameters"):
        register_attention(configs={"m": AttentionConfig(magnitude=MagnitudeConfig("causal"))})
    assert hf_refusal(AttentionConfig(qk_norm="fixed", normalizer="none", temperature=0.5)) is None


def test_a_sliding_window_comes_through_hfs_mask():
    """Gemma 2 alternates sliding-window and global layers; HF builds the window into the mask it hands the
    attention function. With a window of 4 over 14 tokens (left-padded), attnlab-standard gives HF eager's logits,
    and the window changes them (a window of 64 covers every token)."""
    def gemma(impl, window):
        torch.manual_seed(0)
        config = transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                           head_dim=16, max_position_embeddings=64, sliding_window=window,
                                           attn_logit_softcapping=None, final_logit_softcapping=None)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
        with torch.no_grad():  # sharper attention on a random model, so that the hidden keys matter
            for layer in model.model.layers:
                layer.self_attn.q_proj.weight.mul_(50.0)
        return model

    ids, mask = _batch()
    real = mask.bool()
    with torch.no_grad():
        ours, eager, wide = (gemma(impl, window)(input_ids=ids, attention_mask=mask).logits
                             for impl, window in (("attnlab-standard", 4), ("eager", 4), ("eager", 64)))
    torch.testing.assert_close(ours[real], eager[real], rtol=1e-5, atol=1e-5)
    assert (eager[real] - wide[real]).abs().max() > 1e-3
