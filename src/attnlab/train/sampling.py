"""Text sampled from a model with its own seeded generator (the samples.txt of a run, :func:`attnlab.train.sample`)."""

from __future__ import annotations

import torch

from ..errors import ConfigError
from ..model import GPT

__all__ = ["generate_text", "SAMPLE_TEMPERATURE", "SAMPLE_TOP_K"]

SAMPLE_TEMPERATURE = 0.8  # samples.txt at the end of a run
SAMPLE_TOP_K = 200


@torch.no_grad()
def generate_text(model: GPT, tokenizer, prompt: str, max_new_tokens: int, temperature: float = 0.8,
                  top_k: int | None = 200, seed: int = 0) -> str:
    """Decode ``max_new_tokens`` tokens sampled from ``model`` after ``prompt`` (own seeded generator)."""
    if not isinstance(prompt, str) or not prompt:
        raise ConfigError("the prompt must be a non-empty string (e.g. '\\n')")
    try:
        ids = tokenizer.encode(prompt)
    except ValueError as e:
        raise ConfigError(f"cannot encode the prompt: {e}") from None
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(seed)
    was_training = model.training
    model.eval()
    try:
        idx = torch.tensor([ids], dtype=torch.long, device=device)
        out = model.generate(idx, max_new_tokens, temperature=temperature, top_k=top_k, generator=generator)
    finally:
        model.train(was_training)
    return tokenizer.decode(out[0, len(ids):].tolist())
