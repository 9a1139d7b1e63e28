"""The SSMax parameters of one attention layer: s per head, applied by scaling the queries."""

from __future__ import annotations

import torch
import torch.nn as nn

from .reference import S_INIT, keys_seen


class ScalableSoftmax(nn.Module):
    """s [n_head], initialised to :data:`~.reference.S_INIT`. :meth:`query_scale` gives the factor s_h log n_i that
    multiplies query i of head h: with dot-product logits z_ij = q_i . k_j x scale, scaling q_i scales row i of the
    logits (and nothing else), so (s log n) z enters the softmax on every attention path, SDPA included, and a
    logit prior added to it (magnitude, count) is left unscaled."""

    def __init__(self, n_head: int):
        super().__init__()
        self.s = nn.Parameter(torch.full((n_head,), S_INIT))

    def query_scale(self, t: int, s_len: int, *, causal: bool, offset: int = 0, dtype=None) -> torch.Tensor:
        """[1, n_head, t, 1]: s_h log n_i for the t queries of a layer that sees ``s_len`` keys."""
        log_n = keys_seen(t, s_len, causal=causal, offset=offset, device=self.s.device).log().to(self.s.dtype)
        return (self.s.view(1, -1, 1, 1) * log_n.view(1, 1, -1, 1)).to(dtype or self.s.dtype)
