"""How Q, K and V are made: the Boneless write-up's steps, low-rank projections and MLA's latent K/V."""

from .config import ProjectionConfig
from .module import LEARNED_MODES, MODES, LatentKV, make_projection

__all__ = ["ProjectionConfig", "LEARNED_MODES", "MODES", "LatentKV", "make_projection"]
