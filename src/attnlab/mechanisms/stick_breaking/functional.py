"""Stick-breaking attention as attnlab.functional.attention computes it (Tan et al. 2024, arXiv:2410.17980), in
log space as the paper does, so that no product of many factors below 1 underflows:

    log A_ij = log sigmoid(z_ij) + sum_{j < k < p_i} log sigmoid(-z_ik)      (j < p_i, p_i: query i's own position)
    A_ip_i   = exp(sum_{k < p_i} log sigmoid(-z_ik))                        (the stick left, on its own value)

The sum over the keys between j and the query is an exclusive reverse cumulative sum along the key axis (no
difference of two large sums is taken). See attnlab.mechanisms.stick_breaking.reference for the definition.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def own_position(t: int, s: int, device=None) -> torch.Tensor:
    """[T, S] boolean, True at (i, S - T + i): the key of query i's own position (after S - T cached keys)."""
    return torch.arange(s, device=device)[None, :] == torch.arange(s - t, s, device=device)[:, None]


def stick_breaking(z: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Stick-breaking weights of causal logits ``z`` [B, H, T, S]; ``keep`` (boolean, broadcastable, True where query
    i sees key j, j <= S - T + i) may also hide earlier keys (padding), which then take no share. A query whose own
    key is hidden drops the remainder."""
    own = own_position(z.shape[-2], z.shape[-1], device=z.device)
    before = keep & ~own  # the keys the stick is broken over: seen and strictly earlier
    log_rest = F.logsigmoid(-z).masked_fill(~before, 0.0)  # log(1 - beta_ik) = log sigmoid(-z_ik); 0 off the stick
    upto = log_rest.flip(-1).cumsum(-1).flip(-1)  # sum_{k >= j} log(1 - beta_ik)
    nearer = F.pad(upto[..., 1:], (0, 1))  # sum_{k > j}: the keys between j and the query
    shares = (F.logsigmoid(z) + nearer).exp()  # A_ij = beta_ij prod_{j<k<p} (1 - beta_ik)
    left = upto[..., :1].exp()  # prod_{k < p} (1 - beta_ik)
    return torch.where(before, shares, torch.where(own & keep, left, torch.zeros_like(shares)))
