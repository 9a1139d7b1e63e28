"""Logit soft-capping, z -> c tanh(z / c) (Gemma 2, Team Gemma 2024, arXiv:2408.00118; AttentionConfig.softcap).

* attention() against a float64 numpy loop written from the formula (the cap on q . k scale / T, then the prior,
  the causal mask, the sink and the softmax), on the explicit path and on FlexAttention, causal or not, GQA, with
  more keys than queries; the rbf kernel and the stick-breaking normaliser on the explicit path;
* its gradients by torch.autograd.gradcheck (finite differences, float64);
* Hugging Face's Gemma 2, whose eager attention caps its logits (attn_logit_softcapping), against the same model
  on attnlab-standard, which receives the cap as HF's `softcap` argument, and against a Gemma 2 without its own
  cap running an attnlab config with one;
* the routes (no SDPA, Triton or prefix blocks), the one-line errors, a GPT on FlexAttention against the explicit
  path with a cached decode. The leak test covers the cap in tests/test_causal_leak.py.

Bounds: 1e-12 in float64 (sums of at most 12 terms); 1e-5 for HF's float32 models (another summation order).
"""

import math

import numpy as np
import pytest
import torch

from attnlab import GPT, GPTConfig, AttentionConfig, ConfigError, get_variant
from attnlab.attention_config import route
from attnlab.functional.attention import attention
from attnlab.mechanisms.stick_breaking.reference import stick_breaking_weights
from helpers import VOCAB, T, one_line_error

pytestmark = pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")

TOL = 1e-12


def _inputs(b=2, h=4, hkv=2, t=7, s=11, d=8, seed=0, spread=4.0):
    """q scaled by ``spread`` so that many logits exceed a cap of 1 (the cap must bite to be tested)."""
    g = torch.Generator().manual_seed(seed)
    q = spread * torch.randn(b, h, t, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(b, hkv, s, d, generator=g, dtype=torch.float64) for _ in range(2))
    return q, k, v, g


def _reference(q, k, v, *, cap, causal, scale, temperature=1.0, prior=None, sink=None, kernel="dot"):
    """The loop: z_ij = q_i . k_j scale / T (or -||q_i - k_j||^2 scale / (2T)), c tanh(z_ij / c), + prior_ij,
    -inf where j > S - T + i, softmax over the keys and the sink's logit, times v."""
    q, k, v = q.numpy(), k.numpy(), v.numpy()
    b, h, t, _ = q.shape
    s, group = k.shape[2], h // k.shape[1]
    out = np.zeros((b, h, t, v.shape[-1]))
    for bi in range(b):
        for hi in range(h):
            for i in range(t):
                z = []
                for j in range(s):
                    kj = k[bi, hi // group, j]
                    zij = (q[bi, hi, i] @ kj if kernel == "dot" else -((q[bi, hi, i] - kj) ** 2).sum() / 2) * scale
                    zij = cap * math.tanh(zij / temperature / cap)
                    if prior is not None:
                        zij += prior[bi, hi, i, j]
                    z.append(zij if not causal or j <= s - t + i else -math.inf)
                if sink is not None:
                    z.append(float(sink[hi]))
                z = np.array(z)
                p = np.exp(z - z.max())
                p /= p.sum()
                out[bi, hi, i] = p[:s] @ v[bi, hi // group]
    return out


@pytest.mark.parametrize("with_sink", [False, True], ids=["", "sink"])
@pytest.mark.parametrize("with_prior", [False, True], ids=["", "prior"])
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("backend", ["auto", "flex"])
def test_attention_against_the_loop(backend, causal, with_prior, with_sink):
    """T = 7 queries over S = 11 keys (causal: query i at position 4 + i), GQA 4 / 2, cap 1.5, temperature 0.8."""
    q, k, v, g = _inputs()
    prior = torch.randn(2, 4, 7, 11, generator=g, dtype=torch.float64) if with_prior else None
    sink = torch.randn(4, generator=g, dtype=torch.float64) if with_sink else None
    with torch.no_grad():
        out = attention(q, k, v, causal=causal, scale=0.3, temperature=0.8, logit_prior=prior, sink=sink,
                        softcap=1.5, backend=backend)
        uncapped = attention(q, k, v, causal=causal, scale=0.3, temperature=0.8, logit_prior=prior, sink=sink)
    ref = _reference(q, k, v, cap=1.5, causal=causal, scale=0.3, temperature=0.8,
                     prior=None if prior is None else prior.numpy(), sink=sink)
    assert np.abs(out.numpy() - ref).max() < TOL
    assert (out - uncapped).abs().max() > 1e-2  # the cap bites at these logits


def test_the_rbf_kernel_on_the_explicit_path():
    """The cap acts on the true rbf logits, -||q - k||^2 s / 2, not on SDPA's row-shifted ones."""
    q, k, v, _ = _inputs(spread=1.0)
    with torch.no_grad():
        out = attention(q, k, v, causal=True, scale=0.3, kernel="rbf", softcap=2.0)
    ref = _reference(q, k, v, cap=2.0, causal=True, scale=0.3, kernel="rbf")
    assert np.abs(out.numpy() - ref).max() < TOL


def test_stick_breaking_reads_the_capped_logits():
    """Another normaliser sees c tanh(z / c): stick-breaking's float64 reference on the capped logits."""
    q, k, v, _ = _inputs(t=9, s=9, hkv=4)
    from attnlab.mechanisms.normalizers import normalizer_fn

    with torch.no_grad():
        out, weights = attention(q, k, v, causal=True, scale=0.3, softcap=1.0,
                                 normalizer=normalizer_fn("stickbreaking"), return_weights=True)
    z = 1.0 * torch.tanh(q @ k.transpose(-1, -2) * 0.3 / 1.0)
    ref = stick_breaking_weights(z)
    assert (weights - ref).abs().max() < TOL
    assert (out - ref @ v).abs().max() < TOL


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_gradients_by_finite_differences(causal):
    q, k, v, g = _inputs(b=1, h=2, hkv=1, t=5, s=5, d=4, spread=2.0)
    prior = torch.randn(1, 2, 5, generator=g, dtype=torch.float64)
    inputs = tuple(x.requires_grad_() for x in (q, k, v, prior))
    assert torch.autograd.gradcheck(
        lambda q_, k_, v_, p_: attention(q_, k_, v_, causal=causal, logit_prior=p_, softcap=0.7), inputs)


def test_routes_leave_the_fused_paths():
    """SDPA and the Triton kernel have no hook for the cap, and the low-rank prefix blocks build their own logits:
    auto takes the explicit path; asking for the others is one line."""
    assert route(get_variant("standard").replace(softcap=30.0)).path == "explicit"
    assert route(get_variant("standard").replace(softcap=30.0), device="cuda", dtype="bfloat16").path == "explicit"
    assert route(get_variant("magnitude-prefix-logits-lowrank").replace(softcap=30.0)).path == "explicit"
    assert route(get_variant("magnitude-causal-logits").replace(softcap=30.0), device="cuda").path == "explicit"
    assert route(get_variant("standard").replace(softcap=30.0, backend="flex")).path == "flex"
    assert route(get_variant("standard").replace(softcap=30.0)).cacheable
    one_line_error(lambda: get_variant("standard").replace(softcap=30.0, backend="sdpa"),
                   "attention.backend='sdpa'", "softcap=30.0")
    one_line_error(lambda: get_variant("standard").replace(softcap=30.0, backend="triton"),
                   "attention.backend='triton'", "softcap=30.0")


@pytest.mark.parametrize("bad", [0, -1.0, "30", True, math.inf, math.nan])
def test_a_bad_cap_is_one_line(bad):
    one_line_error(lambda: AttentionConfig(softcap=bad), "attention.softcap=")
    q, k, v, _ = _inputs()
    with pytest.raises(ValueError, match=r"^softcap=.*allowed: a finite number > 0") as caught:
        attention(q, k, v, softcap=bad)
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="^backend='sdpa' cannot compute .*a softcap"):
        attention(q, k, v, softcap=2.0, backend="sdpa")
    with pytest.raises(ValueError, match="^backend='triton' cannot compute .*a softcap"):
        attention(q.float(), k.float(), v.float()[:, :, :, :8], causal=True, softcap=2.0, backend="triton")


def _gpt(backend, softcap=0.5):
    """GQA with a fixed QK-norm: logits g cos(q, k) up to sqrt(8), well past the cap at initialisation."""
    torch.manual_seed(0)
    cfg = AttentionConfig(n_kv_head=2, qk_norm="fixed", backend=backend, softcap=softcap)
    return GPT(GPTConfig(vocab_size=VOCAB, block_size=T, n_layer=2, n_head=4, n_embd=32, attention=cfg,
                         pos_encoding="rope")).double().eval()


def test_a_gpt_on_flex_equals_the_explicit_path_and_its_cached_decode():
    idx = torch.randint(0, VOCAB, (2, T), generator=torch.Generator().manual_seed(5))
    flex, explicit = _gpt("flex"), _gpt("auto")
    with torch.no_grad():
        full = flex(idx)[0]
        assert (full - explicit(idx)[0]).abs().max() < TOL
        assert (full - _gpt("auto", None)(idx)[0]).abs().max() > 1e-4  # the cap reaches the model
        for model in (flex, explicit):
            cache = model.new_cache()
            steps = [model(idx[:, :5], cache=cache)[0]] + [model(idx[:, i:i + 1], cache=cache)[0]
                                                           for i in range(5, T)]
            assert (torch.cat(steps, dim=1) - full).abs().max() < TOL


def _gemma(impl, cap):
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)  # the same weights for every implementation: the cap adds no parameter
    config = transformers.Gemma2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                       max_position_embeddings=64, attn_logit_softcapping=cap,
                                       final_logit_softcapping=None, query_pre_attn_scalar=16)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=impl).eval()
    with torch.no_grad():  # queries 50x larger: logits past the cap (a random model's are near 0)
        for layer in model.model.layers:
            layer.self_attn.q_proj.weight.mul_(50.0)
    return model


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 14), generator=g)
    mask = torch.ones(3, 14, dtype=torch.long)
    mask[0, :4] = 0  # left padding
    return ids, mask


@pytest.fixture(scope="module")
def registered():
    pytest.importorskip("transformers")
    from attnlab.hf import register_attention

    return register_attention(["standard"], configs={"cap-02": AttentionConfig(softcap=0.2),
                                                      "cap-05": AttentionConfig(softcap=0.5)})


def test_gemma2s_own_cap_reaches_attnlab(registered):
    """Gemma 2 with attn_logit_softcapping = 0.2 and its queries scaled up (so that the cap bites on a random
    model): eager against
    attnlab-standard, which gets the cap as HF's softcap argument; without the cap the logits differ."""
    ids, mask = _batch()
    real = mask.bool()
    with torch.no_grad():
        eager = _gemma("eager", 0.2)(input_ids=ids, attention_mask=mask).logits
        ours = _gemma("attnlab-standard", 0.2)(input_ids=ids, attention_mask=mask).logits
        uncapped = _gemma("eager", None)(input_ids=ids, attention_mask=mask).logits
        from_config = _gemma("attnlab-cap-02", None)(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(ours[real], eager[real], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(from_config[real], eager[real], rtol=1e-5, atol=1e-5)
    assert (eager[real] - uncapped[real]).abs().max() > 1e-3


def test_two_different_caps_are_one_line(registered):
    ids, mask = _batch()
    with pytest.raises(ConfigError, match=r"^the model caps its attention logits at softcap=0.2 and the attnlab "
                                          r"config at softcap=0.5; [^\n]+$"):
        _gemma("attnlab-cap-05", 0.2)(input_ids=ids, attention_mask=mask)

