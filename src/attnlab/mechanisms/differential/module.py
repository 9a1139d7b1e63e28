"""The parameters of one differential attention layer (Ye et al. 2024, arXiv:2410.05258): the four lambda vectors and
the gain of the per-head RMS norm; the layer (attnlab.nn.attention) runs the two softmax maps."""

from __future__ import annotations

import torch
import torch.nn as nn

from .reference import LAMBDA_STD, NORM_EPS, lambda_init


def halves(x: torch.Tensor) -> torch.Tensor:
    """[B, H, T, d] -> [B, H, 2, T, d/2]: a head's [X1 X2] as two half-heads (a view)."""
    return x.unflatten(-1, (2, -1)).transpose(-3, -2)


def whole(x: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`halves`: [B, H, 2, T, d/2] -> [B, H, T, d]."""
    return x.transpose(-3, -2).flatten(-2)


class DifferentialHeads(nn.Module):
    """lambda_q1, lambda_k1, lambda_q2, lambda_k2 [head_dim / 2] drawn from N(0, 0.1^2) and the RMS norm's gain
    [head_dim] (ones) shared by the heads of the block with 0-based index ``layer``; lambda_init from that index."""

    def __init__(self, head_dim: int, layer: int):
        super().__init__()
        half = head_dim // 2
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.randn(half) * LAMBDA_STD))
        self.gain = nn.Parameter(torch.ones(head_dim))
        self.init = lambda_init(layer)  # eq. 3, l = layer + 1

    def lam(self) -> torch.Tensor:
        """lambda = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init (eq. 2), one scalar."""
        return torch.exp(self.lambda_q1 @ self.lambda_k1) - torch.exp(self.lambda_q2 @ self.lambda_k2) + self.init

    def forward(self, o1: torch.Tensor, o2: torch.Tensor) -> torch.Tensor:
        """The heads' outputs [B, H, T, head_dim] from the two maps' outputs o1 = A1 V, o2 = A2 V:
        (1 - lambda_init) RMSNorm(o1 - lambda o2) (eq. 1, 5; (A1 - lambda A2) V = A1 V - lambda A2 V). The norm runs
        in float32 at least, as the authors' RMSNorm does."""
        o = o1 - self.lam().to(o1.dtype) * o2
        work = o.float() if o.dtype in (torch.float16, torch.bfloat16) else o
        normed = (work * torch.rsqrt(work.pow(2).mean(-1, keepdim=True) + NORM_EPS)).to(o.dtype)
        return (1.0 - self.init) * normed * self.gain.to(o.dtype)
