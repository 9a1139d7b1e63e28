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

    Runs the blocks' own forward (GPT.run with the weights asked for, CODA's logits handed on); the magnitude
    weights come from the layer's own gate on its pre-RoPE keys, as in forward."""
    if idx.dim() != 2 or idx.shape[0] != 1:
        raise ValueError(f"idx must be one sequence of shape [1, T], got {tuple(idx.shape)}")
    was_training = model.training
    model.eval()
    try:
        model._check_idx(idx)
        x, prior, previous, pictures = model.embed(idx), model._count_prior(idx), None, []
        for block in model.blocks:
            h = block.ln_1(x)
            out = block(x, model.rope, count_prior=prior, previous_logits=previous, return_weights=True)
            picture = LayerPicture(out.weights[0])
            gate = block.attn.magnitude
            if gate is not None:
                k = block.attn.project(h)[1]
                picture.magnitude = gate.weights(k, with_residual=False)[0][0]
                picture.gates = gate(k)[0]
                picture.applied_as = "log prior" if gate.apply_to == "logits" else "gate"
            pictures.append(picture)
            x, previous = out.y, out.logits
    finally:
        model.train(was_training)
    return pictures
