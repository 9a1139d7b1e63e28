"""How Q, K and V are made: the Boneless write-up's steps, low-rank projections and MLA's latent K/V. Names load
on first use (:mod:`attnlab.lazy`)."""

from ...lazy import lazy_exports

_HOMES = {"ProjectionConfig": ".config", "LEARNED_MODES": ".names", "MODES": ".names", "LatentKV": ".module",
          "make_projection": ".module"}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
