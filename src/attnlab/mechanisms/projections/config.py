"""The switches of how Q, K and V are made: :class:`ProjectionConfig`, ``AttentionConfig.projections``.

Its own rules are checked here, once; the rules that need the layer's head counts or width (grouped K/V heads,
a rank below full rank) are checked by AttentionConfig. ``FLAT_NAMES``: the flat keys of older configs
(``q_mode = "identity"``, ``rank_fraction = 0.25``), folded into ``projections`` when a config is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...configio import fold_keys
from ...errors import ConfigError, check_choice, check_number, strict_fields
from .names import LEARNED_MODES, MODES


@strict_fields
@dataclass(frozen=True)
class ProjectionConfig:
    """Q, K, V and W_o of one layer (the Boneless write-up's steps, low rank, MLA's latent K/V)."""

    q_mode: str = "projected"
    """How Q is made (the Boneless write-up's steps): `"projected"`: x W (GPT-2); `"identity"`: x itself, no parameters (head h reads the slice x_h); `"identity_init"`: x W with W = I at init, then trained; `"residual"`: x W + x."""
    k_mode: str = "projected"
    """How K is made, as `q_mode`; modes other than `"projected"` need n_kv_head = n_head."""
    v_mode: str = "projected"
    """How V is made, as `q_mode`; modes other than `"projected"` need n_kv_head = n_head."""
    out_proj: bool = True
    """The output projection W_o; `False`: the concatenated heads go straight to the residual (the Boneless write-up's steps 1-2 have no weights at all)."""
    rank: int | None = None
    """Every learned Q/K/V W as B A of inner rank r >= 1 (low rank; the Boneless write-up); B A starts with the dense std 0.02."""
    rank_fraction: float | None = None
    """The inner rank as a fraction f in (0, 1): r = round(f min(in, out)) per projection; or set `rank`."""
    kv_latent: int | None = None
    """MLA (DeepSeek-V2): K = c W_uk, V = c W_uv from one cached latent c = RMSNorm(x W_dkv) of width d_c >= 1, so the cache holds d_c floats per token instead of 2 n_kv_head head_dim."""
    kv_latent_fraction: float | None = None
    """The latent width as a fraction f in (0, 1] of n_embd: d_c = round(f n_embd); or set `kv_latent`."""

    def __post_init__(self):
        where = "attention.projections."
        for name in ("q_mode", "k_mode", "v_mode"):
            check_choice(where + name, getattr(self, name), MODES)
        if not isinstance(self.out_proj, bool):
            raise ConfigError(f"{where}out_proj={self.out_proj!r} must be true or false")
        for name in ("rank", "kv_latent"):
            if getattr(self, name) is not None:
                check_number(where + name, getattr(self, name), low=1, integer=True)
        for name, high in (("rank_fraction", None), ("kv_latent_fraction", 1.0)):
            if getattr(self, name) is not None:
                check_number(where + name, getattr(self, name), low=0.0, low_open=True, high=high)
        if self.rank_fraction is not None and self.rank_fraction >= 1:
            raise ConfigError(f"{where}rank_fraction={self.rank_fraction!r} must be < 1 (1 is full rank)")
        for a, b in (("rank", "rank_fraction"), ("kv_latent", "kv_latent_fraction")):
            if getattr(self, a) is not None and getattr(self, b) is not None:
                raise ConfigError(f"{where}{a}={getattr(self, a)!r} and {b}={getattr(self, b)!r}: set one of them")
        if self.latent and (self.k_mode, self.v_mode) != ("projected", "projected"):
            raise ConfigError(f"{where}kv_latent rebuilds K and V from the latent; k_mode={self.k_mode!r} and "
                              f"v_mode={self.v_mode!r} must both be 'projected'")
        if self.rank is not None or self.rank_fraction is not None:
            modes = (self.q_mode,) if self.latent else (self.q_mode, self.k_mode, self.v_mode)
            if "identity_init" in modes:
                raise ConfigError(f"{where}rank: a low-rank W cannot start at the full-rank identity; "
                                  "drop rank or use mode 'projected' or 'residual' instead of 'identity_init'")
            if not set(LEARNED_MODES) & set(modes):
                raise ConfigError(f"{where}rank: no learned Q/K/V projection to factor (modes {', '.join(modes)})")

    @property
    def latent(self) -> bool:
        """Whether K and V come from MLA's latent."""
        return self.kv_latent is not None or self.kv_latent_fraction is not None

    def replace(self, **changes) -> "ProjectionConfig":
        return dataclasses.replace(self, **changes)


FLAT_NAMES = {f.name: f.name for f in dataclasses.fields(ProjectionConfig)}
"""The flat AttentionConfig keys of older configs -> ProjectionConfig fields (the same names)."""


def fold_flat(data: dict) -> dict:
    """``data`` (an AttentionConfig table) with the flat projection keys folded into one ``projections`` table."""
    return fold_keys(data, "projections", FLAT_NAMES)


__all__ = ["FLAT_NAMES", "ProjectionConfig", "fold_flat"]
