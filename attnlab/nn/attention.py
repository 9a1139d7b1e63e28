"""The attention layer: it holds the projections; the math is attnlab.functional.attention."""

from __future__ import annotations

import torch
from torch import nn

from ..config import AttentionConfig
from ..errors import ConfigError
from ..functional.attention import attention
from .gates import MagnitudeGate


class Attention(nn.Module):
    """Multi-head self-attention over x [B, T, n_embd] (Vaswani et al. 2017), built from an AttentionConfig.

        q = x W_q,  k = x W_k,  v = x W_v       (n_kv_head K/V heads shared by n_head / n_kv_head queries each)
        y = concat_h(attention(q_h, k_g(h), v_g(h))) W_o
    With config.magnitude != "off", a MagnitudeGate of the (pre-RoPE) keys gates the values (seed 000):
    v_j <- g_j v_j ("global", "causal"; the SDPA path stays), or p_ij <- p_ij g_ij ("prefix"; explicit path).
    """

    def __init__(self, config: AttentionConfig, n_embd: int):
        super().__init__()
        if config.n_head is None or config.n_kv_head is None:
            raise ConfigError("Attention needs a resolved config: set n_head and n_kv_head (GPTConfig does this)")
        if n_embd % config.n_head:
            raise ConfigError(f"n_embd={n_embd} is not divisible by n_head={config.n_head}")
        self.config = config
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = n_embd // config.n_head
        bias = True if config.bias is None else config.bias
        self.attn_dropout = 0.0 if config.dropout is None else config.dropout
        self.q_proj = nn.Linear(n_embd, self.n_head * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(n_embd, self.n_kv_head * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(n_embd, self.n_kv_head * self.head_dim, bias=bias)
        self.out_proj = nn.Linear(self.n_head * self.head_dim, n_embd, bias=bias)
        self.resid_dropout = nn.Dropout(self.attn_dropout)
        self.magnitude = MagnitudeGate.from_config(config) if config.magnitude != "off" else None

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """[B, T, n * head_dim] -> [B, n, T, head_dim]."""
        return x.unflatten(-1, (n, self.head_dim)).transpose(1, 2)

    def forward(self, x: torch.Tensor, rope: nn.Module | None = None, return_weights: bool = False):
        cfg = self.config
        q = self._heads(self.q_proj(x), self.n_head)
        k = self._heads(self.k_proj(x), self.n_kv_head)
        v = self._heads(self.v_proj(x), self.n_kv_head)
        value_gate = None
        if self.magnitude is not None:  # keys before RoPE: clones of a token stay clones at every position
            g = self.magnitude(k).to(v.dtype)  # [B, Hkv, S] or, for "prefix", [B, Hkv, T, S]
            if cfg.magnitude == "prefix":
                value_gate = g  # o_i = sum_j p_ij g_ij v_j
            else:
                v = v * g.unsqueeze(-1)  # Attn(Q, K, Gate o V)   (seed 000, step 3)
        if rope is not None:
            q, k = rope(q), rope(k)
        out = attention(
            q, k, v,
            causal=cfg.causal, scale=cfg.scale, temperature=cfg.temperature, kernel=cfg.kernel,
            normalizer=cfg.normalizer, mask_form=cfg.mask_form, backend=cfg.backend,
            dropout_p=self.attn_dropout if self.training else 0.0, return_weights=return_weights,
            value_gate=value_gate,
        )
        out, weights = out if return_weights else (out, None)
        y = self.resid_dropout(self.out_proj(out.transpose(1, 2).flatten(-2)))
        return (y, weights) if return_weights else y
