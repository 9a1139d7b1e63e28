"""Differential attention written straight from its equations (Ye et al. 2024, arXiv:2410.05258, section 2.1):

    [Q1; Q2] = X W_Q,  [K1; K2] = X W_K,  V = X W_V
    DiffAttn(X) = (softmax(Q1 K1' / sqrt(d')) - lambda softmax(Q2 K2' / sqrt(d'))) V            (eq. 1)
    lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init               (eq. 2)
    lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)),  l = 1 .. L the layer                             (eq. 3)
    head_i = DiffAttn_i(X);  head_i <- (1 - lambda_init) LN(head_i);  y = concat_i(head_i) W_O    (eq. 4, 5)

attnlab keeps n_embd = n_head head_dim: a head's query and key (head_dim wide) are its two halves [Q1 Q2], [K1 K2],
each d' = head_dim / 2 wide, and its value is head_dim wide, as the authors' code arranges a head (half as many heads
as a Transformer of the same width, each twice as wide). LN is an RMS norm over each head's head_dim outputs with one
learned gain shared by the heads (the authors' code); lambda is one scalar per layer, shared by its heads.
"""

from __future__ import annotations

import math

import torch

LAMBDA_STD = 0.1
"""lambda_q1, lambda_k1, lambda_q2, lambda_k2 start as N(0, 0.1^2) vectors of d' entries (the authors' code)."""
NORM_EPS = 1e-5
"""eps of the per-head RMS norm (the authors' code)."""


def lambda_init(layer: int) -> float:
    """lambda_init of the block with 0-based index ``layer``: 0.8 - 0.6 exp(-0.3 (l - 1)) with l = layer + 1 (eq. 3)."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def lambda_value(q1: torch.Tensor, k1: torch.Tensor, q2: torch.Tensor, k2: torch.Tensor, init: float) -> torch.Tensor:
    """lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init (eq. 2), a float64 scalar."""
    q1, k1, q2, k2 = (x.double() for x in (q1, k1, q2, k2))
    return torch.exp(q1 @ k1) - torch.exp(q2 @ k2) + init


def differential_weights(q: torch.Tensor, k: torch.Tensor, lam, *, causal: bool, scale: float | None = None,
                         prior: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(Q1 K1' s) - lambda softmax(Q2 K2' s) of q [B, H, T, d], k [B, H, S, d] (K/V heads already repeated),
    s = 1/sqrt(d/2) unless given, in float64, one row at a time over the keys the query sees (a causal row i sees
    keys 0..i + S - T); ``prior`` [B, H or 1, T, S], when given, is added to both maps' logits."""
    q, k = q.double(), k.double()
    half = q.shape[-1] // 2
    s = 1.0 / math.sqrt(half) if scale is None else scale
    t, s_len = q.shape[-2], k.shape[-2]
    out = torch.zeros(*q.shape[:-1], s_len, dtype=torch.float64, device=q.device)
    for i in range(t):
        seen = i + s_len - t + 1 if causal else s_len
        maps = []
        for part in (slice(0, half), slice(half, None)):  # (Q1, K1), then (Q2, K2)
            z = torch.einsum("bhd,bhsd->bhs", q[:, :, i, part], k[:, :, :seen, part]) * s
            if prior is not None:
                z = z + prior[:, :, i, :seen].double()
            maps.append(torch.softmax(z, dim=-1))
        out[:, :, i, :seen] = maps[0] - lam * maps[1]  # eq. 1
    return out


def head_rms_norm(o: torch.Tensor, gain: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    """o / sqrt(mean(o^2) + eps) * gain over each head's last axis, in float64."""
    o = o.double()
    return o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + eps) * gain.double()


def differential_attention(q, k, v, lam, init: float, gain, *, causal: bool, scale: float | None = None,
                           prior=None, eps: float = NORM_EPS) -> torch.Tensor:
    """(1 - lambda_init) RMSNorm(DiffAttn) per head, [B, H, T, head_dim] in float64 (eq. 1 and 5, before W_O)."""
    weights = differential_weights(q, k, lam, causal=causal, scale=scale, prior=prior)
    return (1.0 - init) * head_rms_norm(weights @ v.double(), gain, eps)
