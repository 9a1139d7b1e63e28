"""Float64 references written straight from the formulas, in numpy loops: independent of attnlab's torch code."""

from __future__ import annotations

import math

import numpy as np


def attention_ref(q, k, v, *, causal=False, scale=None, temperature=1.0, kernel="dot", normalizer="softmax",
                  mask_form="additive"):
    """o_i = sum_j p_ij v_j for every batch b and head h, one query row at a time.

    q [B, H, T, d], k/v [B, Hkv, S, d]; head h reads K/V head h // (H / Hkv).
    Returns (out [B, H, T, dv], weights [B, H, T, S]) as float64 numpy arrays.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    b_, h_, t_, d = q.shape
    s_ = k.shape[2]
    group = h_ // k.shape[1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    out = np.zeros((b_, h_, t_, v.shape[-1]))
    weights = np.zeros((b_, h_, t_, s_))
    for b in range(b_):
        for h in range(h_):
            kh, vh = k[b, h // group], v[b, h // group]
            for i in range(t_):
                if kernel == "dot":
                    z = np.array([q[b, h, i] @ kh[j] for j in range(s_)]) * scale / temperature
                else:  # Gaussian kernel exp(-||q-k||^2 / (2 sigma^2)), sigma^2 = T / scale
                    z = np.array([-np.sum((q[b, h, i] - kh[j]) ** 2) for j in range(s_)]) * scale / (2 * temperature)
                visible = np.arange(s_) <= i if causal else np.ones(s_, dtype=bool)
                if normalizer == "softmax":
                    if causal and mask_form == "renormalize":
                        a = np.exp(z - z.max())
                        a /= a.sum()  # A = softmax(z) over every key
                        p = np.where(visible, a, 0.0) / a[visible].sum()  # Mask(A)
                    else:
                        e = np.where(visible, np.exp(z - z[visible].max()), 0.0)
                        p = e / e.sum()
                else:
                    raw = z if kernel == "dot" else np.exp(z)
                    p = np.where(visible, raw, 0.0)
                weights[b, h, i] = p
                out[b, h, i] = p @ vh
    return out, weights
