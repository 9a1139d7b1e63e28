"""How the heads of each layer differ and how much each one matters, as computations on a model.

* Head similarity: the Jensen-Shannon divergence between two heads' attention distributions, row by row,

      JS(p, q) = (KL(p || m) + KL(q || m)) / 2,   m = (p + q) / 2,   KL(p || m) = sum_j p_j log(p_j / m_j)

  (natural log, 0 log 0 = 0; 0 <= JS <= log 2). For heads h, g of one layer, S_hg = mean over windows b and query
  rows i of JS(p_h[b, i, :], p_g[b, i, :]); with a causal mask row i is a distribution over the keys j <= i.
* Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?", arXiv:1905.10650): head h's
  output is multiplied by xi_h before W_o, y = concat_h(xi_h o_h) W_o, and the importance of head h of layer l is
  the validation loss increase when it alone is masked out, delta_lh = L(xi = 1 - e_h in layer l) - L(xi = 1).
* MoH router usage (Jin et al. 2024, arXiv:2410.11842; attnlab.mechanisms.heads.functional): per head, the mean weight g_h
  over tokens, and for the routed heads the fraction of tokens whose top-k selected it (these fractions sum to k).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """JS(p, q) = (KL(p || m) + KL(q || m)) / 2, m = (p + q) / 2, in nats, over the last axis (broadcast);
    zeros are allowed in either (0 log 0 = 0)."""
    m = (p + q) / 2
    kl_pm = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)  # where p_j > 0, m_j >= p_j / 2 > 0
    kl_qm = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(-1)
    return (kl_pm + kl_qm) / 2


def is_distribution(weights: torch.Tensor, tol: float = 1e-4) -> bool:
    """Whether every row of weights [..., S] is nonnegative and sums to 1 (talking heads' mixed weights and the raw
    correlations of boneless-corr are not, and JS is not defined for them)."""
    return bool((weights >= 0).all()) and bool(((weights.sum(-1) - 1).abs() <= tol).all())


def head_similarity(weights: torch.Tensor) -> torch.Tensor:
    """S [H, H], S_hg = mean over b, i of JS(p_h[b, i, :], p_g[b, i, :]) for one layer's weights [B, H, T, S]:
    symmetric, zero on the diagonal. One head at a time against all (memory B H T S)."""
    w = weights.double()
    return torch.stack([js_divergence(w[:, h:h + 1], w).mean((0, 2)) for h in range(w.shape[1])])


def mean_loss(model, windows: Iterable[tuple[torch.Tensor, torch.Tensor]], head_mask: torch.Tensor | None = None
              ) -> float:
    """The mean cross-entropy of model over every target of the batches (x, y) (targets -1 are ignored; batches
    weighted by their number of targets, as the trainer's evaluation), in eval mode, without gradients; head_mask
    [n_layer, n_head] as GPT.forward takes it."""
    was_training = model.training
    model.eval()
    total, count = 0.0, 0
    try:
        with torch.no_grad():
            for x, y in windows:
                n = int((y >= 0).sum())
                total += float(model(x, y, head_mask=head_mask)[1]) * n
                count += n
    finally:
        model.train(was_training)
    return total / count


def head_knockout(model, windows: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
    """delta [n_layer, n_head] (float64): delta_lh = L(head h of layer l masked) - L(no head masked), the mean
    validation losses (:func:`mean_loss`) on the same batches ``windows`` (Michel et al. 2019, arXiv:1905.10650)."""
    base = mean_loss(model, windows)
    deltas = torch.zeros(len(model.blocks), model.blocks[0].attn.n_head, dtype=torch.float64)
    for layer in range(deltas.shape[0]):
        for head in range(deltas.shape[1]):
            xi = torch.ones(deltas.shape, device=model.wte.weight.device)  # xi_lh = 0: head h of layer l masked
            xi[layer, head] = 0.0
            deltas[layer, head] = mean_loss(model, windows, xi) - base
    return deltas


@torch.no_grad()
def moh_usage(model, idx: torch.Tensor) -> list[dict | None]:
    """Per layer, after a forward of the tokens idx [B, T] in eval mode: for a MoH layer {"shared": h_s, "top_k": k,
    "weight": [H] the mean router weight g_h over tokens (shared heads first), "selected": [h - h_s] the fraction of
    tokens selecting each routed head (summing to k)}; None for a layer without a router."""
    was_training = model.training
    model.eval()
    try:
        model(idx)
    finally:
        model.train(was_training)
    usage = []
    for block in model.blocks:
        router = block.attn.router
        if router is None:
            usage.append(None)
            continue
        gates, chosen, _ = router.last
        usage.append({"shared": router.shared, "top_k": router.top_k, "weight": gates.flatten(0, -2).double().mean(0),
                      "selected": chosen.flatten(0, -2).double().mean(0)})
    return usage


__all__ = ["js_divergence", "is_distribution", "head_similarity", "mean_loss", "head_knockout",
           "moh_usage"]
