"""The switches of head recombination: :class:`HeadMixConfig`, ``AttentionConfig.heads``.

Its own rules are checked here, once (MoH's sizes once the layer's n_head is known, by :meth:`moh_sizes`).
``FLAT_NAMES`` maps the flat keys of older configs (``head_mix = "moh"``, ``moh_top_k = 2``) to this table's
fields; attnlab.configio folds them into ``heads`` when a dict, a TOML file or an override is read.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ...configio import fold_keys
from ...errors import ConfigError, check_choice, check_number, strict_fields
from .names import HEAD_MIXES


@strict_fields
@dataclass(frozen=True)
class HeadMixConfig:
    """How the heads of a layer combine (the masking write-up: "a linear recombination that ignores the block
    structure"; docs/heads.md)."""

    mix: str = "concat"
    """`"concat"`: concatenated, then W_O; `"talking"`: talking heads, learned [H, H] mixes of the logits before the softmax and of the weights after it, both identity at init (Shazeer et al. 2020; explicit path); `"moh"`: mixture of heads, per-token router weights over the heads, `moh_shared` always on and the top `moh_top_k` of the rest, before W_O (Jin et al. 2024); `"coda"`: cascaded head-colliding attention, each layer's logits a Gaussian latent whose mean mixes all heads' logits (an MLP across heads) and the previous layer's sampled logits (Zheng et al. 2021, as the authors' released code computes it; explicit path)."""
    coda_noise: float = 1.0
    """CODA: sigma of the Gaussian noise on the logits in training (the released code's 1); 0 trains the mean path. Evaluation always uses the mean."""
    moh_shared: int | None = None
    """MoH: heads always active, 0 <= h_s < n_head; `None`: n_head // 2."""
    moh_top_k: int | None = None
    """MoH: routed heads active per token, 1 <= k <= n_head - h_s; `None`: half the routed heads, at least 1 (with the default h_s, 3/4 of the heads are active)."""
    moh_balance: float = 0.01
    """MoH: beta, the weight of the load-balance loss sum_i f_i P_i in the training loss (the paper's 0.01); 0 switches it off."""

    def __post_init__(self):
        check_choice("attention.heads.mix", self.mix, HEAD_MIXES)
        check_number("attention.heads.moh_balance", self.moh_balance, low=0.0)
        check_number("attention.heads.coda_noise", self.coda_noise, low=0.0)
        for name in ("moh_shared", "moh_top_k"):
            if getattr(self, name) is not None:
                check_number(f"attention.heads.{name}", getattr(self, name), low=0, integer=True)
                if self.mix != "moh":
                    raise ConfigError(f"attention.heads.{name}={getattr(self, name)!r} needs mix='moh', "
                                      f"got mix={self.mix!r}")

    def moh_sizes(self, n_head: int | None) -> tuple[int, int]:
        """MoH's (h_s shared heads, k routed heads per token), resolved against n_head; ConfigError if impossible."""
        if n_head is None:
            raise ConfigError("attention.heads.mix='moh' needs n_head (GPTConfig fills it in)")
        if n_head == 1:
            raise ConfigError("attention.heads.mix='moh' routes between heads, but n_head=1; use n_head >= 2")
        shared = n_head // 2 if self.moh_shared is None else self.moh_shared
        if shared >= n_head:
            raise ConfigError(f"attention.heads.moh_shared={shared} leaves no routed head of n_head={n_head}; "
                              f"allowed: 0 <= moh_shared <= {n_head - 1}")
        routed = n_head - shared
        top_k = max(1, routed // 2) if self.moh_top_k is None else self.moh_top_k
        if not 1 <= top_k <= routed:
            raise ConfigError(f"attention.heads.moh_top_k={top_k} must be between 1 and the {routed} routed heads "
                              f"(n_head={n_head} - moh_shared={shared})")
        return shared, top_k

    def replace(self, **changes) -> "HeadMixConfig":
        return dataclasses.replace(self, **changes)


FLAT_NAMES = {"head_mix": "mix", "coda_noise": "coda_noise", "moh_shared": "moh_shared", "moh_top_k": "moh_top_k",
              "moh_balance": "moh_balance"}
"""The flat AttentionConfig keys of older configs -> HeadMixConfig fields."""


def fold_flat(data: dict) -> dict:
    """``data`` (an AttentionConfig table) with the flat head keys folded into one ``heads`` table:
    ``{"head_mix": "moh", "moh_top_k": 2}`` -> ``{"heads": {"mix": "moh", "moh_top_k": 2}}``; a mix name
    ``heads = "moh"`` -> ``{"heads": {"mix": "moh"}}``."""
    return fold_keys(data, "heads", FLAT_NAMES, "mix")


__all__ = ["FLAT_NAMES", "HeadMixConfig", "fold_flat"]
