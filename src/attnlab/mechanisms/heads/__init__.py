"""How the heads of a layer combine: talking heads, mixture of heads (MoH) and CODA's cascade (docs/heads.md)."""

from .config import HeadMixConfig
from .functional import HEAD_MIXES, LOGIT_MIXES, cascade_logits, moh_balance_loss, moh_gates
from .module import HeadMLP, MoHRouter, TalkingHeads

__all__ = ["HeadMixConfig", "HEAD_MIXES", "LOGIT_MIXES", "cascade_logits", "moh_balance_loss", "moh_gates", "HeadMLP",
           "MoHRouter", "TalkingHeads"]
