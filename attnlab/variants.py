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
    notes: str = ""


_REGISTRY: dict[str, Variant] = {}


def register(name: str, description: str, source: str, *, notes: str = "", **fields) -> Variant:
    """Register ``name`` as AttentionConfig(**fields). Names are unique; notes: caveats, design choices."""
    if name in _REGISTRY:
        raise ValueError(f"variant {name!r} is already registered")
    variant = Variant(name, AttentionConfig(**fields), description, source, notes)
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
register(
    "magnitude-causal", "magnitude-gated values, per key: g_j = gate(weight of key j inside its own prefix 1..j)",
    "seed 000 (magnitude attention), causal form", magnitude="causal",
    notes="exact w_j = y_j / L_jj from Z + eps I = L L', y = L^-1 1 (shared/notes/magnitude-numerics.md); keeps the "
          "SDPA fast path. Not the seed's global mu, which leaks the future in a causal model: that one is "
          "AttentionConfig(magnitude='global', causal=False), or allow_future_leak=True to reproduce the seed. "
          "A cluster of m clones gets gates of 1, 1/2, ..., 1/m (sum ~ ln m, not 1 unit): each key is judged "
          "by the keys before it only.",
)
register(
    "magnitude-prefix", "magnitude-gated values, per (i, j): g_ij = gate(weight of key j inside query i's prefix 1..i)",
    "seed 000 (magnitude attention), exact prefix form", magnitude="prefix",
    notes="exact M_ij = sum_{m=j..i} (L^-1)_mj y_m: row i is mu of the keys query i may see, so a cluster of m "
          "clones sums to m/(m+eps) ~ 1 unit as in the seed; needs the explicit path (no SDPA), O(T^3) per head.",
)
