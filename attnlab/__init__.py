"""attnlab: a laboratory for attention mechanisms."""

from .config import AttentionConfig, GPTConfig
from .errors import ConfigError

__version__ = "0.1.0"
