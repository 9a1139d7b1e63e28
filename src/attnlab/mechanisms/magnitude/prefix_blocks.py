"""Causal attention with the low-rank prefix magnitude gate, block by block, without any T x T matrix in memory.

The prefix form of the Magnitude Attention write-up gates value j as seen by query i by key j's weight inside query
i's prefix. With the
low-rank solver (:mod:`attnlab.mechanisms.magnitude.lowrank`) that weight has a closed form,

    M_ij = (1 - phi_j' c_i) / lambda_j = 1/lambda_j - c_i' (phi_j / lambda_j)        (j <= i)
    o_i  = sum_{j <= i} p_ij g(M_ij) v_j,   p_i = softmax_j(z_ij),  z_ij = s q_i' k_j      (Magnitude Attention write-up, step 3)

with g one of the gates of :func:`attnlab.mechanisms.magnitude.reference.gate`. The explicit path builds M, g(M), the
logits
and the weights as [T, T] matrices per head and keeps them all for the backward pass (1 GiB at T = 2048 for 8
heads). Here both passes run over blocks of queries, as flash attention does (Dao et al. 2022, arXiv:2205.14135):
block b = rows i0..i1-1 needs keys j < i1 only (the causal mask skips the rest: half of the T x T work), its
[block, i1] tiles live only inside the loop, and the backward pass recomputes them from q, k, v, phi, lambda, c
and the output (O(T (d + r)) memory). Gradients by hand, with a = p o g, D_i = do_i' o_i = sum_j a_ij do_i' v_j:

    dv_j  = sum_i a_ij do_i                  da_ij = do_i' v_j
    dz_ij = p_ij (g_ij da_ij - D_i)          dq_i = s sum_j dz_ij k_j,   dk_j = s sum_i dz_ij q_i
    dg_ij = p_ij da_ij  ->  dM_ij = g'(M_ij) dg_ij   (and dbeta, dgamma through the gate's pre-activation)
    dc_i  = -sum_j dM_ij phi_j / lambda_j,   d(phi_j / lambda_j) = -sum_i dM_ij c_i,   d(1/lambda_j) = sum_i dM_ij

With ``prior_floor`` the weights enter as a logit prior instead (the control for the write-up's argument against
shifting scores): p_i = softmax_j(z_ij + log max(M_ij, floor)), o_i = sum_j p_ij v_j, and dz_ij = p_ij (do_i' v_j - D_i),
dM_ij = dz_ij / M_ij where M_ij >= floor (0 below it), then dc, d(phi/lambda), d(1/lambda) as above.

tests/test_prefix_attention.py checks values and gradients against the explicit formula in float64.
"""

from __future__ import annotations

import torch

from .reference import GATE_ALIASES, GATES, gate, log_prior
from .fused import ieee_float32

__all__ = ["BLOCK", "lowrank_prefix_attention"]

BLOCK = 64  # queries per block by default (the layer passes attnlab.attention_config.prefix_block's choice; the
#   speed sweep behind it is in docs/studies/magnitude-long.md#speed and docs/speed.md)


def _tile(q, k, c_aug, key_aug, i0, i1, future, floor):
    """(p, m) of the query block i0..i1-1 against keys 0..i1-1: the softmax weights (causal mask applied; with the
    logit prior log max(M, floor) added when floor is not None) and M."""
    z = q[..., i0:i1, :] @ k[..., :i1, :].mT  # z_ij = s q_i' k_j
    z[..., i0:i1].masked_fill_(future[: i1 - i0, : i1 - i0], float("-inf"))  # j > i (the diagonal block only)
    m = c_aug[..., i0:i1, :] @ key_aug[..., :i1, :].mT  # M_ij = 1/lambda_j - c_i' phi_j/lambda_j
    if floor is not None:  # z_ij + log max(M_ij, floor)
        z = z.add_(log_prior(m, floor).to(z.dtype))
    return torch.softmax(z, dim=-1), m


class _LowrankPrefixAttention(torch.autograd.Function):
    """o = lowrank_prefix_attention(...) on c_aug = [c, 1] and key_aug = [-phi/lambda, 1/lambda], so that
    M = c_aug key_aug' is one matmul and (dc_aug, dkey_aug) = (dM key_aug, dM' c_aug) two more."""

    @staticmethod
    def forward(ctx, q, k, v, c_aug, key_aug, beta, gamma, form, floor, block):
        n = q.shape[-2]
        future = torch.ones(block, block, dtype=torch.bool, device=q.device).triu(1)
        out = torch.empty_like(v)
        for i0 in range(0, n, block):
            i1 = min(i0 + block, n)
            p, m = _tile(q, k, c_aug, key_aug, i0, i1, future, floor)
            if floor is not None:  # o_i = sum_j softmax_j(z_ij + log max(M_ij, floor)) v_j
                out[..., i0:i1, :] = p @ v[..., :i1, :]
                continue
            g = gate(m, beta, gamma, form)  # g_ij = g(M_ij)
            out[..., i0:i1, :] = p.mul_(g.to(p.dtype)) @ v[..., :i1, :]  # o_i = sum_j p_ij g_ij v_j
        ctx.save_for_backward(q, k, v, c_aug, key_aug, beta, gamma, out)
        ctx.form, ctx.floor, ctx.block = form, floor, block
        return out

    @staticmethod
    def backward(ctx, d_out):
        device = d_out.device.type  # autograd runs this outside the forward's contexts: enter them again
        with ieee_float32(device), torch.autocast(device, enabled=False):
            return _LowrankPrefixAttention._backward(ctx, d_out)

    @staticmethod
    def _backward(ctx, d_out):
        q, k, v, c_aug, key_aug, beta, gamma, out = ctx.saved_tensors
        n, form, floor, block = q.shape[-2], ctx.form, ctx.floor, ctx.block
        future = torch.ones(block, block, dtype=torch.bool, device=q.device).triu(1)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dc_aug, dkey_aug = torch.zeros_like(c_aug), torch.zeros_like(key_aug)
        d_beta, d_gamma = torch.zeros_like(beta), torch.zeros_like(gamma)
        big_d = (d_out * out).sum(-1, keepdim=True)  # D_i = do_i' o_i
        for i0 in range(0, n, block):
            i1 = min(i0 + block, n)
            p, m = _tile(q, k, c_aug, key_aug, i0, i1, future, floor)
            do = d_out[..., i0:i1, :]
            da = do @ v[..., :i1, :].mT  # da_ij = do_i' v_j
            if floor is not None:  # the prior: a = p, s_ij = z_ij + log max(M_ij, floor)
                dv[..., :i1, :] += p.mT @ do  # dv_j = sum_i p_ij do_i
                dz = da.sub_(big_d[..., i0:i1, :]).mul_(p)  # dz_ij = ds_ij = p_ij (do_i' v_j - D_i)
                dm = dz.to(m.dtype).div(m.clamp_min(floor)).mul_(m >= floor)  # 1/M above the floor, 0 below
            else:  # the gate: a = p o g
                g, x, passes = _gate(m, beta, gamma, form)
                dv[..., :i1, :] += (p * g.to(p.dtype)).mT @ do  # dv_j = sum_i a_ij do_i
                dz = (da * g.to(da.dtype)).sub_(big_d[..., i0:i1, :]).mul_(p)  # dz_ij = p_ij (g_ij da_ij - D_i)
                du = da.mul_(p).to(g.dtype)  # dg_ij = p_ij da_ij, then dL/du = dg f'(u)
                if form == "linear":
                    du.mul_(passes)
                else:
                    du.mul_(g).addcmul_(du, g, value=-1.0)  # sigmoid' = g (1 - g)
                d_gamma += du.sum()
                d_beta += (du * x).sum()
                dm = du.mul_(beta)  # dM_ij = dL/du beta (where the clamp passes M)
                if form == "clamp":
                    dm.mul_(passes)
            dq[..., i0:i1, :] = dz @ k[..., :i1, :]  # (the scale is folded into q; see lowrank_prefix_attention)
            dk[..., :i1, :] += dz.mT @ q[..., i0:i1, :]
            dc_aug[..., i0:i1, :] = dm @ key_aug[..., :i1, :]
            dkey_aug[..., :i1, :] += dm.mT @ c_aug[..., i0:i1, :]
        if floor is not None:
            d_beta = d_gamma = None  # the prior has no gate
        return dq, dk, dv, dc_aug, dkey_aug, d_beta, d_gamma, None, None, None


def _gate(m, beta, gamma, form):
    """(g, x, passes) for the backward pass: g = gate(M) (the one formula, attnlab.mechanisms.magnitude.reference),
    u = beta x + gamma its pre-activation with x = clamp(M, 0, 1) ("clamp") or M; passes: where the clamp passes
    dM ("clamp") or du ("linear", whose output clamp(u, 0, 1) is flat outside [0, 1])."""
    x = m.clamp(0.0, 1.0) if form == "clamp" else m
    g = gate(m, beta, gamma, form)
    if form == "clamp":
        return g, x, x == m
    if form == "linear":
        u = x * beta + gamma
        return g, x, (u >= 0) & (u <= 1)
    return g, x, None


def lowrank_prefix_attention(q, k, v, phi, lam, c, beta=1.0, gamma=0.0, *, gate: str = "clamp", scale: float,
                             prior_floor: float | None = None, block: int = BLOCK) -> torch.Tensor:
    """o [B, H, T, dv]: causal softmax attention with the low-rank prefix weights M_ij gating every value, or, with
    prior_floor, added to the logits as the prior log max(M_ij, prior_floor).

    q, k [B, H, T, d], v [B, H, T, dv] (K/V heads already repeated to H), scale s (logits z_ij = s q_i' k_j);
    phi [B, H, T, r], lam [B, H, T], c [B, H, T, r]: the low-rank solver's features, diagonal and prefix states
    (:func:`attnlab.mechanisms.magnitude.lowrank.lowrank_prefix`); beta, gamma and gate: the value gate
    (:func:`attnlab.mechanisms.magnitude.reference.gate`; not used with prior_floor). The same function as ``attention(q,
    k, v, causal=True, value_gate=gate(M))`` or ``attention(q, k, v, causal=True, logit_prior=log_prior(M,
    prior_floor))`` with M = ``prefix_weight_matrix_lowrank(phi, lam, c)`` (see the module docstring for how it
    differs). M and the gate are computed in the dtype of phi (float32 at least), the logits and the output in
    those of q and v (bfloat16 under autocast), outside autocast; on CUDA with IEEE float32 matmuls whatever the
    TF32 setting, as the gate's solves."""
    gate = GATE_ALIASES.get(gate, gate)
    if gate not in GATES:
        raise ValueError(f"gate={gate!r} is not allowed; choose one of: {', '.join(map(repr, GATES))}")
    if prior_floor is not None and not prior_floor > 0:
        raise ValueError(f"prior_floor={prior_floor!r} must be > 0 (the prior is log max(M, prior_floor))")
    if not (q.shape[-2] == k.shape[-2] == v.shape[-2] == phi.shape[-2] == lam.shape[-1] == c.shape[-2]):
        raise ValueError(f"lowrank_prefix_attention needs as many keys as queries (causal self-attention), got "
                         f"q {tuple(q.shape)}, k {tuple(k.shape)}, phi {tuple(phi.shape)}, c {tuple(c.shape)}")
    inv_lam = 1.0 / lam[..., None]
    key_aug = torch.cat([-phi * inv_lam, inv_lam], dim=-1)  # [-phi_j / lambda_j, 1 / lambda_j]
    c_aug = torch.cat([c, torch.ones_like(c[..., :1])], dim=-1)  # [c_i, 1]
    beta, gamma = (torch.as_tensor(x, dtype=phi.dtype, device=phi.device) for x in (beta, gamma))
    floor = None if prior_floor is None else float(prior_floor)
    with ieee_float32(q.device.type), torch.autocast(q.device.type, enabled=False):  # M in phi's dtype
        return _LowrankPrefixAttention.apply(q * scale, k, v, c_aug, key_aug, beta, gamma, gate, floor, int(block))
