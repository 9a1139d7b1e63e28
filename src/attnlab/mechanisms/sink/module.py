"""The sink logits of one attention layer: s [n_head], the logit of one zero-valued key every query sees."""

from __future__ import annotations

import torch
import torch.nn as nn

S_INIT = 0.0
"""The initial s of every head: 0, the "softmax plus one" denominator exp(0) + sum_k exp(z_ik) (x-transformers'
learned sink starts there too); a head learns how much mass to leave unspent."""


class AttentionSink(nn.Module):
    """s [n_head], initialised to :data:`S_INIT`, passed as ``sink`` to :func:`attnlab.functional.attention`."""

    def __init__(self, n_head: int):
        super().__init__()
        self.logit = nn.Parameter(torch.full((n_head,), S_INIT))
