"""Scaled dot-product attention and its variants as one pure function.

    o_i = sum_j p_ij v_j,   p_i = softmax(z_i)  =  argmax_{p in simplex} <p, z_i> + T H(p)   (softmax write-up)

with z from a kernel (attnlab.functional.scores), causal masking in either form of the masking write-up
(attnlab.functional.masks), and grouped K/V heads (MHA / GQA / MQA, the softmax write-up). Whenever the options reduce
to softmax(q k' s + mask) v, the call goes to torch's fused scaled_dot_product_attention (SDPA); the
explicit path computes the same formula step by step and can return the weights. An additive logit prior
(the Magnitude Attention write-up's magnitude weights as a prior, p_ij proportional to w_ij exp(z_ij)) is one more float mask, so it keeps
SDPA (the causal -inf folded into the same mask). Causal softmax with a per-key prior (or none) can also go to the
Triton kernel attnlab.functional.kernels.prior_attention (backend "triton"; "auto" on CUDA with a per-key prior).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ..switches import BACKENDS, BUILTIN_NORMALIZERS, KERNELS, MASK_FORMS, NORMALIZERS, uses_sdpa  # noqa: F401
from ..switches import FLEX_ALLOWED, TRITON_ALLOWED, TRITON_DTYPES, TRITON_INSTALL, flex_misfits, triton_misfits
from .masks import causal_keep, mask_renormalize_softmax
from .positional import alibi_bias
from .scores import default_scale, dot_logits, rbf_augment, rbf_logits

_SDPA_HAS_GQA = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 5)  # enable_gqa arrived in 2.5


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, Hkv, S, d] -> [B, Hkv * n_rep, S, d]: query head h uses K/V head h // n_rep (GQA; MQA when Hkv = 1)."""
    return x if n_rep == 1 else x.repeat_interleave(n_rep, dim=1)


def add_priors(a: torch.Tensor | None, b: torch.Tensor, n_head: int) -> torch.Tensor:
    """a + b for two additive logit priors, each [B|1, heads, S] (per key) or [B|1, heads, T, S] (per (i, j)) with 1,
    n_kv_head or n_head heads: a per-key prior is read as the same row for every query, and K/V heads are repeated
    to n_head where the other prior has n_head of them (repeat_kv's order). a None: b."""
    if a is None:
        return b
    a, b = (x.unsqueeze(-2) if x.dim() == 3 else x for x in (a, b))
    if 1 != a.shape[1] != b.shape[1] != 1:
        a, b = (repeat_kv(x, n_head // x.shape[1]) for x in (a, b))
    return a + b


def mix_heads(x: torch.Tensor, mix: torch.Tensor) -> torch.Tensor:
    """Talking heads: y_g = sum_h x_h P[h, g] over the head axis 1 of x [B, H, T, S]; mix P [H, H]
    (attnlab.mechanisms.heads)."""
    return torch.einsum("bhts,hg->bgts", x, mix)


def sdpa_enable_gqa(device_type: str, dtype: torch.dtype) -> bool:
    """Whether grouped K/V heads go to SDPA as they are (enable_gqa=True) rather than repeated to n_head.

    On CUDA only the flash kernel takes enable_gqa, and it runs in float16 / bfloat16 only: a float32 call with
    enable_gqa would fall back to the slow math kernel, while repeated K/V keep the memory-efficient one. The CPU
    kernels take enable_gqa in every dtype (torch >= 2.5)."""
    if not _SDPA_HAS_GQA:
        return False
    return device_type != "cuda" or dtype in (torch.float16, torch.bfloat16)


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    temperature: float = 1.0,
    kernel: str = "dot",
    normalizer: str | Callable[[torch.Tensor, torch.Tensor | None], torch.Tensor] = "softmax",
    mask_form: str = "additive",
    dropout_p: float = 0.0,
    return_weights: bool = False,
    backend: str = "auto",
    value_gate: torch.Tensor | None = None,
    logit_prior: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    head_mix: tuple[torch.Tensor, torch.Tensor] | None = None,
    logit_fn=None,
    sink: torch.Tensor | None = None,
    alibi: torch.Tensor | None = None,
    softcap: float | None = None,
):
    """Attention over q [B, H, T, d], k [B, Hkv, S, d], v [B, Hkv, S, dv]; H must be a multiple of Hkv.

    kernel: "dot" (z = q.k scale / T) or "rbf" (z = -||q - k||^2 scale / (2T)).
    normalizer: "softmax" (p = softmax(z)) or "none" (p = the raw similarity: z for "dot", exp(z) for "rbf";
        causal masking then just zeroes the weights of future keys, as there is no normalisation to mask inside),
        or a function (z, keep) -> p of the logits [B, H, T, S] and the boolean keys-seen mask (None: all seen) that
        replaces the softmax on the explicit path: softpick or stick-breaking (attnlab.mechanisms.normalizers maps
        AttentionConfig's names "softpick" and "stickbreaking" to them; attnlab.nn.Attention passes them).
        mask_form and a float attn_mask or logit_prior apply to softmax only.
    mask_form: "additive" (-inf inside the softmax) or "renormalize" (Mask(softmax(z)) of the masking write-up).
    dropout_p: dropout on the weights (pass 0 at evaluation).
    value_gate: optional [B, H or Hkv, T, S] gate g_ij on value j as seen by query i: o_i = sum_j p_ij g_ij v_j
        (the Magnitude Attention write-up's per-(i, j) prefix magnitude gate); explicit path only. The returned weights are p, ungated.
    logit_prior: optional additive prior on the logits, per key [B, H or Hkv, S] or per (i, j) [B, H or Hkv, T, S]:
        p_i = softmax(z_i + prior_i), i.e. p_ij proportional to exp(prior_ij) exp(z_ij) (the Magnitude Attention write-up's magnitude
        weights as a prior, prior = log max(w, floor); attnlab.mechanisms.magnitude.reference.log_prior). Softmax only; on
        SDPA it is the float attn_mask, with the causal -inf folded in (gradients flow into it).
    attn_mask: optional mask broadcastable to [B, H, T, S], e.g. padding: boolean (True where query i may see key
        j) or float (added to the logits; -inf hides a key; softmax only). It combines with `causal` (with the
        renormalize form, the mask hides keys inside the softmax and the causal mask renormalises after it). A
        query that sees no key at all gets weights 0 and output 0, as SDPA gives.
    head_mix: talking heads (Shazeer et al. 2020; attnlab.mechanisms.heads.functional), (P_l, P_w) [H, H] each: the logits
        are mixed across heads by P_l before the mask, prior and softmax, the weights by P_w after them (explicit
        path; the returned weights are the mixed ones, those that multiply v).
    logit_fn: optional z -> z' applied to the kernel's logits [B, H, T, S] before any mask or prior (explicit path;
        e.g. CODA's cascade, attnlab.mechanisms.heads.functional.cascade_logits; selective attention,
        attnlab.mechanisms.selective.functional.select_logits, which applies the causal mask itself).
    sink: optional sink logits s [H] (attnlab.mechanisms.sink): one more key with logit s_h and a zero value that
        every query sees, p_ij = exp(z_ij) / (exp(s_h) + sum_k exp(z_ik)); dot-product softmax with the additive
        mask only (the rbf path's logits are exact only up to a per-row constant, which s_h would not share). The
        returned weights leave the sink's column out (rows sum to < 1).
    alibi: optional ALiBi slopes m [H] (Press et al. 2022, arXiv:2108.12409; attnlab.functional.positional): the
        per-(i, j) prior -m_h |pos_i - j|, pos_i = S - T + i, added to the logits like logit_prior (softmax only).
        On backend "flex" it is computed inside the kernel from the positions (no [H, T, S] tensor); on the others
        it is alibi_bias(m, T, S), joined to logit_prior.
    softcap: optional cap c > 0: the kernel's logits become c tanh(z / c) (Gemma 2, Team Gemma 2024,
        arXiv:2408.00118), before logit_fn, head_mix, any prior or mask and the normalizer; the explicit path (SDPA
        and the Triton kernel have no hook for it) or backend "flex" (inside its score modifier).
    backend: "auto" (SDPA whenever the options reduce to it, else the explicit path; on CUDA, causal softmax with a
        per-key logit_prior [B, H or Hkv, S] that fits the Triton kernel goes to it), "sdpa", "explicit", or
        "triton": attnlab.functional.kernels.prior_attention, causal dot-product softmax with the additive mask, a
        per-key prior or none, as many keys as queries, values as wide as keys, float16 / bfloat16 / float32, no
        attn_mask, value_gate, head_mix, logit_fn, sink, dropout or weights (anything else is a one-line error);
        "flex": attnlab.functional.flex (FlexAttention: dot-product softmax with the additive mask, causal or not, a
        logit_prior per key or per (i, j), a sink, ALiBi, GQA, a K/V cache; compiled on CUDA; no weights, dropout,
        attn_mask, value_gate, head_mix or logit_fn; no backward on the CPU).
    causal with more keys than queries (S > T, decoding with a K/V cache): query i sits at position S - T + i and
    sees keys j <= S - T + i (attnlab.functional.masks.causal_keep).
    Returns the output [B, H, T, dv], or (output, weights [B, H, T, S]) when return_weights.
    """
    b, h, t, d = q.shape
    h_kv, s = k.shape[1], k.shape[2]
    if h % h_kv:
        raise ValueError(f"query heads ({h}) must be a multiple of key/value heads ({h_kv})")
    if causal and s < t:
        raise ValueError(f"causal attention needs at least as many keys as queries, got {t} queries and {s} keys")
    if isinstance(normalizer, str) and normalizer not in BUILTIN_NORMALIZERS:
        raise ValueError(f"normalizer={normalizer!r}: attention() computes {' and '.join(BUILTIN_NORMALIZERS)} "
                         f"itself; pass the function for the others (attnlab.mechanisms.normalizers.normalizer_fn)")
    scale = default_scale(d) if scale is None else scale

    if value_gate is not None and (value_gate.shape[-2:] != (t, s) or h % value_gate.shape[1]):
        raise ValueError(f"value_gate must have shape [B, H or Hkv, {t}, {s}], got {tuple(value_gate.shape)}")
    if logit_prior is not None:
        if normalizer != "softmax":
            raise ValueError(f"logit_prior needs normalizer='softmax', got {normalizer!r} (no softmax to shift)")
        if logit_prior.shape[-1] != s or logit_prior.dim() not in (3, 4) or h % logit_prior.shape[1] or (
                logit_prior.dim() == 4 and logit_prior.shape[-2] != t):
            raise ValueError(f"logit_prior must have shape [B, H or Hkv, {s}] or [B, H or Hkv, {t}, {s}], "
                             f"got {tuple(logit_prior.shape)}")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}; allowed: {', '.join(map(repr, BACKENDS))}")
    if softcap is not None and not (isinstance(softcap, (int, float)) and not isinstance(softcap, bool)
                                    and 0 < softcap < float("inf")):
        raise ValueError(f"softcap={softcap!r}; allowed: a finite number > 0 (the cap c of c tanh(z / c)) or None")
    if alibi is not None:
        if normalizer != "softmax" or alibi.shape != (h,):
            raise ValueError(f"alibi needs normalizer='softmax' and slopes of shape [{h}]; got normalizer="
                             f"{normalizer!r}, shape {tuple(alibi.shape)}")
        if backend != "flex":  # -m_h |pos_i - j| as one more per-(i, j) prior [1, H, T, S]
            logit_prior = add_priors(logit_prior, alibi_bias(alibi, t, s).to(q.dtype).unsqueeze(0), h)
            alibi = None
    if backend == "triton" or (backend == "auto" and q.device.type == "cuda" and logit_prior is not None
                               and logit_prior.dim() == 3):
        misfits = triton_misfits(causal=causal, kernel=kernel, normalizer=normalizer, mask_form=mask_form,
                                 return_weights=return_weights, dropout=dropout_p > 0.0,
                                 value_gate=value_gate is not None, head_mix=head_mix is not None or logit_fn is not None,
                                 sink=sink is not None, pair_prior=logit_prior is not None and logit_prior.dim() == 4,
                                 softcap=softcap is not None)
        misfits += ["an attn_mask"] if attn_mask is not None else []
        misfits += [f"{s} keys for {t} queries (a K/V cache)"] if s != t else []
        misfits += [f"values {v.shape[-1]} wide for keys {d} wide"] if v.shape[-1] != d else []
        misfits += [f"dtype {str(q.dtype).removeprefix('torch.')}"] if str(q.dtype).removeprefix("torch.") not in TRITON_DTYPES else []
        if backend == "triton":
            if misfits:
                raise ValueError(f"backend='triton' cannot compute {', '.join(misfits)}; it takes {TRITON_ALLOWED}, "
                                 f"in {', '.join(TRITON_DTYPES)}; use backend='auto', 'sdpa' or 'explicit'")
            _check_triton(q.device)
        if not misfits and _triton_runs():
            return _prior_kernel(q, k, v, logit_prior, scale / temperature)
    if sink is not None and (kernel != "dot" or normalizer != "softmax" or (causal and mask_form == "renormalize")
                             or sink.shape != (h,)):  # rbf: SDPA's logits are shifted per row, which s_h is not
        raise ValueError(f"sink needs kernel='dot', normalizer='softmax', the additive mask and shape [{h}]; got "
                         f"kernel={kernel!r}, normalizer={normalizer!r}, mask_form={mask_form!r}, "
                         f"shape {tuple(sink.shape)}")
    if backend == "flex":
        misfits = flex_misfits(kernel=kernel, normalizer=normalizer, mask_form=mask_form, return_weights=return_weights,
                               dropout=dropout_p > 0.0, value_gate=value_gate is not None,
                               head_mix=head_mix is not None or logit_fn is not None)
        misfits += ["an attn_mask"] if attn_mask is not None else []
        if misfits:
            raise ValueError(f"backend='flex' cannot compute {', '.join(misfits)}; it takes {FLEX_ALLOWED}; use "
                             f"backend='auto', 'sdpa' or 'explicit'")
        from .flex import flex_attention_scores

        return flex_attention_scores(q, k, v, causal=causal, scale=scale / temperature, prior=logit_prior, sink=sink,
                                     alibi=alibi, softcap=softcap)
    if logit_prior is not None:
        logit_prior = repeat_kv(logit_prior, h // logit_prior.shape[1])  # [B, H, S] or [B, H, T, S]
        logit_prior = logit_prior.unsqueeze(-2) if logit_prior.dim() == 3 else logit_prior  # [B, H, 1 or T, S]
    seen, bias = _split_mask(attn_mask, (b, h, t, s), normalizer)  # boolean / additive parts of attn_mask
    bias = logit_prior if bias is None else (bias if logit_prior is None else bias + logit_prior)
    # SDPA's is_causal covers the causal mask alone; a sink needs a float mask (its column holds s_h)
    full = causal and s == t and seen is None and bias is None and sink is None
    if head_mix is not None and any(m.shape != (h, h) for m in head_mix):
        raise ValueError(f"head_mix must be two [{h}, {h}] matrices, got {[tuple(m.shape) for m in head_mix]}")
    sdpa = uses_sdpa(normalizer=normalizer, causal=causal, mask_form=mask_form, return_weights=return_weights,
                     backend=backend, value_gate=value_gate is not None,
                     head_mix=head_mix is not None or logit_fn is not None, softcap=softcap is not None)
    keep = causal_keep(t, s, device=q.device) if causal and not (sdpa and full) else None  # [T, S], j <= S - T + i
    keep = seen if keep is None else (keep if seen is None else keep & seen)
    if sdpa:
        dv = v.shape[-1]
        if kernel == "rbf":
            q, k = rbf_augment(q, k)  # softmax(-||q-k||^2 s/2T) = softmax(<q',k'> s/T)
            v = F.pad(v, (0, q.shape[-1] - dv))  # fused CPU kernels need v as wide as q and k
        gqa = h != h_kv and sdpa_enable_gqa(q.device.type, q.dtype)
        if h != h_kv and not gqa:
            k, v = repeat_kv(k, h // h_kv), repeat_kv(v, h // h_kv)
        extra = {"enable_gqa": True} if gqa else {}
        mask = keep  # boolean [.., T, S], or None
        if bias is not None:  # softmax(z + prior + (-inf) U): one float mask [B, H, T, S]
            bias = bias.to(q.dtype)
            mask = bias.expand(*bias.shape[:-2], t, s) if keep is None else torch.where(keep, bias, float("-inf"))
        if sink is not None:
            k, v, mask = _sink_key(k, v, mask, sink.to(q.dtype), h, t, s)
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=full, dropout_p=dropout_p,
            scale=scale / temperature, **extra
        )
        return out[..., :dv] if out.shape[-1] != dv else out

    k, v = repeat_kv(k, h // h_kv), repeat_kv(v, h // h_kv)
    logits = (dot_logits if kernel == "dot" else rbf_logits)(q, k, scale, temperature)  # z_ij
    if softcap is not None:
        logits = softcap * torch.tanh(logits / softcap)  # c tanh(z_ij / c): |z_ij| < c (arXiv:2408.00118)
    if logit_fn is not None:
        logits = logit_fn(logits)
    if head_mix is not None:
        logits = mix_heads(logits, head_mix[0])  # L_g = sum_h J_h P_l[h, g]     (talking heads, before the softmax)
    if bias is not None:
        logits = logits + bias  # z_ij + log max(w, floor)_ij: p_ij proportional to w_ij exp(z_ij) (Magnitude Attention write-up)
    blind = None if seen is None else ~keep.any(-1, keepdim=True)  # queries that see no key: output 0, not 0/0
    if blind is not None:
        keep = keep | blind  # unmask those rows so no NaN enters the graph; their weights are zeroed below
    if normalizer == "softmax":
        if causal and mask_form == "renormalize":
            hidden = logits if seen is None else logits.masked_fill(~(seen | blind), float("-inf"))
            weights = mask_renormalize_softmax(hidden, keep)  # Mask(A), A = softmax(z)      (masking write-up, form 2)
        else:
            if keep is not None:
                logits = logits.masked_fill(~keep, float("-inf"))  # z + (-inf) U   (masking write-up, form 1)
            if sink is None:
                weights = torch.softmax(logits, dim=-1)  # p_ij = exp(z_ij) / sum_k exp(z_ik)
            else:  # p_ij = exp(z_ij) / (exp(s_h) + sum_k exp(z_ik)): softmax over [z_i, s_h], the sink column dropped
                column = sink.to(logits.dtype).view(1, h, 1, 1).expand(b, h, t, 1)
                weights = torch.softmax(torch.cat([logits, column], dim=-1), dim=-1)[..., :s]
    elif callable(normalizer):
        weights = normalizer(logits, keep)  # softpick, stick-breaking (attnlab.mechanisms.normalizers)
    else:
        weights = logits if kernel == "dot" else logits.exp()  # raw correlation / raw RBF kernel (Boneless write-up)
        if keep is not None:
            weights = weights.masked_fill(~keep, 0.0)
    if blind is not None:
        weights = weights.masked_fill(blind, 0.0)
    if head_mix is not None:
        weights = mix_heads(weights, head_mix[1])  # U_g = sum_h W_h P_w[h, g]  (talking heads, after it)
    if dropout_p > 0.0:
        weights = F.dropout(weights, p=dropout_p)
    if value_gate is None:
        out = weights @ v  # o_i = sum_j p_ij v_j
    else:
        out = (weights * repeat_kv(value_gate, h // value_gate.shape[1])) @ v  # o_i = sum_j p_ij g_ij v_j (Magnitude Attention write-up)
    return (out, weights) if return_weights else out


def _triton_runs() -> bool:
    """Whether the Triton kernels can run here (attnlab.functional.kernels.available)."""
    from .kernels import available
    return available()


def _check_triton(device: torch.device) -> None:
    """A one-line error when backend='triton' cannot run on ``device``: triton missing, or neither CUDA nor
    Triton's CPU interpreter."""
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        raise ValueError(f"backend='triton' needs triton, which is not installed: {TRITON_INSTALL}")
    if device.type != "cuda" and not _triton_runs():
        raise ValueError(f"backend='triton' runs on CUDA or under Triton's CPU interpreter (TRITON_INTERPRET=1 before "
                         f"triton is imported); the inputs are on {device.type} and the interpreter is off")


def _prior_kernel(q, k, v, prior, scale):
    """causal softmax(q k' scale + p_j) v by attnlab.functional.kernels.prior_attention; prior [B|1, Hp, S] or None,
    its heads repeated to H unless the kernel takes them as they are (1, Hkv or H)."""
    from .kernels.perkey import prior_attention

    h, h_kv = q.shape[1], k.shape[1]
    if prior is not None and prior.shape[1] not in (1, h_kv, h):
        prior = repeat_kv(prior, h // prior.shape[1])
    return prior_attention(q, k, v, prior, scale)


def _sink_key(k, v, mask, sink, h, t, s):
    """The sink as one more key on the SDPA path, exactly: a zero key (q . 0 = 0) whose mask entry is s_h gives the
    logit s_h, and its zero value adds nothing to o_i, so SDPA computes exp(z_ij) / (exp(s_h) + sum_k exp(z_ik)) v_j
    (attnlab.mechanisms.sink.reference). The float mask [B|1, H, T, S + 1]: ``mask``'s entries (boolean -> 0 or
    -inf, None -> 0) and s_h in the last column, which every query sees. k, v [B, Hk, S, d] gain a zero row."""
    k, v = F.pad(k, (0, 0, 0, 1)), F.pad(v, (0, 0, 0, 1))  # key and value S: zeros
    if mask is None:
        mask = k.new_zeros(1, 1, t, s)
    elif mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=k.dtype, device=k.device).masked_fill(~mask, float("-inf"))
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    mask = mask.expand(mask.shape[0], h, t, s)
    column = sink.view(1, h, 1, 1).expand(mask.shape[0], h, t, 1)  # z_iS = s_h
    return k, v, torch.cat([mask, column], dim=-1)


def _split_mask(attn_mask, shape, normalizer):
    """attn_mask -> (seen: boolean or None, bias: float or None), checked against [B, H, T, S].

    A float mask's -inf entries become hidden keys (seen False) and its finite entries the additive bias."""
    if attn_mask is None:
        return None, None
    if not isinstance(attn_mask, torch.Tensor) or not (attn_mask.dtype == torch.bool or attn_mask.is_floating_point()):
        raise ValueError(f"attn_mask must be a boolean or float tensor, got {type(attn_mask).__name__}"
                         f"{'' if not isinstance(attn_mask, torch.Tensor) else ' of ' + str(attn_mask.dtype)}")
    try:
        if torch.broadcast_shapes(attn_mask.shape, shape) != torch.Size(shape):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to [B, H, T, S] = "
                         f"{list(shape)}") from None
    attn_mask = attn_mask.reshape((1,) * (4 - attn_mask.dim()) + tuple(attn_mask.shape))  # [B|1, H|1, T|1, S|1]
    if attn_mask.dtype == torch.bool:
        return attn_mask, None
    if normalizer != "softmax":
        raise ValueError(f"a float attn_mask needs normalizer='softmax', got {normalizer!r}; pass a boolean mask")
    hidden = attn_mask == float("-inf")
    return ~hidden, attn_mask.masked_fill(hidden, 0.0)
