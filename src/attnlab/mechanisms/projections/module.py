"""The Q/K/V projections of the Boneless write-up's six steps, low-rank projections, and MLA's latent K/V (DeepSeek-V2).

    "projected":      x W' + b                     nn.Linear (GPT-2; the names q_proj/k_proj/v_proj stay for HF loading)
    "identity":       x                            no parameters; split into heads, head h reads the slice x_h
    "identity_init":  x W' + b,  W = I, b = 0 at init, then trained        (Boneless write-up, step 5)
    "residual":       x W' + b + x,  W initialised as usual                (Boneless write-up, step 6)
    low rank r:       W = B A,  A [r, in], B [out, r]: rank(W) <= r        (Boneless write-up, "low rank attention weights")
    latent K/V:       c = RMSNorm(x W_dkv) [d_c],  K = c W_uk',  V = c W_uv'   (DeepSeek-V2 eqs. 9-11)

IdentityInitLinear and LowRankLinear hold raw parameters, not nn.Linear children, so that GPT's N(0, 0.02)
re-initialisation of every nn.Linear does not overwrite the identity or shrink the product B A to 0.02^2 scale.
(attnlab.train.optim decays them like a Linear's weight: every 2-D parameter but the embeddings decays.)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ...errors import ConfigError
from .names import LEARNED_MODES, MODES  # noqa: F401  (their home: .names)

GPT2_INIT_STD = 0.02  # GPT-2's N(0, 0.02) weight init (attnlab.model.GPT._init_weights)


class IdentityInitLinear(nn.Module):
    """y = x W' + b with W = I and b = 0 at initialisation; both train (Boneless write-up, step 5)."""

    def __init__(self, features: int, bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.eye(features))
        self.bias = nn.Parameter(torch.zeros(features)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


class LowRankLinear(nn.Module):
    """y = x (B A)' + b with A [rank, in], B [out, rank]: a weight of rank <= r with r (in + out) parameters.

    Init: A has orthonormal rows and B ~ N(0, std sqrt(in / r)), so W = B A has entrywise variance
    r (1/in) std^2 (in/r) = std^2, the same as the dense GPT-2 init it replaces (std = 0.02).
    """

    def __init__(self, in_features: int, out_features: int, rank: int, bias: bool = True, std: float = GPT2_INIT_STD):
        super().__init__()
        self.rank = rank
        self.down = nn.Parameter(nn.init.orthogonal_(torch.empty(rank, in_features)))  # A
        self.up = nn.Parameter(torch.randn(out_features, rank) * (std * math.sqrt(in_features / rank)))  # B
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None

    @property
    def weight(self) -> torch.Tensor:
        """W = B A  [out, in]."""
        return self.up @ self.down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(F.linear(x, self.down), self.up, self.bias)  # (x A') B' + b = x (B A)' + b


class Residual(nn.Module):
    """y = proj(x) + x: W x + x, a projection that starts near the identity map (Boneless write-up, step 6)."""

    def __init__(self, proj: nn.Module):
        super().__init__()
        self.proj = proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x) + x


def make_projection(mode: str, n_embd: int, out_features: int, bias: bool = True, rank: int | None = None) -> nn.Module:
    """The module of one Q/K/V projection n_embd -> out_features in ``mode`` (see the module docstring).

    "identity", "identity_init" and "residual" need out_features == n_embd (true for Q, and for K/V without GQA);
    ``rank`` (only for the learned W of "projected" and "residual") makes W = B A of rank <= r.
    """
    if mode not in MODES:
        raise ConfigError(f"projection mode={mode!r} is not allowed; choose one of: {', '.join(map(repr, MODES))}")
    if mode != "projected" and out_features != n_embd:
        raise ConfigError(f"projection mode={mode!r} needs out_features={out_features} == n_embd={n_embd} "
                          f"(K/V under GQA are narrower than x); use mode='projected'")
    if rank is not None and mode not in LEARNED_MODES:
        raise ConfigError(f"rank={rank} needs a learned projection, not mode={mode!r}")
    if mode == "identity":
        return nn.Identity()
    if mode == "identity_init":
        return IdentityInitLinear(n_embd, bias)
    if rank is None:
        proj = nn.Linear(n_embd, out_features, bias=bias)
    else:
        proj = LowRankLinear(n_embd, out_features, rank, bias)
    return Residual(proj) if mode == "residual" else proj


def resolve_rank(rank: int | None, fraction: float | None, in_features: int, out_features: int) -> int | None:
    """Inner rank r of one projection: ``rank`` itself, or round(fraction * min(in, out)) kept in [1, min - 1]."""
    if rank is not None:
        return rank
    if fraction is None:
        return None
    full = min(in_features, out_features)
    return max(1, min(full - 1, round(fraction * full)))


def resolve_latent(kv_latent: int | None, fraction: float | None, n_embd: int) -> int | None:
    """Latent width d_c: ``kv_latent`` itself, or max(1, round(fraction * n_embd))."""
    if kv_latent is not None:
        return kv_latent
    return None if fraction is None else max(1, round(fraction * n_embd))


class LatentKV(nn.Module):
    """Multi-head latent attention's K/V (DeepSeek-V2, arXiv:2405.04434, s.2.1.2, eqs. 9-11):

        c = RMSNorm(x W_dkv')        [B, T, d_c]   the only per-token K/V state an inference cache must keep
        K = c W_uk',  V = c W_uv'    [B, T, n_kv_head * head_dim] each, rebuilt from the one latent
    The RMSNorm after the compressed latent is DeepSeek-V2's (s.3.1.2); it also keeps K and V at the scale of a
    dense projection when W_dkv and W_uk are both initialised N(0, 0.02). Not included: the decoupled RoPE key
    (with pos_encoding="rope", RoPE rotates the rebuilt K; exact, but it rules out absorbing W_uk into W_q at
    inference, which is why DeepSeek-V2 decouples it) and the query compression c_Q (eqs. 12-13).
    """

    def __init__(self, n_embd: int, latent: int, out_features: int, bias: bool = True):
        super().__init__()
        self.down = nn.Linear(n_embd, latent, bias=bias)  # W_dkv
        self.norm = nn.RMSNorm(latent, eps=1e-6)
        self.up_k = nn.Linear(latent, out_features, bias=bias)  # W_uk
        self.up_v = nn.Linear(latent, out_features, bias=bias)  # W_uv

    def latent(self, x: torch.Tensor) -> torch.Tensor:
        """c = RMSNorm(x W_dkv'): the cached latent."""
        return self.norm(self.down(x))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.latent(x)
        return self.up_k(c), self.up_v(c)  # K = c W_uk',  V = c W_uv'


def kv_cache_per_token(config, n_embd: int) -> dict[str, int]:
    """Floats one token keeps in a K/V inference cache, per layer, for a resolved AttentionConfig.

    "cached": d_c with a latent (MLA); n_embd when K = V = x ("identity" K and V: cache x once);
    else 2 n_kv_head head_dim. "kv": 2 n_kv_head head_dim, the same layer's K and V; "mha": 2 n_embd.
    """
    head_dim = n_embd // config.n_head
    kv = 2 * config.n_kv_head * head_dim
    p = config.projections
    latent = resolve_latent(p.kv_latent, p.kv_latent_fraction, n_embd)
    if latent is not None:
        cached = latent
    elif p.k_mode == p.v_mode == "identity":
        cached = n_embd
    else:
        cached = kv
    return {"cached": cached, "kv": kv, "mha": 2 * config.n_head * head_dim}


__all__ = ["MODES", "IdentityInitLinear", "LowRankLinear", "Residual", "LatentKV", "make_projection",
           "resolve_rank", "resolve_latent", "kv_cache_per_token"]
