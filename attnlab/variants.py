"""The variant registry: a name -> a preset of AttentionConfig switches, with a description and a source.

Adding a variant is one `register(...)` call here, its code (new AttentionConfig fields if needed), and its
test; the causal leak test picks up every registered name automatically.
"""

from __future__ import annotations

from dataclasses import dataclass

from .config import AttentionConfig
from .errors import unknown_name


@dataclass(frozen=True)
class Variant:
    name: str
    config: AttentionConfig
    description: str
    source: str


_REGISTRY: dict[str, Variant] = {}


def register(name: str, description: str, source: str, **fields) -> Variant:
    """Register ``name`` as AttentionConfig(**fields). Names are unique."""
    if name in _REGISTRY:
        raise ValueError(f"variant {name!r} is already registered")
    variant = Variant(name, AttentionConfig(**fields), description, source)
    _REGISTRY[name] = variant
    return variant


def variants() -> list[str]:
    """The registered variant names, in registration order."""
    return list(_REGISTRY)


def variant_info(name: str) -> Variant:
    """The registry entry for ``name``; an unknown name raises ConfigError listing the valid ones."""
    if name not in _REGISTRY:
        raise unknown_name("attention variant", name, _REGISTRY)
    return _REGISTRY[name]


def get_variant(name: str) -> AttentionConfig:
    """The AttentionConfig preset of ``name``."""
    return variant_info(name).config


register(
    "standard", "causal multi-head softmax attention, softmax(QK'/sqrt(d)) V (GPT-2)",
    "Vaswani et al. 2017, arXiv:1706.03762; seed 003",
)
register(
    "gqa", "grouped-query attention: 2 K/V heads shared by groups of query heads",
    "Ainslie et al. 2023, arXiv:2305.13245; seed 003", n_kv_head=2,
)
register(
    "mqa", "multi-query attention: one K/V head shared by all query heads",
    "Shazeer 2019, arXiv:1911.02150; seed 003", n_kv_head=1,
)
register(
    "rbf", "Gaussian-kernel weights exp(-||q-k||^2 / 2 sigma^2), row-normalised, sigma^2 = T sqrt(d)",
    "seed 003 (kernel view of softmax attention)", kernel="rbf",
)
register(
    "mask-renormalize", "causal mask as Mask(B): softmax over all keys, then zero the future and renormalise",
    "seed 002 (masking, form 2)", mask_form="renormalize",
)
