"""Configuration dataclasses: :class:`GPTConfig` (the model) and, re-exported from
:mod:`attnlab.attention_config`, :class:`AttentionConfig` (one attention layer).

``GPTConfig.attention`` is a registered variant name (:mod:`attnlab.registry`), an AttentionConfig or a dict of its
fields; :meth:`GPTConfig.resolved_attention` fills in the model's n_head / n_kv_head / bias / dropout.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .attention_config import LOWRANK, AttentionConfig, HeadMixConfig, MagnitudeConfig, ProjectionConfig
from .configio import from_dict, to_dict
from .errors import ConfigError, check_choice, check_number, strict_fields
from .registry import get_variant

POS_ENCODINGS = ("none", "learned", "sinusoidal", "rope", "alibi")
ACTIVATIONS = ("gelu_tanh", "gelu")


@strict_fields
@dataclass(frozen=True)
class GPTConfig:
    """A GPT. Field names follow GPT-2 / nanoGPT; defaults are GPT-2 small (124M)."""

    vocab_size: int = 50257
    """Tokens in the vocabulary (a run takes it from its tokenizer)."""
    block_size: int = 1024
    """Context length: the most positions the model sees at once."""
    n_layer: int = 12
    """Transformer blocks."""
    n_head: int = 12
    """Attention heads per layer."""
    n_embd: int = 768
    """Width of the residual stream; a multiple of n_head (head_dim = n_embd / n_head)."""
    dropout: float = 0.0
    """Dropout in [0, 1) on embeddings, residual branches and (unless the attention config sets its own) attention weights."""
    bias: bool = True
    """Biases in the projections, the MLP and the layer norms (GPT-2 has them; the output head has none)."""
    attention: str | AttentionConfig | dict = "standard"
    """A registered variant name (see `attnlab.variants()`) or an `AttentionConfig` (a dict in TOML)."""
    pos_encoding: str = "learned"
    """`"none"`, `"learned"` (GPT-2), `"sinusoidal"` (masking write-up, added to x before the projections), `"rope"` (Su et al. 2021, rotating q and k in every layer) or `"alibi"` (Press et al. 2022, arXiv:2108.12409: no position embeddings; -m_h |i - j| added to head h's logits in every layer, `attention.alibi`)."""
    rope_base: float = 10000.0
    """Base of the RoPE frequencies."""
    layer_norm_eps: float = 1e-5
    """Epsilon of the layer norms."""
    activation: str = "gelu_tanh"
    """`"gelu_tanh"` (GPT-2's "gelu_new", the tanh approximation) or `"gelu"` (exact)."""
    mlp_ratio: int = 4
    """Hidden width of the MLP as a multiple of n_embd; 0: no MLP, blocks x <- x + Attn(LN(x)) alone (an
    attention-only transformer, as in Elhage et al. 2021 and in Zoology's Figure 2 models)."""

    def __post_init__(self):
        for name in ("vocab_size", "block_size", "n_layer", "n_head", "n_embd"):
            check_number(name, getattr(self, name), low=1, integer=True)
        check_number("mlp_ratio", self.mlp_ratio, low=0, integer=True)
        check_number("dropout", self.dropout, low=0.0, high=1.0)
        if self.dropout == 1.0:
            raise ConfigError("dropout=1.0 would drop everything; use a value in [0, 1)")
        if not isinstance(self.bias, bool):
            raise ConfigError(f"bias={self.bias!r} must be true or false")
        check_choice("pos_encoding", self.pos_encoding, POS_ENCODINGS)
        check_choice("activation", self.activation, ACTIVATIONS)
        check_number("rope_base", self.rope_base, low=1.0, low_open=True)
        check_number("layer_norm_eps", self.layer_norm_eps, low=0.0, low_open=True)
        if self.n_embd % self.n_head:
            raise ConfigError(
                f"n_embd={self.n_embd} is not divisible by n_head={self.n_head}; "
                f"n_embd must be a multiple of n_head (head_dim = n_embd / n_head)"
            )
        if self.pos_encoding == "rope" and (self.n_embd // self.n_head) % 2:
            raise ConfigError(f"pos_encoding='rope' needs an even head_dim, got {self.n_embd // self.n_head}")
        if self.pos_encoding == "sinusoidal" and self.n_embd % 2:
            raise ConfigError(f"pos_encoding='sinusoidal' needs an even n_embd, got {self.n_embd}")
        attention = self.resolved_attention()  # validate the attention choice now, not at model build time
        if self.pos_encoding == "rope" and attention.differential and self.rope_dim % 2:
            raise ConfigError(f"pos_encoding='rope' with attention.differential=true rotates each half of a head, "
                              f"which needs head_dim divisible by 4, got {self.head_dim}")

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def rope_dim(self) -> int:
        """The width RoPE rotates: head_dim, or head_dim / 2 under differential attention (each half of a head's query
        and key is rotated on its own, as Ye et al. 2024's code does)."""
        return self.head_dim // 2 if self.resolved_attention().differential else self.head_dim

    def resolved_attention(self) -> AttentionConfig:
        """The AttentionConfig with the model's n_head / n_kv_head / bias / dropout filled in and checked."""
        attn = self.attention
        if isinstance(attn, str):
            attn = get_variant(attn)
        elif isinstance(attn, dict):
            attn = AttentionConfig.from_dict(attn)
        elif not isinstance(attn, AttentionConfig):
            raise ConfigError(
                f"attention={attn!r} must be a variant name (see attnlab.variants()) or an AttentionConfig"
            )
        if attn.n_head is not None and attn.n_head != self.n_head:
            raise ConfigError(f"attention.n_head={attn.n_head} disagrees with n_head={self.n_head}; leave it unset")
        n_kv = self.n_head if attn.n_kv_head is None else attn.n_kv_head
        if self.n_head % n_kv:
            raise ConfigError(
                f"n_head={self.n_head} is not divisible by attention.n_kv_head={n_kv}; "
                f"n_kv_head must divide n_head (allowed here: {_divisors(self.n_head)})"
            )
        if attn.alibi and self.pos_encoding != "alibi":
            raise ConfigError(f"attention.alibi=true comes from pos_encoding='alibi' (got pos_encoding="
                              f"{self.pos_encoding!r}); set pos_encoding='alibi' and leave attention.alibi unset")
        attn = attn.replace(
            alibi=self.pos_encoding == "alibi",
            n_head=self.n_head,
            n_kv_head=n_kv,
            bias=self.bias if attn.bias is None else attn.bias,
            dropout=self.dropout if attn.dropout is None else attn.dropout,
        )
        attn.check_sizes(self.n_embd)
        m = attn.magnitude
        if m is not None and m.solver == LOWRANK and m.rank > self.block_size:
            raise ConfigError(f"attention.magnitude.rank={m.rank} is larger than block_size="
                              f"{self.block_size}; use at most block_size landmarks (allowed 1..{self.block_size})")
        return attn

    def replace(self, **changes) -> "GPTConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, data: dict) -> "GPTConfig":
        return from_dict(cls, data)

    def to_dict(self) -> dict:
        """Plain dict (TOML-friendly: None values are dropped)."""
        return to_dict(self)

    @classmethod
    def named_config(cls, field: str, name: str):
        """What a name stands for in a field that also takes a table (:func:`attnlab.configio.apply_overrides`):
        ``attention = "gqa"`` is the variant's AttentionConfig preset."""
        if field == "attention":
            return get_variant(name)
        raise ConfigError(f"model.{field}={name!r} is a name, not a table; set the whole table")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


__all__ = ["AttentionConfig", "GPTConfig", "HeadMixConfig", "MagnitudeConfig", "ProjectionConfig", "POS_ENCODINGS", "ACTIVATIONS"]
