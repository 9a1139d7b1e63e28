"""attnlab: a laboratory for attention mechanisms."""

from .config import AttentionConfig, GPTConfig, HeadMixConfig, MagnitudeConfig, ProjectionConfig
from .errors import ConfigError
from .functional import attention
from .mechanisms.magnitude.reference import magnitude, magnitude_weights, prefix_magnitude
from .model import GPT
from .nn import Attention
from .variants import get_variant, register, variant_info, variants

__version__ = "0.1.0"

__all__ = [
    "AttentionConfig", "GPTConfig", "HeadMixConfig", "MagnitudeConfig", "ProjectionConfig", "ConfigError", "attention", "GPT", "Attention",
    "get_variant", "register", "variant_info", "variants",
    "magnitude", "magnitude_weights", "prefix_magnitude",
]
