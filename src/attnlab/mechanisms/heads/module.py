"""The parameters of head recombination; the math is attnlab.mechanisms.heads.functional.

TalkingHeads holds P_l and P_w (identity at init, so the layer starts as plain multi-head attention);
MoHRouter holds W_s, W_r, W_h and keeps the last forward's router statistics for the balance loss and the logs;
HeadMLP is CODA's f_l (the model passes one layer's logits to the next).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .functional import moh_balance_loss, moh_gates


class TalkingHeads(nn.Module):
    """Talking heads (Shazeer et al. 2020, arXiv:2003.02436): the [H, H] mixes of the logits and of the weights."""

    def __init__(self, n_head: int):
        super().__init__()
        self.logit_mix = nn.Parameter(torch.eye(n_head))  # P_l
        self.weight_mix = nn.Parameter(torch.eye(n_head))  # P_w

    def forward(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.logit_mix, self.weight_mix


class HeadMLP(nn.Module):
    """CODA's f_l: [..., H] -> [..., H], Linear(H, 4H), LeakyReLU(0.2), Linear(4H, 4H), LeakyReLU(0.2), Linear(4H, H),
    applied at every (i, j) across the heads (the authors' released code, LZhengisme/CODA, with its init: Xavier
    uniform with gain 1/sqrt(2), zero biases). Raw parameters, not nn.Linear, so GPT's N(0, 0.02) re-init of every
    nn.Linear leaves that init alone; attnlab.train.optim decays the weights like every 2-D parameter."""

    def __init__(self, n_head: int, hidden: int = 4):
        super().__init__()
        sizes = [(hidden * n_head, n_head), (hidden * n_head, hidden * n_head), (n_head, hidden * n_head)]
        self.weights = nn.ParameterList(
            nn.Parameter(nn.init.xavier_uniform_(torch.empty(*size), gain=1 / math.sqrt(2))) for size in sizes)
        self.biases = nn.ParameterList(nn.Parameter(torch.zeros(size[0])) for size in sizes)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        for n, (w, b) in enumerate(zip(self.weights, self.biases)):
            u = F.linear(u, w, b)
            u = F.leaky_relu(u, 0.2) if n < len(self.weights) - 1 else u
        return u


class MoHRouter(nn.Module):
    """Mixture-of-head routing (Jin et al. 2024, arXiv:2410.11842): x [B, T, C] -> head weights g [B, T, H].

    Holds W_s [h_s, C], W_r [h - h_s, C], W_h [2, C] (bias-free Linears, as in the paper), shared heads first.
    forward returns (g, beta L_b): the load-balance loss in training (a graph tensor the model adds to its loss),
    None otherwise. ``last`` holds that forward's gates [..., H], selection mask [..., h_r] and L_b (or None),
    detached, for the training log (moh_log) and the head analyses.
    """

    def __init__(self, n_embd: int, n_head: int, shared: int, top_k: int, balance: float):
        super().__init__()
        self.shared, self.top_k, self.balance = shared, top_k, balance
        self.w_shared = nn.Linear(n_embd, shared, bias=False) if shared else None  # W_s
        self.w_routed = nn.Linear(n_embd, n_head - shared, bias=False)  # W_r
        self.w_group = nn.Linear(n_embd, 2, bias=False) if shared else None  # W_h
        self.last: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        shared = None if self.w_shared is None else self.w_shared(x)
        group = None if self.w_group is None else self.w_group(x)
        gates, probs, chosen = moh_gates(shared, self.w_routed(x), group, self.top_k)
        balance = moh_balance_loss(probs, chosen) if self.training and self.balance else None  # L_b
        self.last = gates.detach(), chosen, None if balance is None else balance.detach()
        return gates, None if balance is None else self.balance * balance


def moh_routers(model: nn.Module) -> list[MoHRouter]:
    """The MoHRouters of model in module order (entry i belongs to the i-th MoH layer)."""
    return [mod for mod in model.modules() if isinstance(mod, MoHRouter)]


def moh_log(model: nn.Module, prefix: str = "moh") -> dict[str, float]:
    """The last forward's routing, flat for a log row: "<prefix>/aux_loss" (sum of beta L_b, the part of the training
    loss that is not cross-entropy), and per layer i "<prefix>/L<i>/balance" (L_b) and "<prefix>/L<i>/h<j>" (head
    j's mean weight g_j; shared heads first, and a head weighted 1 on every token reads 1)."""
    row, total = {}, 0.0
    for i, router in enumerate(moh_routers(model)):
        balance = None if router.last is None else router.last[2]
        if balance is not None:
            total += router.balance * balance.item()
            row[f"{prefix}/L{i}/balance"] = balance.item()
        if router.last is not None:
            for j, usage in enumerate(router.last[0].flatten(0, -2).mean(0).tolist()):
                row[f"{prefix}/L{i}/h{j}"] = usage
    return {f"{prefix}/aux_loss": total, **row} if row else {}
