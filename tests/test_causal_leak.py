"""Causality: perturbing the tokens after position i must leave the logits at positions <= i unchanged.

Run in float64 so that the only admissible difference is rounding (~1e-15); the bound is 1e-6.
Every registered variant is covered automatically, with every positional encoding, on the auto and explicit backends, and on FlexAttention where it applies.
"""

import pytest
import torch

from attnlab import GPT, GPTConfig, get_variant, variants
from attnlab.attention_config import _flex_misfits
from attnlab.nn import Attention, LayerOutput
from attnlab.config import POS_ENCODINGS
from helpers import LEAK_TOL, VOCAB, alibi_refused, build, max_leak


@pytest.mark.parametrize("pos", POS_ENCODINGS)
@pytest.mark.parametrize("variant", variants())
def test_no_variant_leaks_the_future(variant, pos):
    if alibi_refused(variant, pos):
        pytest.skip(f"{variant} has no softmax for ALiBi's bias")
    assert max_leak(build(variant, pos)) < LEAK_TOL


@pytest.mark.parametrize("variant", variants())
def test_no_leak_on_explicit_backend(variant):
    from attnlab import get_variant

    cfg = get_variant(variant).replace(backend="explicit")
    assert max_leak(build(cfg, "rope")) < LEAK_TOL


FLEX_FITS = [v for v in variants() if not _flex_misfits(get_variant(v))]


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("pos", ["rope", "alibi"])
@pytest.mark.parametrize("variant", FLEX_FITS)
def test_no_leak_on_flex_backend(variant, pos):
    """Every registered variant that FlexAttention computes, on backend 'flex' (its forward runs on the CPU, unfused:
    the causal block mask, the prior read inside score_mod and ALiBi's bias computed there are what is checked)."""
    if alibi_refused(variant, pos):
        pytest.skip(f"{variant} has no softmax for ALiBi's bias")
    assert max_leak(build(get_variant(variant).replace(backend="flex"), pos)) < LEAK_TOL


@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("backend", ["auto", "flex"])
@pytest.mark.parametrize("variant", ["standard", "gqa", "sink", "ssmax", "differential", "magnitude-causal-logits",
                                     "magnitude-prefix-logits-lowrank", "count-prior", "stick-breaking", "softpick",
                                     "selective", "rbf"])
def test_no_leak_with_a_softcap(variant, backend):
    """A logit softcap (attention.softcap) takes the explicit path or FlexAttention's score modifier: both stay
    causal, for the variants whose logits it bends (those FlexAttention cannot compute are run on auto only)."""
    cfg = get_variant(variant).replace(softcap=0.5)
    if backend == "flex":
        if _flex_misfits(cfg):
            pytest.skip(f"{variant} is not a FlexAttention configuration")
        cfg = cfg.replace(backend="flex")
    assert max_leak(build(cfg, "rope")) < LEAK_TOL


def test_detects_bidirectional_attention():
    from attnlab import AttentionConfig

    assert max_leak(build(AttentionConfig(causal=False))) > 10 * LEAK_TOL


class _DenominatorLeak(Attention):
    """A plausible bug: mask after a full-row softmax without renormalising, so the denominator sums future keys."""

    def run(self, x, rope=None, **_):
        q = self._heads(self.q_proj(x), self.n_head)
        k = self._heads(self.k_proj(x), self.n_kv_head)
        v = self._heads(self.v_proj(x), self.n_kv_head)
        w = torch.softmax(q @ k.transpose(-1, -2) * self.head_dim ** -0.5, -1).tril()  # rows no longer sum to 1
        return LayerOutput(self.out_proj((w @ v).transpose(1, 2).flatten(-2)))


def test_detects_a_planted_denominator_leak():
    model = build("standard")
    for block in model.blocks:
        leaky = _DenominatorLeak(block.attn.config, 32)
        leaky.load_state_dict(block.attn.state_dict())
        block.attn = leaky
    assert max_leak(model) > 10 * LEAK_TOL  # caught with margin by the same bound


@pytest.mark.slow
@pytest.mark.parametrize("variant", variants())
def test_no_leak_at_the_cpu_preset_context(variant):
    """The same perturbation test at T = 256 (the default preset's context) in the default preset's shape: the
    fused SDPA kernels split long sequences into blocks and the magnitude solves grow to 256 x 256, paths that
    T = 16 does not reach."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=VOCAB, block_size=256, n_layer=2, n_head=4, n_embd=128, attention=variant))
    model = model.double().eval()
    g = torch.Generator().manual_seed(1)
    idx = torch.randint(0, VOCAB, (1, 256), generator=g)
    with torch.no_grad():
        base = model(idx)[0]
        for i in (0, 63, 130, 254):
            perturbed = idx.clone()
            perturbed[:, i + 1:] = (idx[:, i + 1:] + 1) % VOCAB
            out = model(perturbed)[0]
            assert (out[:, : i + 1] - base[:, : i + 1]).abs().max().item() < LEAK_TOL
            assert (out[:, i + 1:] - base[:, i + 1:]).abs().max() > 1e-6
