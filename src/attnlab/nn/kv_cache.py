"""The K/V cache of incremental decoding: each layer's keys and values of the tokens seen so far.

Causal attention of token i reads k_j, v_j for j <= i only, and those never change once computed (they depend on
tokens 1..j), so decoding one token at a time can keep them instead of recomputing the whole prefix. The new
queries sit at positions S - T + i of the S cached keys (attnlab.functional.attention's causal alignment).

Exact for every causal variant without a magnitude gate. MLA keeps its latent c (d_c floats per token) and rebuilds
K = c W_uk', V = c W_uv' for the whole prefix at every step (its smaller cache, paid for in recomputation; no
absorption of W_uk into W_q, which RoPE on the rebuilt K rules out). The prefix magnitude form gates key j by a weight
M_ij that depends on query i's whole prefix, so every new token changes the gates of all keys; the causal form's
w_j depends on keys 1..j only, but computing it for a new key needs the per-key state of the solve (the Cholesky
rows, or the low-rank solver's prefix sums), which attnlab does not keep. GPT.generate recomputes the prefix for
those variants, as for a bidirectional model.
"""

from __future__ import annotations

import torch


class LayerKV:
    """One layer's cache in buffers of block_size positions: keys and values [B, Hkv, S, d] (``append``), or, for
    MLA, the latents c [B, S, d_c] that K and V are rebuilt from (``append_latent``)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.buffers: tuple[torch.Tensor, ...] | None = None
        self.length = 0

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B, Hkv, T, d] after the cached ones; returns all of them, [B, Hkv, length + T, d]."""
        return self._append(k, v)

    def append_latent(self, c: torch.Tensor) -> torch.Tensor:
        """Store MLA's latents c [B, T, d_c] after the cached ones; returns all of them, [B, length + T, d_c]."""
        return self._append(c)[0]

    def _append(self, *new: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Write tensors [..., T, width] (positions on axis -2) into the buffers; the cached prefix of each."""
        t, capacity = new[0].shape[-2], self.capacity
        if self.length + t > capacity:
            raise ValueError(f"the K/V cache holds {capacity} positions; {self.length} cached + {t} new exceed it")
        if self.buffers is None:  # allocate once: writing into a buffer avoids re-copying the prefix at every token
            self.buffers = tuple(x.new_empty(*x.shape[:-2], capacity, x.shape[-1]) for x in new)
        for buffer, x in zip(self.buffers, new):
            buffer[..., self.length:self.length + t, :] = x
        self.length += t
        return tuple(buffer[..., :self.length, :] for buffer in self.buffers)


class KVCache:
    """Every layer's LayerKV and the number of positions they hold (the next token's position)."""

    def __init__(self, n_layer: int, capacity: int):
        self.layers = [LayerKV(capacity) for _ in range(n_layer)]

    @property
    def length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def reset(self) -> None:
        """Forget every cached position (the buffers are reallocated on the next append)."""
        for layer in self.layers:
            layer.buffers = None
            layer.length = 0
