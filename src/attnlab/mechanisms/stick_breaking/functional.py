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


def stick_breaking(z: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Stick-breaking weights of logits ``z`` [B, H, T, S], causal by construction: query i (at position S - T + i)
    uses only the keys before it and its own. ``keep`` (boolean, broadcastable, True where query i sees key j; None:
    all) may hide earlier keys (padding), which then take no share; a query whose own key is hidden drops the rest."""
    t, s = z.shape[-2:]
    own = own_position(t, s, device=z.device)
    before = torch.ones(t, s, dtype=torch.bool, device=z.device).tril(s - t - 1)  # j < S - T + i: strictly earlier
    if keep is not None:
        before, own = before & keep, own & keep  # the keys the stick is broken over: seen and strictly earlier
    log_rest = F.logsigmoid(-z).masked_fill(~before, 0.0)  # log(1 - beta_ik) = log sigmoid(-z_ik); 0 off the stick
    upto = log_rest.flip(-1).cumsum(-1).flip(-1)  # sum_{k >= j} log(1 - beta_ik)
    nearer = F.pad(upto[..., 1:], (0, 1))  # sum_{k > j}: the keys between j and the query
    shares = (F.logsigmoid(z) + nearer).exp()  # A_ij = beta_ij prod_{j<k<p} (1 - beta_ik)
    left = upto[..., :1].exp()  # prod_{k < p} (1 - beta_ik)
    return torch.where(before, shares, torch.where(own, left, torch.zeros_like(shares)))
