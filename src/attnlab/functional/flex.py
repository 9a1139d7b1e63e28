"""FlexAttention as a backend for the mechanisms that only modify the scores: softmax with a logit prior and a sink.

    o_i = sum_j softmax_j(s_ij) v_j,   s_ij = q_i . k_j * scale + p_ij   (j <= S - T + i when causal)

with p per key [B|1, Hp, S] or per (i, j) [B|1, Hp, T, S] (Hp = 1, Hkv or H): the magnitude priors, the
duplicate-count prior, or both summed. FlexAttention (torch.nn.attention.flex_attention; Dong et al. 2024,
arXiv:2412.05496) compiles a score modifier and a mask into one fused kernel: the prior is read inside the kernel
by one index, p[b, h // div, kv] or p[b, h // div, q, kv], and the causal mask becomes a block mask, so no
[B, H, T, S] float mask is built. A learned sink (attnlab.mechanisms.sink) is one more key, as on the SDPA path:
key S is zero, its score is s_h (read from the sink by one index), its value zero, and every query sees it, so the
softmax's denominator gains exp(s_h) and nothing is added to o_i. ALiBi (Press et al. 2022, arXiv:2108.12409) is
computed in the score modifier from the indices, s_ij - m_h |pos_i - j| with pos_i = S - T + i: the slopes m [H] are
read by one index and no [H, T, S] bias exists. A softcap, c tanh(z / c) (Gemma 2, arXiv:2408.00118), bends
q . k scale first, before the rest is added.

On CUDA the call is compiled once per process (torch.compile of flex_attention). On the CPU FlexAttention runs
unfused and has no backward pass, so this backend refuses inputs that need gradients there (one line); it is
meant for CUDA, and the CPU path serves the tests of its forward values.
"""

from __future__ import annotations

import functools

import torch

__all__ = ["flex_attention_scores"]

MIN_HEAD_DIM = 16  # the smallest head dimension FlexAttention compiles for on CUDA (smaller ones are zero-padded)


@functools.cache
def _compiled():
    """flex_attention, compiled once (on CUDA; the CPU runs it eagerly)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=32)
def _causal_block_mask(t: int, s: int, keys: int, device: str):
    """The block mask of causal attention for t queries over s keys (query i at position s - t + i sees keys
    j <= s - t + i), plus, when keys > s, the sink key s that every query sees."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = s - t

    def causal(b, h, q_idx, kv_idx):
        return (kv_idx <= q_idx + offset) | (kv_idx >= s)

    return create_block_mask(causal, B=None, H=None, Q_LEN=t, KV_LEN=keys, device=device)


def flex_attention_scores(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float,
                          prior: torch.Tensor | None = None, sink: torch.Tensor | None = None,
                          alibi: torch.Tensor | None = None, softcap: float | None = None) -> torch.Tensor:
    """softmax(q k' scale + prior - m_h |pos_i - j| [+ the sink column]) v by FlexAttention; q [B, H, T, d], k, v
    [B, Hkv, S, d] (GQA: head h reads K/V head h // (H / Hkv)); prior None, [B|1, Hp, S] or [B|1, Hp, T, S] with Hp
    dividing H; sink None or [H] (the sink's logits); alibi None or the slopes m [H] (pos_i = S - T + i); softcap
    None or c > 0, q k' scale -> c tanh(q k' scale / c) before the rest. Causal needs S >= T. Returns [B, H, T, dv]."""
    from torch.nn.attention.flex_attention import flex_attention

    if q.device.type != "cuda" and torch.is_grad_enabled() and any(
            x is not None and x.requires_grad for x in (q, k, v, prior, sink, alibi)):
        raise ValueError(f"backend='flex' has no backward pass on {q.device.type} (FlexAttention's limit): run it "
                         f"on CUDA, under torch.no_grad(), or use backend='auto'")
    b, h, t, _ = q.shape
    s = k.shape[2]
    keys = s
    if sink is not None:  # key S: zero key and value, score s_h, seen by every query (the prior gets a 0 column)
        k, v = torch.nn.functional.pad(k, (0, 0, 0, 1)), torch.nn.functional.pad(v, (0, 0, 0, 1))
        prior = None if prior is None else torch.nn.functional.pad(prior, (0, 1))
        keys = s + 1
    div = 1 if prior is None else h // prior.shape[1]
    if prior is not None:
        prior = prior.expand(b, *prior.shape[1:])  # a batch of 1 broadcasts (a view)

    def score(x, bi, hi, qi, ki):
        if softcap is not None:  # c tanh(z / c) (arXiv:2408.00118), on q k' scale alone
            x = softcap * torch.tanh(x / softcap)
        if prior is not None:
            x = x + (prior[bi, hi // div, ki] if prior.dim() == 3 else prior[bi, hi // div, qi, ki]).to(x.dtype)
        if alibi is not None:  # -m_h |pos_i - j|: integer positions, exact before the one rounding to x's dtype
            x = x - alibi[hi].to(x.dtype) * (qi + (s - t) - ki).abs().to(x.dtype)
        if sink is not None:
            x = torch.where(ki == s, sink[hi].to(x.dtype), x)
        return x

    dv = v.shape[-1]
    # FlexAttention's CUDA kernels take head dimensions of 16 and up: zero columns change no q . k and only add
    # output columns, cut off below (the scale is given, so it stays 1/sqrt of the true d)
    if min(q.shape[-1], dv) < MIN_HEAD_DIM:  # (F.pad copies even a zero pad: only when needed)
        q, k = (torch.nn.functional.pad(x, (0, max(0, MIN_HEAD_DIM - x.shape[-1]))) for x in (q, k))
        v = torch.nn.functional.pad(v, (0, max(0, MIN_HEAD_DIM - dv)))
    mask = _causal_block_mask(t, s, keys, str(q.device)) if causal else None
    run = _compiled() if q.device.type == "cuda" else flex_attention
    modified = any(x is not None for x in (prior, sink, alibi, softcap))
    out = run(q, k, v, score_mod=score if modified else None, block_mask=mask, scale=scale,
              enable_gqa=k.shape[1] != h)
    return out[..., :dv]
