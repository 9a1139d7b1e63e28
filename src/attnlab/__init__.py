"""attnlab: a laboratory for attention mechanisms.

The public names below are imported on first use (PEP 562), so that ``import attnlab`` and the command line's
``--help`` do not pay for torch before they need it.
"""

from .lazy import lazy_exports

__version__ = "0.1.0"

_HOMES = {  # public name -> the module that defines it
    "AttentionConfig": ".config", "GPTConfig": ".config", "HeadMixConfig": ".config", "MagnitudeConfig": ".config",
    "ProjectionConfig": ".config", "ConfigError": ".errors", "attention": ".functional", "GPT": ".model",
    "Attention": ".nn", "get_variant": ".registry", "register": ".registry", "variant_info": ".registry",
    "variants": ".registry", "magnitude": ".mechanisms.magnitude.reference",
    "magnitude_weights": ".mechanisms.magnitude.reference", "prefix_magnitude": ".mechanisms.magnitude.reference",
}

__all__ = list(_HOMES)


__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
