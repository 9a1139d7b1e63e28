"""K/V-cache decoding: for every registered variant where the cache is exact, incremental logits
equal the full forward's and generate gives the very tokens of the full recomputation; the magnitude variants
fall back to recomputation and refuse a cache with one line."""

import pytest
import torch

from attnlab import GPT, ConfigError, GPTConfig
from attnlab.registry import get_variant, variants
from attnlab.config import POS_ENCODINGS
from helpers import alibi_refused, fit_rank

BLOCK = 12
CACHEABLE = [n for n in variants()
             if get_variant(n).magnitude is None and get_variant(n).causal and not get_variant(n).count_prior
             and not get_variant(n).selective]


def _model(attention, pos="learned"):
    cfg = GPTConfig(vocab_size=40, block_size=BLOCK, n_layer=2, n_head=4, n_embd=32,
                    attention=fit_rank(attention, BLOCK), pos_encoding=pos)
    torch.manual_seed(0)
    return GPT(cfg).double().eval()


def test_the_cacheable_variants_are_those_without_a_magnitude_gate_or_count_prior():
    assert {"standard", "gqa", "mqa", "rbf", "mask-renormalize", "mla", "qk-norm", "boneless-corr"} <= set(CACHEABLE)
    for name in variants():
        assert _model(name).cache_exact == (name in CACHEABLE), name


@pytest.mark.parametrize("name", CACHEABLE)
@pytest.mark.parametrize("pos", POS_ENCODINGS)
def test_incremental_logits_equal_the_full_forward(name, pos):
    """Prefill 5 tokens, then feed 1, 2 and 4 at a time: every logit equals the full forward over the 12 tokens.
    float64, so 1e-10 (the two differ only in summation order)."""
    if alibi_refused(name, pos):
        pytest.skip(f"{name} has no softmax for ALiBi's bias")
    model = _model(name, pos)
    idx = torch.randint(0, 40, (2, BLOCK), generator=torch.Generator().manual_seed(1))
    full = model(idx)[0]
    cache = model.new_cache()
    pieces = [model(idx[:, :5], cache=cache)[0]]
    for start, stop in ((5, 6), (6, 8), (8, 12)):
        pieces.append(model(idx[:, start:stop], cache=cache)[0])
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-10, atol=1e-10)
    assert cache.length == BLOCK
    with pytest.raises(ValueError, match="after 12 cached exceeds block_size=12"):
        model(idx[:, :1], cache=cache)


# generate is one loop for every variant: three of them (softmax, a latent cache, routed heads) in the default suite, the
# rest with the slow tests; the incremental logits above are checked for every variant in both.
@pytest.mark.parametrize("name", [n if n in ("standard", "mla", "moh") else pytest.param(n, marks=pytest.mark.slow)
                                  for n in CACHEABLE])
def test_generate_with_the_cache_gives_the_tokens_of_full_recomputation(name):
    """Sampling at temperature 1 under one seed, past block_size (the window then restarts), and greedy."""
    model = _model(name, "rope" if name != "boneless-corr" else "learned")
    idx = torch.randint(0, 40, (3, 4), generator=torch.Generator().manual_seed(2))
    for kwargs in (dict(temperature=1.0, top_k=20), dict(temperature=0.0)):
        cached = model.generate(idx, 20, generator=torch.Generator().manual_seed(3), use_cache=True, **kwargs)
        full = model.generate(idx, 20, generator=torch.Generator().manual_seed(3), use_cache=False, **kwargs)
        assert cached.shape == (3, 24)
        assert torch.equal(cached, full)


@pytest.mark.parametrize("name", ["magnitude-causal", "magnitude-prefix", "magnitude-causal-lowrank", "count-prior",
                                  "selective"])
def test_magnitude_variants_recompute_and_refuse_a_cache(name):
    model = _model(name)
    assert not model.cache_exact
    idx = torch.randint(0, 40, (1, 4), generator=torch.Generator().manual_seed(4))
    out = model.generate(idx, 3, temperature=0.0)  # recomputes the prefix at every token
    assert out.shape == (1, 7)
    with pytest.raises(ConfigError, match="^a K/V cache is exact only for causal attention without a magnitude gate"):
        model.generate(idx, 3, use_cache=True)


def test_mla_caches_its_latent_not_k_and_v():
    """MLA's cache holds d_c floats per token (the latent c), as kv_cache_per_token reports; the logits stay exact
    (test_incremental_logits_equal_the_full_forward)."""
    model = _model("mla", "rope")
    cache = model.new_cache()
    model(torch.randint(0, 40, (2, 5)), cache=cache)
    per_token = model.blocks[0].attn.kv_cache_per_token
    for layer in cache.layers:
        (latent,) = layer.buffers
        assert latent.shape == (2, BLOCK, per_token["cached"]) and per_token["cached"] < per_token["kv"]
