"""What a trained model attends to: every layer's attention weights per head and, for magnitude variants, the
magnitude weights and gates of the keys (the magnitude write-up), for one token sequence."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LayerPicture:
    """One layer for one sequence: weights [n_head, T, T] (p_ij, before any gate on the values), and for magnitude
    layers the magnitude weights w and what the model applies, gates g (or the log prior, magnitude_apply =
    "logits"): per key [n_kv_head, T] (global and causal forms) or per (i, j) [n_kv_head, T, T] (prefix form)."""

    weights: torch.Tensor
    magnitude: torch.Tensor | None = None
    gates: torch.Tensor | None = None
    applied_as: str | None = None  # "gate" or "log prior"


@torch.no_grad()
def attention_pictures(model, idx: torch.Tensor) -> list[LayerPicture]:
    """The LayerPicture of every layer of ``model`` (an attnlab.GPT) for the tokens idx [1, T], in eval mode.

    Runs the blocks as GPT.forward does (x <- x + Attn(LN(x)); x <- x + MLP(LN(x))), asking each attention layer
    for its weights; the magnitude weights come from the layer's own gate on its pre-RoPE keys, as in forward."""
    if idx.dim() != 2 or idx.shape[0] != 1:
        raise ValueError(f"idx must be one sequence of shape [1, T], got {tuple(idx.shape)}")
    was_training = model.training
    model.eval()
    try:
        model._check_idx(idx)
        x, pictures = model.embed(idx), []
        for block in model.blocks:
            h = block.ln_1(x)
            y, weights = block.attn(h, model.rope, return_weights=True)
            picture = LayerPicture(weights[0])
            gate = block.attn.magnitude
            if gate is not None:
                k = block.attn.project(h)[1]
                picture.magnitude = gate.weights(k, with_residual=False)[0][0]
                picture.gates = gate(k)[0]
                picture.applied_as = "log prior" if gate.apply_to == "logits" else "gate"
            pictures.append(picture)
            x = x + y
            x = x + block.mlp(block.ln_2(x))
    finally:
        model.train(was_training)
    return pictures
