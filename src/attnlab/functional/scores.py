"""Attention logits: how similar is query i to key j.

Shapes: q [B, H, T, d], k [B, H, S, d] -> logits [B, H, T, S].
Every kernel returns *logits* z_ij; the attention weights are softmax(z) along j (or, with the "none"
normaliser, the kernel's raw similarity: z itself for "dot", exp(z) for "rbf"; see attnlab.functional.attention).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def default_scale(head_dim: int) -> float:
    """1/sqrt(d): keeps Var(q.k) = 1 when q and k have i.i.d. unit-variance entries (Vaswani et al. 2017 s.3.2; the softmax write-up)."""
    return 1.0 / math.sqrt(head_dim)


def dot_logits(q: torch.Tensor, k: torch.Tensor, scale: float, temperature: float = 1.0) -> torch.Tensor:
    """z_ij = <q_i, k_j> * scale / T;  with scale = 1/sqrt(d) this is the softmax write-up's z_j = <q, k_j> / sqrt(d), over T."""
    return (q @ k.transpose(-2, -1)) * (scale / temperature)


def qk_normalize(q: torch.Tensor, k: torch.Tensor, gain, eps: float = 1e-12) -> tuple[torch.Tensor, torch.Tensor]:
    """QK-norm: (g q/|q|, k/|k|) per head vector, so <q', k'> = g cos(q, k) and the logits lie in [-g, g].

    Query-Key Normalization (Henry et al. 2020, arXiv:2010.04245): L2-normalise q and k and replace 1/sqrt(d) by a
    scale g (learned there; a float or a tensor here). Dehghani et al. 2023 (arXiv:2302.05442) normalise q, k with
    LayerNorm for stability. g is folded into q so that a dot kernel with scale 1 (and the SDPA path) applies.
    """
    return F.normalize(q, dim=-1, eps=eps) * gain, F.normalize(k, dim=-1, eps=eps)


def squared_distances(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """||q_i - k_j||^2 = ||q_i||^2 + ||k_j||^2 - 2 <q_i, k_j>, clamped at 0 against rounding."""
    qq = (q * q).sum(-1, keepdim=True)  # [B, H, T, 1]
    kk = (k * k).sum(-1).unsqueeze(-2)  # [B, H, 1, S]
    return (qq + kk - 2.0 * (q @ k.transpose(-2, -1))).clamp_min(0.0)


def rbf_logits(q: torch.Tensor, k: torch.Tensor, scale: float, temperature: float = 1.0) -> torch.Tensor:
    """z_ij = -||q_i - k_j||^2 * scale / (2T).

    exp(z_ij) is the Gaussian (RBF) kernel exp(-||q_i - k_j||^2 / (2 sigma^2)) with sigma^2 = T / scale,
    i.e. sigma^2 = T sqrt(d) at the default scale (the softmax write-up, "kernel view"). Since
    -||q - k||^2 / 2 = <q, k> - ||q||^2/2 - ||k||^2/2, it differs from the dot kernel only by a per-row constant
    (which softmax cancels) and the per-key bias -||k_j||^2 scale / (2T).
    """
    return squared_distances(q, k) * (-scale / (2.0 * temperature))


def rbf_augment(q: torch.Tensor, k: torch.Tensor, multiple: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewrite the RBF kernel as a dot product so fused SDPA kernels can compute it.

    q' = [q, 1, 0...], k' = [k, -||k||^2 / 2, 0...] gives <q', k'> = <q, k> - ||k||^2 / 2, which equals
    -||q - k||^2 / 2 up to the per-row constant -||q||^2 / 2 that softmax removes. Zero-padded to a multiple
    of ``multiple`` so the head size stays friendly to fused kernels.

    In float16 / bfloat16 the extra coordinate c = -||k||^2 / 2 is large next to the logit differences that matter
    (|c| ~ d / 2 for unit-variance keys) and would be rounded to 11 / 8 bits. It is therefore carried as two
    half-precision coordinates, c = hi + lo with hi = round(c) and lo = round(c - hi), each met by a 1 in q': the
    kernels accumulate in float32, so c keeps about twice the bits (tests/test_functional.py measures the error).
    """
    d = q.shape[-1]
    split = q.dtype in (torch.float16, torch.bfloat16)
    width = -(-(d + 1 + split) // multiple) * multiple
    q_aug = q.new_zeros(*q.shape[:-1], width)
    k_aug = k.new_zeros(*k.shape[:-1], width)
    q_aug[..., :d] = q
    q_aug[..., d:d + 1 + split] = 1.0
    k_aug[..., :d] = k
    wide = k.float() if split else k
    c = -0.5 * (wide * wide).sum(-1)  # at least float32
    k_aug[..., d] = c.to(k.dtype)
    if split:
        k_aug[..., d + 1] = (c - k_aug[..., d].float()).to(k.dtype)  # what rounding c to half precision lost
    return q_aug, k_aug
