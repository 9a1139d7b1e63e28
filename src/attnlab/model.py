"""A GPT whose attention is any attnlab variant.

GPT-2's architecture (Radford et al. 2019) by default: token embedding (+ positions), n_layer pre-LayerNorm
blocks x <- x + Attn(LN(x)); x <- x + MLP(LN(x)), a final LayerNorm and a head tied to the token embedding.
With mlp_ratio = 0 the blocks are x <- x + Attn(LN(x)) alone (attention-only).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from .attention_config import route
from .config import GPTConfig
from .errors import ConfigError
from .mechanisms.count_prior.reference import count_log_prior
from .nn import Attention, KVCache, LayerKV, LayerOutput, LearnedPositions, RotaryEmbedding, SinusoidalPositions


class MLP(nn.Module):
    """x -> GELU(x W_fc) W_proj, hidden width mlp_ratio * n_embd."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.mlp_ratio * config.n_embd
        self.fc = nn.Linear(config.n_embd, hidden, bias=config.bias)
        self.proj = nn.Linear(hidden, config.n_embd, bias=config.bias)
        self.approximate = "tanh" if config.activation == "gelu_tanh" else "none"
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.proj(F.gelu(self.fc(x), approximate=self.approximate)))


class Block(nn.Module):
    """Pre-LayerNorm transformer block; without ln_2 and mlp when config.mlp_ratio is 0."""

    def __init__(self, config: GPTConfig, layer: int = 0):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.attn = Attention(config.resolved_attention(), config.n_embd, layer)
        if config.mlp_ratio:
            self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
            self.mlp = MLP(config)
        else:
            self.ln_2 = self.mlp = None

    def forward(self, x: torch.Tensor, rope: nn.Module | None = None, kv: LayerKV | None = None,
                count_prior: torch.Tensor | None = None, previous_logits: torch.Tensor | None = None,
                return_weights: bool = False, head_mask: torch.Tensor | None = None) -> LayerOutput:
        """x <- x + Attn(LN(x)); x <- x + MLP(LN(x)): the attention layer's LayerOutput with y the block's output."""
        out = self.attn.run(self.ln_1(x), rope, return_weights=return_weights, kv=kv, count_prior=count_prior,
                            previous_logits=previous_logits, head_mask=head_mask)
        x = x + out.y
        return out._replace(y=x if self.mlp is None else x + self.mlp(self.ln_2(x)))


class ModelOutput(NamedTuple):
    """GPT.run: logits [B, T, vocab] (or [n, vocab] at the n positions of run's ``answers`` mask); aux_losses: the layers' auxiliary training losses (MoH's beta L_b in
    training; empty otherwise); weights: every layer's attention weights [B, n_head, T, S] when asked for."""

    logits: torch.Tensor
    aux_losses: list[torch.Tensor]
    weights: list[torch.Tensor] | None = None


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos = {
            "learned": lambda: LearnedPositions(config.block_size, config.n_embd),
            "sinusoidal": lambda: SinusoidalPositions(config.block_size, config.n_embd),
        }.get(config.pos_encoding, lambda: None)()
        self.rope = (
            RotaryEmbedding(config.block_size, config.rope_dim, config.rope_base)
            if config.pos_encoding == "rope" else None
        )
        self.drop = nn.Dropout(config.dropout)
        self.blocks = nn.ModuleList(Block(config, layer) for layer in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd, eps=config.layer_norm_eps, bias=config.bias)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # weight tying (Press & Wolf 2017), as in GPT-2
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2: residual projections scaled by 1/sqrt(2 n_layer)
            if name.endswith(("attn.out_proj.weight", "mlp.proj.weight")):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)

    def num_params(self, non_embedding: bool = True) -> int:
        """Parameter count; by default without the (tied) token and the position embeddings, as nanoGPT reports."""
        n = sum(p.numel() for p in self.parameters())
        if non_embedding:
            n -= self.wte.weight.numel()
            if isinstance(self.pos, LearnedPositions):
                n -= self.pos.weight.numel()
        return n

    check_token_range = True
    """Check every forward's token ids against [0, vocab_size): two reductions read on the host (a device sync on a
    GPU). The trainer turns it off: its batches come from a tokenizer of exactly this vocabulary."""

    def _check_idx(self, idx: torch.Tensor, offset: int = 0) -> None:
        if torch.compiler.is_compiling():  # the range check syncs and would break the compiled graph
            return
        if idx.dim() != 2 or idx.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"idx must be an integer tensor of shape [batch, seq], got {tuple(idx.shape)} {idx.dtype}")
        t = idx.shape[1]
        if offset + t > self.config.block_size:
            raise ValueError(f"sequence length {t}{f' after {offset} cached' if offset else ''} exceeds "
                             f"block_size={self.config.block_size}")
        if self.check_token_range and idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= self.config.vocab_size):
            raise ValueError(
                f"token ids must lie in [0, {self.config.vocab_size}), got range "
                f"[{int(idx.min())}, {int(idx.max())}]"
            )

    def embed(self, idx: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Token embeddings plus input positions p_i (masking write-up: added to x before the projections); the tokens sit
        at positions offset.. (after offset cached ones)."""
        x = self.wte(idx)
        if self.pos is not None:
            x = x + self.pos(idx.shape[1], offset)
        return self.drop(x)

    @property
    def cache_exact(self) -> bool:
        """Whether a K/V cache gives exactly the logits of a full forward: causal attention without a magnitude
        gate in every layer (attnlab.nn.kv_cache says why the gated forms need the whole prefix)."""
        return all(route(b.attn.config).cacheable for b in self.blocks)

    def new_cache(self) -> KVCache:
        """An empty K/V cache for forward(..., cache=) of up to block_size positions."""
        if not self.cache_exact:
            raise ConfigError("a K/V cache is exact only for causal attention without a magnitude gate, count prior or "
                              "selective attention, off backend 'triton' (its kernels take as many keys as queries); "
                              f"attention={self.config.attention!r} cannot take one")
        return KVCache(self.config.n_layer, self.config.block_size)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, cache: KVCache | None = None,
                head_mask: torch.Tensor | None = None, answers_only: bool = False):
        """Logits [B, T, vocab] for every position, and the mean cross-entropy against targets (-1 = ignore) plus
        the layers' auxiliary losses (MoH's beta L_b, in training only).

        answers_only (needs targets): the head only at the n positions whose target is not -1, logits [n, vocab]
        (equal to the full forward's logits[targets >= 0]) and the same loss, without the head's cost at the
        ignored positions: for tasks, whose targets are a few answers per sequence.

        cache: a K/V cache (new_cache()); idx then holds the tokens after the cache.length cached ones, which are
        appended to it (incremental decoding). head_mask: xi [n_layer, n_head], head h of layer l's output times
        xi_lh (head knockout, attnlab.analysis.heads)."""
        if answers_only and targets is None:
            raise ValueError("answers_only=True needs targets: the answers are the positions whose target is not -1")
        answers = targets >= 0 if answers_only else None
        out = self.run(idx, cache=cache, head_mask=head_mask, answers=answers)
        loss = None
        if targets is not None:
            loss = (F.cross_entropy(out.logits, targets[answers]) if answers is not None
                    else F.cross_entropy(out.logits.flatten(0, 1), targets.flatten(), ignore_index=-1))
            for aux in out.aux_losses:
                loss = loss + aux
        return out.logits, loss

    def run(self, idx: torch.Tensor, cache: KVCache | None = None, head_mask: torch.Tensor | None = None,
            return_weights: bool = False, answers: torch.Tensor | None = None) -> ModelOutput:
        """The blocks in order, each handed what the one before returned (CODA's logits); see :meth:`forward`.
        answers: a bool mask [B, T]; the final LayerNorm and the head then run at its positions only."""
        offset = 0 if cache is None else cache.length
        self._check_idx(idx, offset)
        if head_mask is not None and tuple(head_mask.shape) != (len(self.blocks), self.blocks[0].attn.n_head):
            raise ValueError(f"head_mask must have shape [n_layer, n_head] = [{len(self.blocks)}, "
                             f"{self.blocks[0].attn.n_head}], got {tuple(head_mask.shape)}")
        x, prior, previous = self.embed(idx, offset), self._count_prior(idx), None
        aux, weights = [], [] if return_weights else None
        for i, block in enumerate(self.blocks):
            out = block(x, self.rope, None if cache is None else cache.layers[i], prior, previous, return_weights,
                        None if head_mask is None else head_mask[i])
            x, previous = out.y, out.logits
            if out.aux_loss is not None:
                aux.append(out.aux_loss)
            if return_weights:
                weights.append(out.weights)
        if answers is not None:
            x = x[answers]  # LayerNorm and head act on each position alone: selecting first changes no value
        return ModelOutput(self.lm_head(self.ln_f(x)), aux, weights)

    def _count_prior(self, idx: torch.Tensor) -> torch.Tensor | None:
        """-log c_ij of the tokens idx when a layer uses the duplicate-count prior (attention.count_prior), else
        None."""
        if not any(b.attn.config.count_prior for b in self.blocks):
            return None
        return count_log_prior(idx, self.wte.weight.dtype)

    @torch.no_grad()
    def attention_maps(self, idx: torch.Tensor) -> list[torch.Tensor]:
        """Attention weights [B, n_head, T, T] of every layer for the tokens idx (computed on the explicit path)."""
        return self.run(idx, return_weights=True).weights

    @torch.no_grad()
    def generate(self, idx: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, generator: torch.Generator | None = None,
                 use_cache: bool | None = None) -> torch.Tensor:
        """Sample max_new_tokens tokens after idx [B, T]; temperature 0 is greedy; top_k keeps the k likeliest.

        use_cache: decode with a K/V cache (default: whenever it is exact, see cache_exact); the tokens are those
        of the full recomputation. The context is the last block_size tokens: once the cache is full, each token
        starts a new window, recomputed whole (absolute positions shift), as without a cache."""
        if temperature < 0:
            raise ValueError(f"temperature={temperature} must be >= 0 (0 = greedy)")
        if top_k is not None and top_k < 1:
            raise ValueError(f"top_k={top_k} must be a positive integer or None")
        block = self.config.block_size
        cache = self.new_cache() if (self.cache_exact if use_cache is None else use_cache) else None
        for _ in range(max_new_tokens):
            if cache is None:
                logits = self(idx[:, -block:])[0][:, -1, :]
            elif cache.length == 0 or cache.length >= block:  # a new window: fill the cache with it
                cache.reset()
                logits = self(idx[:, -block:], cache=cache)[0][:, -1, :]
            else:  # one new token at position cache.length
                logits = self(idx[:, -1:], cache=cache)[0][:, -1, :]
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k is not None:
                    kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)
            idx = torch.cat((idx, nxt), dim=1)
        return idx

    def save_pretrained(self, path):
        """Write config.json and model.safetensors to the directory ``path`` (attnlab.hf.pretrained); returns it."""
        from .hf.pretrained import save_pretrained

        return save_pretrained(self, path)

    @classmethod
    def from_pretrained(cls, path, map_location="cpu") -> "GPT":
        """The model saved by save_pretrained in the local directory ``path`` (every variant, exactly)."""
        from .hf.pretrained import load_pretrained

        return load_pretrained(cls, path, map_location)

    @classmethod
    def from_hf_gpt2(cls, path, attention="standard") -> "GPT":
        """Load a local Hugging Face GPT-2 checkpoint directory (config.json + model.safetensors or
        pytorch_model.bin); no network. ``attention`` may swap the mechanism (e.g. "rbf") over the same weights."""
        from .hf import load_gpt2

        return load_gpt2(cls, path, attention)


__all__ = ["GPT", "GPTConfig", "Block", "MLP", "ConfigError"]
