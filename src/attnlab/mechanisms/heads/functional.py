"""How the heads of one layer are combined: talking heads and mixture-of-head routing, as pure functions.

Plain multi-head attention concatenates the heads and applies W_O, "a linear recombination that ignores the block
structure" (masking write-up). Three published alternatives, all exactly causal (they mix across heads at one (i, j), or
weight the heads of token i by a function of token i alone):

    talking heads (Shazeer et al. 2020, arXiv:2003.02436, s.3):
        J_h = q_h k_h' s                           the logits of each head
        L_g = sum_h J_h P_l[h, g]                  mixed across heads before the softmax
        W_g = softmax(L_g + mask)
        U_g = sum_h W_h P_w[h, g]                  mixed again after it
        o_g = U_g v_g
    mixture of heads, MoH (Jin et al. 2024, arXiv:2410.11842, s.3.2): per token x_t, h_s shared heads always on and
    the top-k of h - h_s routed heads, the head outputs weighted before W_O:
        g_i = a_1 softmax(W_s x_t)_i                        shared heads, 1 <= i <= h_s
        g_i = a_2 softmax(W_r x_t)_i  if i in top-k else 0  routed heads
        [a_1, a_2] = softmax(W_h x_t)
        MoH(x_t) = sum_i g_i H_i W_O^i = concat_i(g_i H_i) W_O
    with the load-balance loss on the routed heads (its eq. for L_b), added to the training loss times beta:
        L_b = sum_i f_i P_i,  f_i = the fraction of tokens that select head i,  P_i = the mean of softmax(W_r x_t)_i.
    Normalisation (from the authors' released code, SkyworkAI/MoH, which the paper's equations leave out): the
    top-k routed weights are renormalised to sum to 1, and each group is scaled by its number of active heads (the
    shared weights by h_s, the routed by k, [a_1, a_2] by 2), so that a uniform router weights every active head 1,
    as plain multi-head attention does.
    cascaded head-colliding attention, CODA (Zheng et al. 2021, arXiv:2105.14850), as the authors' released code
    (LZhengisme/CODA) computes it: the logits a^l of layer l are a Gaussian latent whose mean depends on every
    head's logits at the same (i, j) and on layer l - 1's sampled logits, a cascade through the layers:
        s^l = q k' s                                       the raw logits, [B, H, T, S]
        a^1 = s^1 + e,          e ~ N(0, sigma^2 I) in training, e = 0 at evaluation
        u^l = s^l + a^(l-1),    a^l = u^l + f_l(u^l) + e    (l >= 2; f_l an MLP across the H heads at each (i, j))
        p^l = softmax(a^l + mask)
"""

from __future__ import annotations

import torch
from .names import HEAD_MIXES, LOGIT_MIXES  # noqa: F401  (their home: .names)



def cascade_logits(scores: torch.Tensor, previous: torch.Tensor | None, head_mlp, noise: float,
                   generator: torch.Generator | None = None) -> torch.Tensor:
    """CODA's logits a^l (module docstring) from the raw logits s^l [B, H, T, S] and layer l - 1's a (None in the
    first layer); head_mlp maps [..., H] -> [..., H] (f_l); noise: sigma of the training noise (0: the mean path,
    what evaluation uses). Masks are applied after this, so masked entries never reach an unmasked one (f_l acts
    at one (i, j) at a time)."""
    a = scores if previous is None else scores + previous  # u^l = s^l + a^(l-1)
    if previous is not None:
        a = a + head_mlp(a.movedim(1, -1)).movedim(-1, 1)  # u^l + f_l(u^l)
    if noise:
        a = a + noise * torch.randn(a.shape, dtype=a.dtype, device=a.device, generator=generator)
    return a


def moh_gates(shared_logits: torch.Tensor | None, routed_logits: torch.Tensor, group_logits: torch.Tensor | None,
              top_k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """MoH head weights per token (module docstring): g [..., h_s + h_r], shared heads first.

    shared_logits W_s x [..., h_s] (None when h_s = 0), routed_logits W_r x [..., h_r], group_logits W_h x [..., 2]
    (None when h_s = 0: the routed heads alone, a_2 = 1). Returns (g, the router's probabilities
    softmax(W_r x) [..., h_r], the selection mask [..., h_r] with top_k ones per token) for the balance loss.
    """
    probs = torch.softmax(routed_logits, dim=-1)  # softmax(W_r x_t)
    chosen = torch.zeros_like(probs).scatter_(-1, probs.topk(top_k, dim=-1).indices, 1.0)  # 1(i in top-k)
    routed = probs * chosen
    routed = routed / routed.sum(-1, keepdim=True) * top_k  # sum = k (the top k of a softmax sum to >= k / h_r)
    if shared_logits is None:
        return routed, probs, chosen
    shared = torch.softmax(shared_logits, dim=-1) * shared_logits.shape[-1]  # sum = h_s
    a = torch.softmax(group_logits, dim=-1) * 2  # [a_1, a_2], sum = 2
    return torch.cat([a[..., :1] * shared, a[..., 1:] * routed], dim=-1), probs, chosen


def moh_balance_loss(probs: torch.Tensor, chosen: torch.Tensor) -> torch.Tensor:
    """L_b = sum_i f_i P_i over the routed heads; probs, chosen [..., h_r] as moh_gates returns them.

    f_i (the fraction of tokens selecting head i) is a count and carries no gradient; P_i does."""
    f = chosen.flatten(0, -2).mean(0)
    p = probs.flatten(0, -2).mean(0)
    return (f * p).sum()


__all__ = ["HEAD_MIXES", "LOGIT_MIXES", "cascade_logits", "moh_gates", "moh_balance_loss"]
