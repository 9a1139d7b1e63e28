"""Causal masking in the two forms of the masking write-up.

Form 1 (additive, the usual implementation): softmax_rowwise(z + (-inf) U), U_ij = 1(i < j).
Form 2 (Mask(B), zero then renormalise after the softmax):
    Mask(B)_ij = B_ij / sum_{k <= i} B_ik   for j <= i,   0 for j > i.
Both give the same weights; the masking write-up derives permutation invariance with form 2.

With more keys than queries (decoding with a K/V cache: S cached keys, the T queries are the last T positions),
query i sits at position S - T + i and sees keys j <= S - T + i.
"""

from __future__ import annotations

import torch


def causal_keep(t: int, s: int | None = None, device=None) -> torch.Tensor:
    """Boolean [t, s] matrix, True where key j is visible to query i (j <= S - T + i); the complement of U.

    Bottom-right aligned: with s > t the queries are the last t of s positions (a K/V cache); s = t is j <= i."""
    s = t if s is None else s
    if s < t:
        raise ValueError(f"causal attention needs at least as many keys as queries, got {t} queries and {s} keys")
    return torch.ones(t, s, dtype=torch.bool, device=device).tril(diagonal=s - t)


def additive_causal_mask(t: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """(-inf) U with the convention exp(-inf) = 0: 0 on and below the diagonal, -inf above (the masking write-up)."""
    return torch.zeros(t, t, dtype=dtype, device=device).masked_fill(~causal_keep(t, device=device), float("-inf"))


def mask_renormalize(b: torch.Tensor) -> torch.Tensor:
    """Mask(B) of the masking write-up, literally: zero entries j > i, divide each row by its remaining sum."""
    keep = causal_keep(b.shape[-2], b.shape[-1], device=b.device)
    kept = b.masked_fill(~keep, 0.0)
    return kept / kept.sum(-1, keepdim=True)


def mask_renormalize_softmax(logits: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
    """Mask(softmax(z)), computed in log space.

    Mask(A)_ij = A_ij / sum_{k<=i} A_ik = softmax over the visible j of log A_ij: the same zero-and-renormalise,
    but a row whose future logits dominate cannot underflow its visible weights to 0/0 (which the literal form
    does once the gap exceeds ~100 in float32). keep: the visible keys (default: the causal ones, causal_keep).
    """
    log_a = torch.log_softmax(logits, dim=-1)  # A = softmax(z), the full (unmasked) attention map
    keep = causal_keep(logits.shape[-2], logits.shape[-1], device=logits.device) if keep is None else keep
    return torch.softmax(log_a.masked_fill(~keep, float("-inf")), dim=-1)  # renormalise over j <= i
