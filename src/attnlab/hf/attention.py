"""attnlab's attention inside Hugging Face models: one `AttentionInterface` entry per eligible variant.

transformers (>= 4.48) lets a model pick its attention function by name: `attn_implementation="sdpa"`, or any
name registered in `transformers.AttentionInterface`. The function receives the model's own q [B, H, T, d] and
k, v [B, Hkv, S, d] (after its RoPE and its K/V cache), the model's mask and its scaling, and returns the heads'
outputs [B, T, H, dv]. `register_attention()` adds `attnlab-<variant>` for every registered variant whose change
lives inside that function, so

    attnlab.hf.register_attention()
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="attnlab-rbf")

runs any HF causal LM with attnlab's rbf kernel, in forward and in `generate` with HF's K/V cache (decoding puts
query i of T at position S - T + i; attnlab.functional.attention handles S > T).

A variant qualifies when its AttentionConfig differs from `standard` only in these switches: the kernel, the
normalizer, the temperature, the scale, the causal mask's form, the backend, a fixed QK-norm (`qk_norm =
"fixed"`) and a logit softcap (a model's own cap, Gemma 2's `attn_logit_softcapping`, arrives as the `softcap`
argument and is applied the same way). Every other switch changes the projections or adds parameters (K/V head count, Q/K/V modes, low rank,
MLA, the magnitude gate, a learned QK-norm gain) and belongs to the HF model's own modules; those variants are
refused by name with the reason (`hf_refusal`).

The mask: the entries registered here reuse transformers' SDPA mask builder, a boolean [B, 1, T, S] mask (True =
visible) that already holds the causal and the padding masks, or None where the causal mask alone suffices. With
a mask the causal mask of `mask_form="renormalize"` becomes the additive form (the mask hides the future inside
the softmax); the two forms give the same weights (the masking write-up, tested in tests/test_functional.py).
"""

from __future__ import annotations

import dataclasses

import torch

from ..attention_config import AttentionConfig
from ..errors import ConfigError
from ..functional import attention, qk_normalize
from ..mechanisms.normalizers import normalizer_fn
from ..registry import get_variant, variant_info, variants

PREFIX = "attnlab-"
# AttentionConfig fields that act inside the attention function (everything else changes the model's modules)
INSIDE = ("kernel", "normalizer", "temperature", "scale", "mask_form", "backend", "qk_norm", "qk_norm_scale",
          "softcap")
_REASONS = {  # field -> why a variant that changes it cannot be an HF attention function
    "n_kv_head": "its K/V head count is the HF model's own (config.num_key_value_heads); use attnlab-standard",
    "q_mode": "it changes how Q, K or V are made from x, which the HF model's projections do",
    "k_mode": "it changes how Q, K or V are made from x, which the HF model's projections do",
    "v_mode": "it changes how Q, K or V are made from x, which the HF model's projections do",
    "out_proj": "it removes the output projection, which belongs to the HF model",
    "rank": "its low-rank Q/K/V projections replace the HF model's projections",
    "rank_fraction": "its low-rank Q/K/V projections replace the HF model's projections",
    "kv_latent": "MLA rebuilds K and V from a latent, new projections the HF model does not have",
    "kv_latent_fraction": "MLA rebuilds K and V from a latent, new projections the HF model does not have",
    "magnitude": "the magnitude gate has learned parameters (t, beta, gamma, landmarks) that the HF model lacks",
    "qk_norm": "a learned QK-norm gain is a parameter the HF model lacks (qk_norm='fixed' is accepted)",
    "causal": "HF decoders decide causality themselves (the module's is_causal)",
    "heads": "talking heads and MoH have learned head-mixing parameters (mixes, a router) the HF model lacks",
    "differential": "differential attention's lambda vectors and per-head norm gain are parameters the HF model lacks",
}


def hf_refusal(name_or_config: str | AttentionConfig) -> str | None:
    """Why a variant (by name) or an AttentionConfig cannot be an HF attention function, or None when it can."""
    config = get_variant(name_or_config) if isinstance(name_or_config, str) else name_or_config
    default = AttentionConfig()
    for field in dataclasses.fields(AttentionConfig):
        ours, base = getattr(config, field.name), getattr(default, field.name)
        if ours == base or (field.name in INSIDE and not (field.name == "qk_norm" and ours == "learned")):
            continue
        if field.name == "projections":  # the reason of the first projection switch it changes
            name = next(f.name for f in dataclasses.fields(ours) if getattr(ours, f.name) != getattr(base, f.name))
            return _REASONS[name]
        return _REASONS.get(field.name, f"it sets {field.name}={ours!r}, which acts outside the attention function")
    return None


def hf_variants() -> list[str]:
    """The registered variants that can run inside HF models."""
    return [name for name in variants() if hf_refusal(name) is None]


def attention_function(config: AttentionConfig):
    """An HF attention function (the signature of transformers' `sdpa_attention_forward`) computing ``config``."""

    def forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
        softcap = kwargs.get("softcap")  # the model's own cap (Gemma 2's attn_logit_softcapping), else the config's
        if softcap is not None and config.softcap is not None and softcap != config.softcap:
            raise ConfigError(f"the model caps its attention logits at softcap={softcap} and the attnlab config at "
                              f"softcap={config.softcap}; set one of them, or the same value in both")
        softcap = config.softcap if softcap is None else softcap
        scale = config.scale if config.scale is not None else scaling
        if config.qk_norm == "fixed":  # g cos(q, k): the gain folded into q, scale 1 (attnlab.functional.scores)
            query, key = qk_normalize(query, key, config.qk_norm_gain(query.shape[-1]))
            scale = 1.0
        out = attention(
            query, key, value, causal=bool(causal), scale=scale, temperature=config.temperature,
            kernel=config.kernel, normalizer=normalizer_fn(config.normalizer), mask_form=config.mask_form,
            backend=config.backend, softcap=softcap,
            dropout_p=dropout, attn_mask=attention_mask,
        )
        return out.transpose(1, 2).contiguous(), None  # [B, T, H, dv]; no weights returned

    return forward


def register_attention(names: list[str] | None = None, configs: dict[str, AttentionConfig] | None = None) -> list[str]:
    """Register ``attnlab-<name>`` in transformers' AttentionInterface (and its mask builder) for each name.

    names: variants to register; default every variant that qualifies (`hf_variants`), or none when only configs
    are given. configs: further entries, name -> AttentionConfig, e.g. {"t05": AttentionConfig(temperature=0.5)}
    gives `attnlab-t05`. A variant or config that cannot run inside an HF model raises ConfigError with the reason.
    Returns the registered implementation names.
    """
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        raise ConfigError("attnlab.hf.register_attention needs transformers: pip install 'attnlab[hf]'") from None
    entries = {}
    for name in (hf_variants() if names is None and configs is None else names or []):
        variant_info(name)  # an unknown name: one line listing the registered ones
        entries[name] = get_variant(name)
    for name, config in (configs or {}).items():
        if not isinstance(config, AttentionConfig):
            raise ConfigError(f"configs[{name!r}] must be an attnlab.AttentionConfig, got {type(config).__name__}")
        entries[name] = config
    for name, config in entries.items():
        why = hf_refusal(config)
        if why is not None:
            raise ConfigError(f"{name!r} cannot be an HF attention implementation: {why}")
    for name, config in entries.items():
        AttentionInterface.register(PREFIX + name, attention_function(config))
        AttentionMaskInterface.register(PREFIX + name, sdpa_mask)
    return [PREFIX + name for name in entries]
