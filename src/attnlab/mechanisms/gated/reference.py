"""Gated attention written straight from its definition (Qiu et al. 2025, arXiv:2505.06708, section 2, the gate
at position G1 in its elementwise, head-specific, multiplicative sigmoid form, the paper's best):

    Y' = Y * sigmoid(X W_theta (+ b)),

Y the output of scaled dot-product attention (every head's o_h side by side, [T, n_head * head_dim], before W_o),
X the layer's input (the hidden states after the pre-norm) and W_theta: n_embd -> n_head * head_dim, so head h's
o_h is gated by its own slice of the gate, one gate value per coordinate. The gate of token i reads token i only.
"""

from __future__ import annotations

import torch


def gated_output(o: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None):
    """o [B, H, T, d] (attention output per head), x [B, T, n_embd], weight [H * d, n_embd], bias [H * d] or None
    -> o' [B, H, T, d] in float64: o'_h = o_h * sigmoid(x W' + b)_h."""
    b, h, t, d = o.shape
    logits = x.double() @ weight.double().T  # x W_theta      [B, T, H d]
    if bias is not None:
        logits = logits + bias.double()
    gate = 1.0 / (1.0 + torch.exp(-logits))  # sigmoid
    return o.double() * gate.view(b, t, h, d).transpose(1, 2)  # head h: coordinates h d .. (h + 1) d - 1
