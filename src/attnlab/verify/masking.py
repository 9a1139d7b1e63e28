"""The masking write-up (Masking and positional encodings): the two masking forms, the sinusoidal table, permutation invariance.

Measured on attnlab's own code: attnlab.functional.attention with both mask forms, sinusoidal_table, and
attnlab.GPT with pos_encoding none / learned / sinusoidal (float64, eval mode, fixed seeds).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from ..config import GPTConfig
from ..functional import attention, causal_keep, sinusoidal_table
from ..model import GPT
from .ledger import check


@check("mask-forms", writeup="masking", claimed=0.0, relation="=", tolerance=1e-14, volatile=True,
       basis="float64 rounding of exp, log, division on values <= 1",
       claim="Adding -inf inside the softmax equals zeroing the future entries of softmax(z) and renormalising: "
             "max |difference| of weights and outputs (mask_form additive vs renormalize)")
def mask_forms(scale: float = 3.0, renormalise: bool = True) -> dict:
    """renormalise=False zeroes the future weights of softmax(z) without renormalising (a planted bug)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 24, 16, generator=g, dtype=torch.float64) for _ in range(3))
    q = q * scale  # logits of spread ~ 12: future keys often dominate the full-row softmax
    o_add, w_add = attention(q, k, v, causal=True, mask_form="additive", return_weights=True)
    if renormalise:
        o_ren, w_ren = attention(q, k, v, causal=True, mask_form="renormalize", return_weights=True)
    else:
        _, w_full = attention(q, k, v, causal=False, return_weights=True)
        w_ren = w_full.masked_fill(~causal_keep(24, 24), 0.0)
        o_ren = w_ren @ v
    dw, do = float((w_add - w_ren).abs().max()), float((o_add - o_ren).abs().max())
    return {"measured": max(dw, do), "details": {"max_abs_dW": dw, "max_abs_dO": do},
            "note": f"B=2, H=3, S=24, d=16; max|dW| = {dw:.1e}, max|dO| = {do:.1e}"}


@check("sinusoidal-formula", writeup="masking", claimed=0.0, relation="=", tolerance=1e-12, volatile=True,
       basis="float64 rounding of sin/cos at arguments <= 64",
       claim="Sinusoidal encodings p_{i,2k} = sin(i/phi_k), p_{i,2k+1} = cos(i/phi_k), phi_k = 10000^(2k/d_model): "
             "max |attnlab table - formula| (k counted from 0)")
def sinusoidal_formula(n: int = 64, d_model: int = 32) -> dict:
    table = sinusoidal_table(n, d_model, dtype=torch.float64).numpy()
    ref = np.empty((n, d_model))
    for i in range(n):
        for k in range(d_model // 2):
            phi = 10000.0 ** (2 * k / d_model)
            ref[i, 2 * k], ref[i, 2 * k + 1] = math.sin(i / phi), math.cos(i / phi)
    return {"measured": float(np.abs(table - ref).max()),
            "note": "the write-up writes k = 1..d_model/2, which would index dimension d_model; attnlab (and Vaswani et "
                    "al.) count k from 0"}


def _permutation_change(pos: str, n_layer: int, n_perms: int = 6, t: int = 12) -> dict:
    """max over query positions i and random permutations of tokens 0..i-1 of max|dlogits_i| / max|logits_i|.

    A GPT (d=32, 2 heads, float64, eval) on t distinct tokens; position i (0-based) sees tokens 0..i, and tokens
    0..i-1 are permuted (each permutation moves at least one token), token i and later ones stay.
    """
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = GPT(GPTConfig(vocab_size=64, block_size=16, n_layer=n_layer, n_head=2, n_embd=32,
                              pos_encoding=pos)).double().eval()
    g = torch.Generator().manual_seed(3)
    tokens = torch.randperm(64, generator=g)[:t]  # distinct tokens: a permutation really changes the sequence
    rows, where = [tokens], []
    for i in range(2, t):
        for _ in range(n_perms):
            perm = torch.randperm(i, generator=g)
            while bool((perm == torch.arange(i)).all()):
                perm = torch.randperm(i, generator=g)
            rows.append(torch.cat((tokens[:i][perm], tokens[i:])))
            where.append(i)
    with torch.no_grad():
        logits = model(torch.stack(rows))[0]
    worst = 0.0
    for r, i in enumerate(where, 1):
        ref = logits[0, i]
        worst = max(worst, float((logits[r, i] - ref).abs().max() / ref.abs().max()))
    return {"measured": worst, "details": {"positions": t, "permutations_per_position": n_perms,
                                           "pairs": len(where)}}


_PERM_SETUP = "; GPT n_embd=32, 2 heads, float64, 12 distinct tokens, 6 random permutations at each i"


@check("perm-none-1layer", writeup="masking", claimed=0.0, relation="=", tolerance=1e-12, volatile=True,
       basis="float64 rounding (sums in another order)",
       claim="Without positional encodings, causal output i is unchanged by any permutation of tokens 1..i-1 "
             "(one attention layer): max relative change of the logits at i")
def perm_none_1layer() -> dict:
    out = _permutation_change("none", 1)
    out["note"] = "1 layer" + _PERM_SETUP
    return out


@check("perm-learned", writeup="masking", claimed=0.0, label="0 (changes)", relation=">", tolerance=1e-9,
       basis="far above float64 rounding (1e-16)",
       claim="With learned positional encodings (GPT-2) output i changes under those permutations: max relative "
             "change of the logits at i (1 layer)")
def perm_learned() -> dict:
    out = _permutation_change("learned", 1)
    out["note"] = "1 layer, learned positions at initialisation (std 0.02, like the tokens)" + _PERM_SETUP
    return out


@check("perm-sinusoidal", writeup="masking", claimed=0.0, label="0 (changes)", relation=">", tolerance=1e-9,
       basis="far above float64 rounding (1e-16)",
       claim="With sinusoidal encodings output i changes under those permutations: max relative change of the "
             "logits at i (1 layer)")
def perm_sinusoidal() -> dict:
    out = _permutation_change("sinusoidal", 1)
    out["note"] = "1 layer" + _PERM_SETUP
    return out


@check("perm-none-2layer", writeup="masking", kind="obs", claimed=0.0, label="0 (changes)", relation=">", tolerance=1e-9,
       basis="far above float64 rounding (1e-16)",
       claim="[obs] The invariance is a one-layer fact: with 2 causal layers and no positions output i changes, "
             "since layer-1 outputs at j < i saw different prefixes (cf. Haviv et al. 2022): max relative change")
def perm_none_2layer() -> dict:
    out = _permutation_change("none", 2)
    out["note"] = "2 layers, no positional encoding" + _PERM_SETUP
    return out
