"""How the heads of a layer combine: talking heads, mixture of heads (MoH) and CODA's cascade (docs/heads.md).
Names load on first use (:mod:`attnlab.lazy`)."""

from ...lazy import lazy_exports

_HOMES = {"HeadMixConfig": ".config", "HEAD_MIXES": ".names", "LOGIT_MIXES": ".names",
          **dict.fromkeys(("cascade_logits", "moh_balance_loss", "moh_gates"), ".functional"),
          **dict.fromkeys(("HeadMLP", "MoHRouter", "TalkingHeads"), ".module")}
__all__ = list(_HOMES)
__getattr__, __dir__ = lazy_exports(__name__, _HOMES)
