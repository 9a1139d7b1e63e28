"""Modules that hold parameters and call attnlab.functional."""

from .attention import Attention
from .positional import LearnedPositions, RotaryEmbedding, SinusoidalPositions

__all__ = ["Attention", "LearnedPositions", "RotaryEmbedding", "SinusoidalPositions"]
