"""Modules that hold parameters and call attnlab.functional."""

from .attention import Attention, LayerOutput
from .kv_cache import KVCache, LayerKV
from .positional import LearnedPositions, RotaryEmbedding, SinusoidalPositions

__all__ = ["Attention", "LayerOutput", "KVCache", "LayerKV", "LearnedPositions", "RotaryEmbedding", "SinusoidalPositions"]
