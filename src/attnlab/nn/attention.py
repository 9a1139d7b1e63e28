"""The attention layer: it holds the projections; the math is attnlab.functional.attention."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..attention_config import prefix_block, route, say_route
from ..config import AttentionConfig
from ..errors import ConfigError
from ..functional.attention import add_priors, attention, repeat_kv
from ..mechanisms.heads.functional import cascade_logits
from ..mechanisms.magnitude.names import GATE_ALIASES
from ..mechanisms.magnitude.reference import PRIOR_FLOOR
from ..mechanisms.magnitude.prefix_blocks import lowrank_prefix_attention
from ..functional.positional import alibi_slopes
from ..functional.scores import default_scale, qk_normalize
from .kv_cache import LayerKV
from ..mechanisms.heads.module import HeadMLP, MoHRouter, TalkingHeads
from ..mechanisms.magnitude.module import MagnitudeGate
from ..mechanisms.normalizers import normalizer_fn
from ..mechanisms.gated.module import OutputGate
from ..mechanisms.sink.module import AttentionSink
from ..mechanisms.ssmax.module import ScalableSoftmax
from ..mechanisms.selective.functional import select_logits
from ..mechanisms.differential.module import DifferentialHeads, halves, whole
from ..mechanisms.projections.module import LatentKV, kv_cache_per_token, make_projection, resolve_latent, resolve_rank


class LayerOutput(NamedTuple):
    """What one attention layer computes (:meth:`Attention.run`): everything it hands on is returned, nothing is kept.

    y [B, T, n_embd]; weights [B, n_head, T, S] when asked for, else None; logits: CODA's a^l [B, H, T, S] for the
    next layer (None unless heads.mix="coda"); aux_loss: MoH's beta L_b in training (None otherwise), a graph tensor
    the model adds to its loss."""

    y: torch.Tensor
    weights: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    aux_loss: torch.Tensor | None = None


class Attention(nn.Module):
    """Multi-head self-attention over x [B, T, n_embd] (Vaswani et al. 2017), built from an AttentionConfig.

        q = x W_q,  k = x W_k,  v = x W_v       (n_kv_head K/V heads shared by n_head / n_kv_head queries each)
        y = concat_h(attention(q_h, k_g(h), v_g(h))) W_o
    With config.magnitude != "off", a MagnitudeGate of the (pre-RoPE) keys gates the values (Magnitude Attention write-up):
    v_j <- g_j v_j ("global", "causal"; the SDPA path stays), or p_ij <- p_ij g_ij ("prefix"; explicit path, or
    with the low-rank solver attnlab.mechanisms.magnitude.prefix_blocks's blocks, which never build the [T, T] gate);
    with magnitude_apply="logits" the weights are a prior inside the softmax instead, z_ij + log max(w_ij, floor)
    (every form; SDPA with a float mask).
    Q/K/V may be x itself, identity-initialised or residual (Boneless write-up; attnlab.mechanisms.projections.module), low rank, or K, V
    rebuilt from one latent per token (MLA: attribute kv_latent instead of k_proj, v_proj); out_proj=False drops W_o.
    qk_norm != "off": logits g cos(q_h, k_h) / T (Henry et al. 2020), g a float or the parameter qk_gain.
    output_gate: each head's output o_h times sigmoid(x W_g)_h before W_o (Qiu et al. 2025, attnlab.mechanisms.gated);
    sink: one more zero-valued key with a learned logit s_h per head (attnlab.mechanisms.sink).
    heads.mix: "talking" mixes the logits and the weights across heads (Shazeer et al. 2020); "moh" weights head h of
    token t by a router's g_th before W_o, y = concat_h(g_h o_h) W_o (Jin et al. 2024); "coda" makes the logits a
    cascade through the layers (Zheng et al. 2021; attnlab.mechanisms.heads.functional.cascade_logits): ``layer`` (the block's
    index) > 0 gets the head MLP f_l, and :meth:`run` takes the previous layer's logits and returns its own.
    selective=True: softmax(z_hij - F_ij), F the ReLU logits of head 0 summed over the earlier queries
    (Leviathan et al. 2024; attnlab.mechanisms.selective), through ``logit_fn`` on the explicit path; no K/V cache.
    differential: each head's weights are softmax(Q1 K1' s) - lambda softmax(Q2 K2' s) over its query's and key's halves
    (RoPE rotates each half), its output (1 - lambda_init) RMSNorm(.) (Ye et al. 2024; attnlab.mechanisms.differential).
    alibi: softmax(z_ij - m_h |i - j|), fixed slopes m_h per head (Press et al. 2022, arXiv:2108.12409), a per-(i, j)
    logit prior added to any other.
    State is passed, not kept: :meth:`run` returns the layer's auxiliary outputs (:class:`LayerOutput`).
    """

    def __init__(self, config: AttentionConfig, n_embd: int, layer: int = 0):
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
        config.check_sizes(n_embd)
        q_out, kv_out = self.n_head * self.head_dim, self.n_kv_head * self.head_dim  # = n_embd, n_kv_head * d

        p = config.projections

        def rank(mode: str, out: int) -> int | None:  # inner rank r of a learned W, or None (dense / no W)
            return None if mode == "identity" else resolve_rank(p.rank, p.rank_fraction, n_embd, out)

        self.q_proj = make_projection(p.q_mode, n_embd, q_out, bias, rank(p.q_mode, q_out))
        latent = resolve_latent(p.kv_latent, p.kv_latent_fraction, n_embd)
        if latent is not None:  # K, V = c W_uk', c W_uv' from one latent c per token (DeepSeek-V2)
            self.kv_latent = LatentKV(n_embd, latent, kv_out, bias)
        else:
            self.kv_latent = None
            for name, mode in (("k_proj", p.k_mode), ("v_proj", p.v_mode)):
                setattr(self, name, make_projection(mode, n_embd, kv_out, bias, rank(mode, kv_out)))
        self.out_proj = nn.Linear(q_out, n_embd, bias=bias) if p.out_proj else nn.Identity()
        self.qk_scale = config.qk_norm_gain(self.head_dim)  # g
        self.qk_gain = nn.Parameter(torch.tensor(float(self.qk_scale))) if config.qk_norm == "learned" else None
        self.resid_dropout = nn.Dropout(self.attn_dropout)
        self.magnitude = None if config.magnitude is None else MagnitudeGate(
            config.magnitude, n_heads=self.n_kv_head, head_dim=self.head_dim)
        heads = config.heads
        self.talking = TalkingHeads(self.n_head) if heads.mix == "talking" else None
        self.router = MoHRouter(n_embd, self.n_head, *heads.moh_sizes(self.n_head), heads.moh_balance) \
            if heads.mix == "moh" else None
        coda = heads.mix == "coda"
        self.head_mlp = HeadMLP(self.n_head) if coda and layer > 0 else None  # f_l; layer 1 has no a^(l-1)
        self.ssmax = ScalableSoftmax(self.n_head) if config.ssmax else None
        self.output_gate = OutputGate(n_embd, self.n_head, self.head_dim, bias) if config.output_gate else None
        self.sink = AttentionSink(self.n_head) if config.sink else None
        self.differential = DifferentialHeads(self.head_dim, layer) if config.differential else None
        if config.alibi:  # m_h, fixed (arXiv:2108.12409); a buffer, not a parameter, and not in the state dict
            self.register_buffer("alibi_slopes", alibi_slopes(self.n_head).float(), persistent=False)

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        """[B, T, n * head_dim] -> [B, n, T, head_dim]."""
        return x.unflatten(-1, (n, self.head_dim)).transpose(1, 2)

    @property
    def kv_cache_per_token(self) -> dict[str, int]:
        """Floats per token in a K/V inference cache for this layer: "cached" (d_c for MLA), "kv" (2 n_kv_head d)."""
        return kv_cache_per_token(self.config, self.n_head * self.head_dim)

    def _plain_qkv(self) -> list[nn.Linear] | None:
        """[W_q, W_k, W_v] when all three are plain nn.Linear layers with the same bias setting (no latent), so that
        one matmul with their stacked weights computes them; None otherwise."""
        if self.kv_latent is not None:
            return None
        mods = [self.q_proj, self.k_proj, self.v_proj]
        plain = all(isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward for m in mods)
        return mods if plain and len({m.bias is None for m in mods}) == 1 else None

    def project(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [B, n_head, T, d], k, v [B, n_kv_head, T, d] (before RoPE and QK-norm).

        Plain linear projections run as one matmul, [q k v] = x [W_q; W_k; W_v]' + [b_q b_k b_v], as nanoGPT's
        fused c_attn does: the same parameters (and state dict) as three layers, one GEMM instead of three."""
        mods = self._plain_qkv()
        if mods is not None:
            weight = torch.cat([m.weight for m in mods])
            bias = None if mods[0].bias is None else torch.cat([m.bias for m in mods])
            q, k, v = F.linear(x, weight, bias).split([m.out_features for m in mods], dim=-1)
        else:
            k, v = self.kv_latent(x) if self.kv_latent is not None else (self.k_proj(x), self.v_proj(x))
            q = self.q_proj(x)
        return self._heads(q, self.n_head), self._heads(k, self.n_kv_head), self._heads(v, self.n_kv_head)

    def _prefix_blocks(self, q, k, v, factors, scale, fused: bool):
        """o = lowrank_prefix_attention of q [B, H, T, d] over k, v and the gate's factors [B, Hkv, T, .] (K/V heads
        repeated to H), in blocks of attnlab.attention_config.prefix_block's size; or, when ``fused`` (the route
        "triton"), by the Triton kernels lowrank_prior_attention (the prior) or lowrank_gate_attention (the value
        gate), which read the K/V heads and the factors as they are."""
        phi, lam, c = factors
        gate = self.magnitude
        if fused:
            from ..functional import kernels

            if gate.apply_to == "logits":
                return kernels.lowrank_prior_attention(q, k, v, phi, lam, c, prior_floor=PRIOR_FLOOR, scale=scale)
            return kernels.lowrank_gate_attention(q, k, v, phi, lam, c, gate.beta, gate.gamma,
                                                  gate=GATE_ALIASES.get(gate.gate_form, gate.gate_form), scale=scale)
        n_rep = self.n_head // self.n_kv_head
        k, v, phi, c = (repeat_kv(x, n_rep) for x in (k, v, phi, c))
        lam = lam.repeat_interleave(n_rep, dim=1)  # [B, H, T], as repeat_kv orders the heads
        block = prefix_block(self.config, q.device.type)
        if gate.apply_to == "logits":  # softmax(z_ij + log max(M_ij, floor))
            return lowrank_prefix_attention(q, k, v, phi, lam, c, scale=scale, prior_floor=PRIOR_FLOOR, block=block)
        return lowrank_prefix_attention(q, k, v, phi, lam, c, gate.beta, gate.gamma, gate=gate.gate_form, scale=scale,
                                        block=block)

    def _differential(self, q, k, v, scale, logit_prior, alibi, path, return_weights):
        """Differential attention (Ye et al. 2024, arXiv:2410.05258): the maps A1 = softmax(Q1 K1' s), A2 =
        softmax(Q2 K2' s) of the heads' halves, s = 1/sqrt(d/2) by default, each one attention call (SDPA when the
        route allows), then (1 - lambda_init) RMSNorm(A1 V - lambda A2 V) per head. Weights: A1 - lambda A2."""
        cfg, (q1, q2), (k1, k2) = self.config, halves(q).unbind(2), halves(k).unbind(2)
        outs = [attention(qh, kh, v, causal=cfg.causal, scale=scale, temperature=cfg.temperature,
                          normalizer=cfg.normalizer, mask_form=cfg.mask_form, backend=path,
                          dropout_p=self.attn_dropout if self.training else 0.0, return_weights=return_weights,
                          logit_prior=logit_prior, alibi=alibi, softcap=cfg.softcap) for qh, kh in ((q1, k1), (q2, k2))]
        if not return_weights:
            return self.differential(*outs)
        (o1, w1), (o2, w2) = outs
        return self.differential(o1, o2), w1 - self.differential.lam().to(w2.dtype) * w2

    def forward(self, x: torch.Tensor, rope: nn.Module | None = None, return_weights: bool = False,
                kv: LayerKV | None = None, count_prior: torch.Tensor | None = None):
        """x [B, T, n_embd] -> [B, T, n_embd] (and the weights [B, n_head, T, S] when return_weights): :meth:`run`
        for a layer used on its own (no previous CODA layer; MoH's balance loss is left out)."""
        out = self.run(x, rope, return_weights=return_weights, kv=kv, count_prior=count_prior)
        return (out.y, out.weights) if return_weights else out.y

    def run(self, x: torch.Tensor, rope: nn.Module | None = None, *, return_weights: bool = False,
            kv: LayerKV | None = None, count_prior: torch.Tensor | None = None,
            previous_logits: torch.Tensor | None = None, head_mask: torch.Tensor | None = None) -> LayerOutput:
        """The layer on x [B, T, n_embd], with everything it hands on in a :class:`LayerOutput`.

        count_prior: -log c_ij [B, 1, T, T] of the sequence's token ids (attnlab.mechanisms.count_prior), required
        when config.count_prior (the GPT computes it once for all its layers) and ignored otherwise.
        kv: this layer's K/V cache (incremental decoding): x holds the T tokens after the kv.length cached ones;
        their keys and values are appended and the queries attend to all of them (causal variants without a
        magnitude gate; attnlab.nn.kv_cache).
        previous_logits: CODA's a^(l-1) of the layer before (None in the first layer).
        head_mask: xi [n_head], head h's output times xi_h before W_o (head knockout, Michel et al. 2019)."""
        cfg = self.config
        if cfg.count_prior and count_prior is None:
            raise ConfigError("attention.count_prior=true needs the token ids' count prior: pass count_prior="
                              "count_log_prior(idx) (attnlab.GPT does)")
        prefix = cfg.magnitude is not None and cfg.magnitude.form == "prefix"
        how = route(cfg, return_weights=return_weights, dropout=self.training and self.attn_dropout > 0,
                    device=x.device.type, dtype=str(x.dtype).removeprefix("torch."))
        if how.forced:
            say_route(how.forced)
        elif how.path == "triton":
            kernel = "prior_attention" if not prefix else (
                "lowrank_prior_attention" if cfg.magnitude.apply == "logits" else "lowrank_gate_attention")
            say_route(f"the triton path (attnlab.functional.kernels.{kernel}) on {x.device.type}, "
                      f"backend={cfg.backend!r}")
        elif how.path == "flex":
            say_route(f"the flex path (attnlab.functional.flex, FlexAttention) on {x.device.type}, backend='flex'")
        if kv is not None and not how.cacheable:
            raise ConfigError("a K/V cache is exact only for causal attention without a magnitude gate, count prior "
                              f"or selective attention, off backend 'triton' (this layer: causal={cfg.causal}, "
                              f"magnitude={cfg.magnitude!r}, count_prior={cfg.count_prior}, selective={cfg.selective}, "
                              f"backend={cfg.backend!r})")
        offset = 0 if kv is None else kv.length
        latent_cache = kv is not None and self.kv_latent is not None  # MLA caches c, not K and V
        if latent_cache:  # K, V of every cached position rebuilt from the latents c [B, S, d_c]
            c = kv.append_latent(self.kv_latent.latent(x))
            q = self._heads(self.q_proj(x), self.n_head)
            k, v = (self._heads(up(c), self.n_kv_head) for up in (self.kv_latent.up_k, self.kv_latent.up_v))
        else:
            q, k, v = self.project(x)
        value_gate = logit_prior = factors = logit_fn = None
        cascade = []  # CODA's a^l, filled by logit_fn on the explicit path
        if how.path == "prefix_blocks" or (how.path == "triton" and prefix):
            factors = self.magnitude.prefix_factors(k)  # (phi, lambda, c): M_ij = (1 - phi_j'c_i) / lambda_j
        elif self.magnitude is not None:  # keys before RoPE: clones of a token stay clones at every position
            g = self.magnitude(k).to(v.dtype)  # [B, Hkv, S] or, for "prefix", [B, Hkv, T, S]
            if cfg.magnitude.apply == "logits":
                logit_prior = g  # log max(w, floor): softmax(z + prior), p_ij ~ w_ij exp(z_ij)
            elif cfg.magnitude.form == "prefix":
                value_gate = g  # o_i = sum_j p_ij g_ij v_j
            else:
                v = v * g.unsqueeze(-1)  # Attn(Q, K, Gate o V)   (Magnitude Attention write-up, step 3)
        if cfg.count_prior:  # softmax(z_ij - log c_ij), added to a magnitude prior where there is one
            logit_prior = add_priors(logit_prior, count_prior.to(v.dtype), self.n_head)
        # softmax(z_ij - m_h |pos_i - j|) (ALiBi, arXiv:2108.12409): attention() adds it to any other prior, or
        # computes it inside FlexAttention's kernel
        alibi = self.alibi_slopes if cfg.alibi else None
        if rope is not None and self.differential is not None:  # each half of a head rotated on its own (d/2 wide)
            q, k = whole(rope(halves(q), offset)), whole(rope(halves(k), 0 if latent_cache else offset))
        elif rope is not None:
            q, k = rope(q, offset), rope(k, 0 if latent_cache else offset)
        scale = cfg.scale
        if cfg.qk_norm != "off":  # <g q/|q|, k/|k|> = g cos(q, k): the logit scale is g, folded into q
            q, k = qk_normalize(q, k, self.qk_scale if self.qk_gain is None else self.qk_gain)
            scale = 1.0
        if kv is not None and not latent_cache:
            k, v = kv.append(k, v)
        if self.ssmax is not None:  # SSMax: row i of the logits times s_h log n_i (arXiv:2501.19399), folded into q
            q = q * self.ssmax.query_scale(q.shape[-2], k.shape[-2], causal=cfg.causal, offset=offset, dtype=q.dtype)
        if cfg.heads.mix == "coda":  # a^l from s^l and a^(l-1) (noise in training only), kept for the next layer
            def logit_fn(scores):
                previous = previous_logits if self.head_mlp is not None else None
                cascade.append(cascade_logits(scores, previous, self.head_mlp,
                                              cfg.heads.coda_noise if self.training else 0.0))
                return cascade[-1]
        elif cfg.selective:  # softmax(z - F), F from head 0's ReLU logits of earlier queries (arXiv:2410.02703)
            logit_fn = select_logits
        if self.differential is not None:
            out = self._differential(q, k, v, scale, logit_prior, alibi, how.path, return_weights)
        elif factors is not None:
            out = self._prefix_blocks(q, k, v, factors, (default_scale(q.shape[-1]) if scale is None else scale)
                                      / cfg.temperature, fused=how.path == "triton")
        else:
            out = attention(
                q, k, v,
                causal=cfg.causal, scale=scale, temperature=cfg.temperature, kernel=cfg.kernel,
                normalizer=normalizer_fn(cfg.normalizer), mask_form=cfg.mask_form, backend=how.path,
                dropout_p=self.attn_dropout if self.training else 0.0, return_weights=return_weights,
                value_gate=value_gate, logit_prior=logit_prior,
                head_mix=None if self.talking is None else self.talking(),
                logit_fn=logit_fn, sink=None if self.sink is None else self.sink.logit, alibi=alibi,
                softcap=cfg.softcap,
            )
        out, weights = out if return_weights else (out, None)
        aux_loss = None
        if self.output_gate is not None:  # gated attention: o_h * sigmoid(x W_g)_h, before W_o (arXiv:2505.06708)
            out = out * self.output_gate(x).to(out.dtype)
        if self.router is not None:  # MoH: head h of token t weighted by g_th      [B, H, T, d] * [B, H, T, 1]
            gates, aux_loss = self.router(x)
            out = out * gates.transpose(1, 2).unsqueeze(-1)
        if head_mask is not None:  # head knockout: y = concat_h(xi_h o_h) W_o
            out = out * head_mask.to(out.dtype).view(1, -1, 1, 1)
        y = self.resid_dropout(self.out_proj(out.transpose(1, 2).flatten(-2)))
        return LayerOutput(y, weights, cascade[-1] if cascade else None, aux_loss)
