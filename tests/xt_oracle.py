"""x-transformers' Attention as an oracle for attnlab layers (tests/test_gated.py, tests/test_sink.py): build one,
and copy its weights into an attnlab Attention with the same shape."""

from __future__ import annotations

import torch
from x_transformers.x_transformers import Attention as XAttention

from attnlab import AttentionConfig
from attnlab.nn import Attention

N_EMBD, N_HEAD = 32, 4
HEAD_DIM = N_EMBD // N_HEAD


def twins(n_kv_head: int, causal: bool, **xt_options) -> tuple[XAttention, Attention, torch.Tensor]:
    """(x-transformers Attention, attnlab Attention, perm), float64, bias-free (x-transformers has no q/k/v/out biases),
    no positions, with the same weights (random, and the gate's and sink's drawn too, so they are not at their init).

    GQA: x-transformers' query head h' reads K/V head h' mod n_kv_head, attnlab's head h reads h // r (r = n_head /
    n_kv_head), so attnlab's head h takes x-transformers' head perm[h] = (h mod r) n_kv_head + h // r."""
    torch.manual_seed(3)
    # x-transformers takes its softmax in float32 whatever the inputs; the same softmax in the inputs' dtype keeps
    # the oracle float64 (custom_attn_fn replaces only that call; its sink column is concatenated before it)
    oracle = XAttention(dim=N_EMBD, dim_head=HEAD_DIM, heads=N_HEAD, kv_heads=n_kv_head, causal=causal,
                        custom_attn_fn=lambda sim: sim.softmax(dim=-1), **xt_options).double()
    ours = Attention(AttentionConfig(n_head=N_HEAD, n_kv_head=n_kv_head, bias=False, dropout=0.0, causal=causal,
                                     output_gate="gate_values" in xt_options,
                                     sink="head_learned_sink" in xt_options), N_EMBD).double()
    r = N_HEAD // n_kv_head
    perm = torch.tensor([(h % r) * n_kv_head + h // r for h in range(N_HEAD)])
    rows = (perm.view(-1, 1) * HEAD_DIM + torch.arange(HEAD_DIM)).flatten()  # x-transformers' rows of our heads
    with torch.no_grad():
        for p in oracle.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
        ours.q_proj.weight.copy_(oracle.to_q.weight[rows])
        ours.k_proj.weight.copy_(oracle.to_k.weight)
        ours.v_proj.weight.copy_(oracle.to_v.weight)
        ours.out_proj.weight.copy_(oracle.to_out.weight[:, rows])
        if ours.output_gate is not None:
            ours.output_gate.proj.weight.copy_(oracle.to_v_gate.weight[rows])
        if ours.sink is not None:
            ours.sink.logit.copy_(oracle.attend.head_attn_sink[perm])
    return oracle, ours, perm
