"""The switches of one attention layer: :class:`AttentionConfig`.

Every field is an orthogonal, default-off switch: the defaults give GPT-2's causal multi-head softmax attention.
A registered variant (:mod:`attnlab.registry`) is a name for a preset of these fields. Fields left ``None`` are
filled from the model (``n_head``, ``bias``, ``dropout``) by :meth:`attnlab.config.GPTConfig.resolved_attention`.
New mechanisms arrive as new fields with defaults that keep today's behaviour. The allowed values of the math
switches are defined by the functions that compute them (:mod:`attnlab.functional`); this module only checks them.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from dataclasses import dataclass
from typing import NamedTuple

from .configio import from_dict
from .errors import ConfigError, check_choice, check_number, strict_fields
from .switches import BACKENDS, CAUSAL_NORMALIZERS, KERNELS, MASK_FORMS, MECHANISM_NORMALIZERS, NORMALIZERS, uses_sdpa
from .switches import TRITON_DTYPES
from .mechanisms.heads.config import FLAT_NAMES as HEAD_FLAT_NAMES
from .mechanisms.heads.config import HeadMixConfig
from .mechanisms.heads.config import fold_flat as fold_heads
from .mechanisms.heads.names import HEAD_MIXES, LOGIT_MIXES
from .mechanisms.magnitude.config import FLAT_NAMES as MAGNITUDE_FLAT_NAMES
from .mechanisms.magnitude.config import MagnitudeConfig, fold_flat
from .mechanisms.magnitude.names import FORMS as MAGNITUDE_FORMS
from .mechanisms.magnitude.names import LOWRANK
from .mechanisms.projections.config import FLAT_NAMES as PROJECTION_FLAT_NAMES
from .mechanisms.projections.config import ProjectionConfig
from .mechanisms.projections.config import fold_flat as fold_projections
from .mechanisms.projections.names import LEARNED_MODES
from .mechanisms.projections.names import MODES as PROJECTION_MODES

QK_NORMS = ("off", "fixed", "learned")


@strict_fields
@dataclass(frozen=True)
class AttentionConfig:
    """One attention layer. Defaults: causal multi-head softmax attention of q.k / sqrt(d) (Vaswani et al. 2017)."""

    n_head: int | None = None
    """Query heads; `None`: the model's `n_head` (filled in by `GPTConfig.resolved_attention`)."""
    n_kv_head: int | None = None
    """K/V heads: `None` (= n_head, MHA), 1 (MQA, Shazeer 2019) or another divisor of n_head (GQA, Ainslie et al. 2023); the softmax write-up."""
    bias: bool | None = None
    """Biases in the q/k/v/out projections; `None`: the model's `bias`."""
    dropout: float | None = None
    """Dropout on the attention weights; `None`: the model's `dropout`."""
    kernel: str = "dot"
    """`"dot"`: logits q.k s/T; `"rbf"`: logits -s ||q-k||^2/(2T), the Gaussian kernel with sigma^2 = T/s = T sqrt(d) (softmax write-up)."""
    normalizer: str = "softmax"
    """`"softmax"`: rows sum to 1; `"none"`: raw similarity weights, z for dot and exp(z) for rbf (Boneless write-up); `"softpick"`: ReLU(e^z - 1) / sum |e^z - 1|, rows sum to at most 1 (Zuhri et al. 2025, arXiv:2504.20966; attnlab.mechanisms.softpick); `"stickbreaking"`: each earlier key, nearest first, takes sigmoid(z) of what the nearer keys left, the rest on the query's own value (Tan et al. 2024, arXiv:2410.17980; attnlab.mechanisms.stick_breaking; causal only). softpick and stickbreaking need dot-product logits and the additive mask form; a logit prior (magnitude logits, count prior), SSMax and a float mask are softmax-only."""
    temperature: float = 1.0
    """T in softmax(z/T), any value > 0 (softmax write-up)."""
    scale: float | None = None
    """s in z = q.k s, any value > 0; `None`: 1/sqrt(head_dim)."""
    causal: bool = True
    """Mask the future: position i attends to positions <= i."""
    mask_form: str = "additive"
    """`"additive"`: -inf inside the softmax; `"renormalize"`: Mask(B) after it, zero the future and renormalise (masking write-up; the two are equal, tested)."""
    backend: str = "auto"
    """`"auto"`: `torch.nn.functional.scaled_dot_product_attention` whenever the options reduce to softmax(q k' s + mask) v (rbf included, by one extra coordinate), else the explicit formula, and on CUDA the Triton kernels for a per-key logit prior or the low-rank prefix form; `"sdpa"`: require SDPA; `"explicit"`; `"flex"`: FlexAttention with the logit prior and the sink inside its kernel (attnlab.functional.flex; compiled on CUDA; no backward on the CPU); `"triton"`: require the Triton kernels (attnlab.functional.kernels; causal dot-product softmax with no prior, a per-key prior or the low-rank prefix form)."""
    magnitude: MagnitudeConfig | None = None
    """Magnitude weights of the keys (the Magnitude Attention write-up): `None` (off), or a MagnitudeConfig table (form, apply, t, eps, kernel, solver, rank, chunk, block, cg_iters, gate, beta, gamma, allow_future_leak: the magnitude switches below). A form name (`"global"`, `"causal"`, `"prefix"`) stands for the table with that form; `"off"` for None. The flat keys of older configs (`magnitude_t`, ...) are folded in when a config is read."""
    projections: ProjectionConfig = ProjectionConfig()
    """How Q, K, V and W_o are made (the Boneless write-up's steps, low rank, MLA): a ProjectionConfig table (q_mode, k_mode, v_mode, out_proj, rank, rank_fraction, kv_latent, kv_latent_fraction: the projection switches below). The flat keys of older configs (`q_mode`, `rank_fraction`, ...) are folded in when a config is read."""
    qk_norm: str = "off"
    """`"fixed"` or `"learned"`: logits g cos(q, k)/T with q and k L2-normalised per head (Henry et al. 2020); g fixed, or one learned scalar per layer."""
    qk_norm_scale: float | None = None
    """g, or its initial value when learned; `None`: sqrt(head_dim), the logit q.k/sqrt(d) of unit-variance q, k at cos = 1."""
    heads: HeadMixConfig = HeadMixConfig()
    """How the heads combine (the masking write-up): a HeadMixConfig table (mix: `"concat"`, `"talking"`, `"moh"` or `"coda"`; coda_noise; moh_shared, moh_top_k, moh_balance: the head switches below). A mix name stands for the table with that mix. The flat keys of older configs (`head_mix`, `moh_top_k`, ...) are folded in when a config is read."""
    count_prior: bool = False
    """The duplicate-count prior: softmax(z_ij - log c_ij), c_ij the copies of token x_j among x_1..x_i, so m identical tokens share one token's mass (attnlab.mechanisms.count_prior.reference; the control for magnitude's logit prior, which does the same on exact duplicates). Reads the token ids: causal softmax in a GPT only; composes with a magnitude logit prior (the two add)."""
    ssmax: bool = False
    """Scalable-Softmax (Nakanishi 2025, arXiv:2501.19399): the logits of a query that sees n keys times s log n (n = its prefix length when causal), s learned per head from 0.43 (attnlab.mechanisms.ssmax). Applied by scaling the queries, so it keeps SDPA; needs softmax over dot-product logits; a logit prior (magnitude, count) is added unscaled."""
    output_gate: bool = False
    """Gated attention (Qiu et al. 2025, arXiv:2505.06708, its best form G1): o'_h = o_h * sigmoid(x W_g + b)_h, an elementwise, head-specific sigmoid gate of the layer's input token on each head's attention output, before W_o (attnlab.mechanisms.gated). W_g: n_embd -> n_head * head_dim, initialised and biased like the q projection, as in the authors' code. Reads only the current token, so it keeps SDPA and the K/V cache; composes with every other switch."""
    sink: bool = False
    """A learned attention-sink logit per head (GPT-OSS; the sink token of Xiao et al. 2023, arXiv:2309.17453): p_ij = exp(z_ij) / (exp(s_h) + sum_k exp(z_ik)), one extra key with logit s_h (learned, from 0) and a zero value, so a query can put mass on nothing (attnlab.mechanisms.sink). Keeps SDPA (a zero key with s_h in a float mask) and the K/V cache; needs dot-product softmax with the additive mask."""
    selective: bool = False
    """Selective attention (Leviathan, Kalman and Matias 2024, arXiv:2410.02703): softmax(z_hij - F_ij), F_ij = sum_{k < i} ReLU(z_0kj) over 0 < j < k, head 0's logits as selection scores accumulated over the earlier queries and subtracted from every head (attnlab.mechanisms.selective). Parameter-free; needs causal softmax over dot-product logits; explicit path, no K/V cache; not with heads.mix 'talking' or 'coda', which rewrite every head's logits too."""
    differential: bool = False
    """Differential attention (Ye et al. 2024, arXiv:2410.05258): each head's weights are softmax(Q1 K1' s) - lambda softmax(Q2 K2' s), Q1, Q2 (K1, K2) the two halves of the head's query (key), s = 1/sqrt(head_dim/2); lambda = exp(lq1.lk1) - exp(lq2.lk2) + lambda_init per layer, lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)); each head's output RMS-normalised and times 1 - lambda_init (attnlab.mechanisms.differential). Two SDPA calls, so it keeps the fused path and the K/V cache; RoPE rotates each half. Needs softmax over dot-product logits, heads.mix='concat', no magnitude table, qk_norm='off' and an even head_dim; composes with GQA, the count prior and ssmax (both maps)."""
    alibi: bool = False
    """ALiBi (Press, Smith and Lewis 2022, arXiv:2108.12409): -m_h |i - j| added to head h's logits, the slopes m_h = 2^(-8h/n) fixed per head (attnlab.functional.positional.alibi_slopes), in place of position embeddings. Set by the model's `pos_encoding = "alibi"` (leave it unset in a GPT); a per-(i, j) logit prior, so it keeps SDPA (a float mask) and the K/V cache and adds to a magnitude or count prior; needs normalizer='softmax'."""
    softcap: float | None = None
    """Logit soft-capping (Gemma 2, Team Gemma 2024, arXiv:2408.00118): z -> c tanh(z / c) on the kernel's logits (after the scale, temperature, QK-norm and SSMax), before any prior, mask or normaliser, so every logit stays inside (-c, c); `None`: off. No fused SDPA or Triton kernel computes it: the explicit path, or FlexAttention's score modifier (backend 'flex'); not with the low-rank prefix blocks."""

    def __post_init__(self):
        for name in ("n_head", "n_kv_head"):
            value = getattr(self, name)
            if value is not None:
                check_number(f"attention.{name}", value, low=1, integer=True)
        if self.bias is not None and not isinstance(self.bias, bool):
            raise ConfigError(f"attention.bias={self.bias!r} must be true, false or unset")
        if self.dropout is not None:
            check_number("attention.dropout", self.dropout, low=0.0, high=1.0)
            if self.dropout == 1.0:
                raise ConfigError("attention.dropout=1.0 would drop every weight; use a value in [0, 1)")
        check_choice("attention.kernel", self.kernel, KERNELS)
        check_choice("attention.normalizer", self.normalizer, NORMALIZERS)
        check_number("attention.temperature", self.temperature, low=0.0, low_open=True)
        if self.scale is not None:
            check_number("attention.scale", self.scale, low=0.0, low_open=True)
        if not isinstance(self.causal, bool):
            raise ConfigError(f"attention.causal={self.causal!r} must be true or false")
        check_choice("attention.mask_form", self.mask_form, MASK_FORMS)
        check_choice("attention.backend", self.backend, BACKENDS)
        self._check_normalizer()
        self._check_magnitude()
        self._check_projections()
        self._check_heads()
        if not isinstance(self.count_prior, bool):
            raise ConfigError(f"attention.count_prior={self.count_prior!r} must be true or false")
        if self.count_prior and not (self.causal and self.normalizer == "softmax"):
            raise ConfigError(f"attention.count_prior=true needs causal softmax attention (counts over each query's "
                              f"prefix, a prior inside the softmax); got causal={self.causal}, "
                              f"normalizer={self.normalizer!r}")
        if not isinstance(self.ssmax, bool):
            raise ConfigError(f"attention.ssmax={self.ssmax!r} must be true or false")
        if self.ssmax and not (self.normalizer == "softmax" and self.kernel == "dot"):
            raise ConfigError(f"attention.ssmax=true scales dot-product logits inside a softmax; got "
                              f"kernel={self.kernel!r}, normalizer={self.normalizer!r} (allowed: kernel='dot', "
                              f"normalizer='softmax')")
        for name in ("output_gate", "sink"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"attention.{name}={getattr(self, name)!r} must be true or false")
        if self.sink and not (self.kernel == "dot" and self.normalizer == "softmax" and self.mask_form == "additive"):
            raise ConfigError(f"attention.sink=true adds a key with logit s_h to a dot-product softmax; got "
                              f"kernel={self.kernel!r}, normalizer={self.normalizer!r}, mask_form={self.mask_form!r} "
                              f"(allowed: kernel='dot', normalizer='softmax', mask_form='additive')")
        self._check_selective()
        if self.softcap is not None:
            check_number("attention.softcap", self.softcap, low=0.0, low_open=True)
            if not math.isfinite(self.softcap):
                raise ConfigError(f"attention.softcap={self.softcap!r} must be finite (the cap c of c tanh(z / c)), "
                                  f"or unset for no cap")
        if not isinstance(self.alibi, bool):
            raise ConfigError(f"attention.alibi={self.alibi!r} must be true or false")
        if self.alibi and self.normalizer != "softmax":
            raise ConfigError(f"ALiBi (pos_encoding='alibi', attention.alibi=true) adds -m_h |i - j| to the logits "
                              f"inside a softmax; got normalizer={self.normalizer!r} (allowed: 'softmax')")
        if not isinstance(self.differential, bool):
            raise ConfigError(f"attention.differential={self.differential!r} must be true or false")
        if self.differential:
            self._check_differential()
        if self.backend == "sdpa" and route(self.replace(backend="auto")).path != "sdpa":
            extra = ", magnitude form 'prefix' (a per-(i, j) gate)" if _form(self) == "prefix" else ""  # on the values
            extra += f", heads.mix={self.heads.mix!r} (logits mixed across heads)" if self.heads.mix in LOGIT_MIXES \
                else ""
            extra += ", selective=true (head 0's selection subtracted at each (i, j))" if self.selective else ""
            extra += f", softcap={self.softcap} (c tanh(z / c) on the logits)" if self.softcap is not None else ""
            raise ConfigError(
                f"attention.backend='sdpa' cannot compute normalizer={self.normalizer!r}, "
                f"mask_form={self.mask_form!r}{extra}; use backend='auto' or 'explicit'"
            )
        if self.backend == "flex" and _flex_misfits(self):
            raise ConfigError(f"attention.backend='flex' cannot compute {', '.join(_flex_misfits(self))} (allowed: "
                              f"{FLEX_CONFIG}); use backend='auto', 'sdpa' or 'explicit'")
        if self.backend == "triton" and _triton_misfits(self):
            raise ConfigError(f"attention.backend='triton' cannot compute {', '.join(_triton_misfits(self))} (allowed: "
                              f"{TRITON_CONFIG}); use backend='auto', 'sdpa' or 'explicit'")
        if self.n_head is not None and self.n_kv_head is not None and self.n_head % self.n_kv_head:
            raise ConfigError(
                f"attention.n_head={self.n_head} is not divisible by attention.n_kv_head={self.n_kv_head}; "
                f"n_kv_head must divide n_head (n_kv_head=n_head: MHA, 1: MQA)"
            )

    def _check_selective(self) -> None:
        """Selective attention needs causal softmax over dot-product logits (ReLU of rbf logits, which are <= 0, is
        0: it would do nothing) and the logits of no other mechanism that rewrites every head."""
        if not isinstance(self.selective, bool):
            raise ConfigError(f"attention.selective={self.selective!r} must be true or false")
        if not self.selective:
            return
        if not (self.causal and self.normalizer == "softmax" and self.kernel == "dot"):
            raise ConfigError(f"attention.selective=true masks earlier tokens for later queries inside a causal "
                              f"softmax of dot-product logits; got causal={self.causal}, normalizer="
                              f"{self.normalizer!r}, kernel={self.kernel!r} (allowed: causal=true, "
                              f"normalizer='softmax', kernel='dot')")
        if self.heads.mix in LOGIT_MIXES:
            raise ConfigError(f"attention.selective=true with heads.mix={self.heads.mix!r}: both rewrite the logits "
                              f"of every head before the softmax; use heads.mix 'concat' or 'moh'")
    def _check_differential(self) -> None:
        """What differential attention needs of the rest of the layer: two softmax maps of dot-product logits on the
        half-heads, combined per head before W_o."""
        bad = [f"{name}={value!r}" for name, value, ok in (
            ("kernel", self.kernel, self.kernel == "dot"),
            ("normalizer", self.normalizer, self.normalizer == "softmax"),
            ("heads.mix", self.heads.mix, self.heads.mix == "concat"),
            ("magnitude", _form(self), self.magnitude is None),
            ("qk_norm", self.qk_norm, self.qk_norm == "off"),
            ("sink", self.sink, not self.sink),
            ("selective", self.selective, not self.selective)) if not ok]
        if bad:
            raise ConfigError(f"attention.differential=true subtracts two softmax maps of dot-product logits per head; "
                              f"got {', '.join(bad)} (allowed: kernel='dot', normalizer='softmax', heads.mix='concat', "
                              f"magnitude='off', qk_norm='off', sink=false, selective=false)")

    def _as_table(self, field: str, cls, name_field: str | None = None, names: tuple = ()):
        """Field ``field`` as its table, stored back on the (frozen) config: a ``cls`` as it is, a dict read by
        from_dict, or one of ``names`` standing for the table with that ``name_field`` (a form, a mix)."""
        value = getattr(self, field)
        if isinstance(value, str) and value in names:
            value = cls(**{name_field: value})
        elif isinstance(value, dict):
            value = from_dict(cls, value, where=f"attention.{field}")
        if not isinstance(value, cls):
            allowed = f"one of {', '.join(map(repr, names))} or " if names else ""
            raise ConfigError(f"attention.{field}={value!r} must be {allowed}a {cls.__name__} table")
        object.__setattr__(self, field, value)
        return value

    def _check_normalizer(self) -> None:
        """softpick and stickbreaking: on dot-product logits (rbf logits are <= 0, where softpick gives 0 everywhere
        and stick-breaking's break points sigmoid(z) stay <= 1/2), with the additive mask (renormalising after the
        normaliser would force rows to sum to 1); stickbreaking is causal only (the stick spans the earlier keys)."""
        if self.normalizer not in MECHANISM_NORMALIZERS:
            return
        where = f"attention.normalizer={self.normalizer!r}"
        if self.kernel != "dot":
            raise ConfigError(f"{where} needs kernel='dot' (rbf logits are <= 0); got kernel={self.kernel!r}")
        if self.mask_form != "additive":
            raise ConfigError(f"{where} needs mask_form='additive' (renormalising would force rows to sum to 1); "
                              f"got mask_form={self.mask_form!r}")
        if self.normalizer in CAUSAL_NORMALIZERS and not self.causal:
            raise ConfigError(f"{where} needs causal=true (the stick is broken over the keys before each query); "
                              f"got causal={self.causal}")

    def _check_magnitude(self) -> None:
        """The magnitude table (its own rules are MagnitudeConfig's) and what it needs of the rest of the layer."""
        if self.magnitude in (None, "off"):  # "off": the old default's name for no table
            object.__setattr__(self, "magnitude", None)
            return
        m = self._as_table("magnitude", MagnitudeConfig, "form", MAGNITUDE_FORMS)
        if m.apply == "logits" and self.normalizer != "softmax":
            raise ConfigError(f"attention.magnitude.apply='logits' adds a prior inside the softmax, but "
                              f"normalizer={self.normalizer!r}; use normalizer='softmax' or apply='values'")
        if m.form == "global" and self.causal and not m.allow_future_leak:
            raise ConfigError(
                "attention.magnitude.form='global' with causal=true leaks the future: mu_j is solved over all keys, "
                "so position i's gate sees keys after i; use form 'causal' or 'prefix' (exact prefix forms), "
                "causal=false, or allow_future_leak=true to reproduce the Magnitude Attention write-up as written"
            )
        if m.form == "prefix" and not self.causal:
            raise ConfigError(
                "attention.magnitude.form='prefix' gates key j by its weight inside query i's prefix (j <= i), which "
                "needs causal=true; use form 'global' for bidirectional attention"
            )

    def _check_heads(self) -> None:
        """The heads table (its own rules are HeadMixConfig's); MoH's sizes once n_head is known."""
        h = self._as_table("heads", HeadMixConfig, "mix", HEAD_MIXES)
        if h.mix == "moh" and self.n_head is not None:
            h.moh_sizes(self.n_head)

    def _check_projections(self) -> None:
        """The projections table (its own rules are ProjectionConfig's), QK-norm, and what needs the head counts."""
        p = self._as_table("projections", ProjectionConfig)
        check_choice("attention.qk_norm", self.qk_norm, QK_NORMS)
        if self.qk_norm_scale is not None:
            check_number("attention.qk_norm_scale", self.qk_norm_scale, low=0.0, low_open=True)
        if self.qk_norm == "off" and self.qk_norm_scale is not None:
            raise ConfigError(f"attention.qk_norm_scale={self.qk_norm_scale!r} needs qk_norm='fixed' or 'learned'")
        if self.qk_norm != "off" and self.scale is not None:
            raise ConfigError(f"attention.qk_norm={self.qk_norm!r} sets the logit scale g; use qk_norm_scale, not "
                              f"scale={self.scale!r}")
        if self.qk_norm != "off" and self.kernel == "rbf":
            raise ConfigError(f"attention.qk_norm={self.qk_norm!r} with kernel='rbf': on unit vectors the rbf "
                              f"weights equal the dot weights (softmax write-up); use kernel='dot'")
        grouped = self.n_head is not None and self.n_kv_head is not None and self.n_kv_head != self.n_head
        for name in ("k_mode", "v_mode"):
            if grouped and getattr(p, name) != "projected":
                raise ConfigError(
                    f"attention.projections.{name}={getattr(p, name)!r} needs K/V as wide as x, but "
                    f"n_kv_head={self.n_kv_head} < n_head={self.n_head} (GQA); use {name}='projected' or "
                    f"n_kv_head=n_head"
                )

    def check_sizes(self, n_embd: int) -> None:
        """Checks that need the width: an absolute rank must be below every factored projection's full rank; an even
        head_dim for differential attention (two halves per head)."""
        if self.differential and self.n_head is not None and (n_embd // self.n_head) % 2:
            raise ConfigError(f"attention.differential=true splits each head's query and key in two halves, but "
                              f"head_dim={n_embd // self.n_head} is odd; use an even n_embd / n_head")
        p = self.projections
        if p.rank is None or self.n_head is None:
            return
        kv_out = (self.n_kv_head or self.n_head) * (n_embd // self.n_head)
        outs = {"q": n_embd} if p.latent else {"q": n_embd, "k": kv_out, "v": kv_out}
        for name, out in outs.items():
            if getattr(p, f"{name}_mode") in LEARNED_MODES and p.rank >= min(n_embd, out):
                raise ConfigError(f"attention.projections.rank={p.rank} is not below the full rank {min(n_embd, out)} "
                                  f"of the {name} projection ({n_embd} -> {out}); use a smaller rank or rank_fraction")

    def qk_norm_gain(self, head_dim: int) -> float:
        """QK-norm's logit scale g (its initial value when learned): qk_norm_scale, or sqrt(head_dim) by default,
        the largest value of q.k / sqrt(d) when q and k have unit-variance entries (|q| |k| / sqrt(d) ~ sqrt(d))."""
        return head_dim ** 0.5 if self.qk_norm_scale is None else self.qk_norm_scale

    def replace(self, **changes) -> "AttentionConfig":
        return dataclasses.replace(self, **changes)

    @classmethod
    def migrate_dict(cls, data: dict, where: str = "attention") -> dict:
        """An older config's table in today's shape: the flat magnitude keys folded into the magnitude table
        (attnlab.configio.from_dict calls this before it checks the keys)."""
        return fold_projections(fold_heads(fold_flat(data, where)))

    @classmethod
    def migrate_key(cls, parts: list[str], raw: str) -> list[str]:
        """An override's dotted key in today's place: ``magnitude_t`` -> ``magnitude.t`` and ``moh_top_k`` ->
        ``heads.moh_top_k`` and ``q_mode`` -> ``projections.q_mode`` (every flat key of the three tables), ``magnitude=<form>`` -> ``magnitude.form`` and
        ``heads=<mix>`` -> ``heads.mix``, so that overrides compose in any order."""
        if parts[0] in MAGNITUDE_FLAT_NAMES:
            return ["magnitude", MAGNITUDE_FLAT_NAMES[parts[0]], *parts[1:]]
        if parts[0] in PROJECTION_FLAT_NAMES:
            return ["projections", *parts]
        if parts[0] in HEAD_FLAT_NAMES:
            return ["heads", HEAD_FLAT_NAMES[parts[0]], *parts[1:]]
        if parts == ["heads"] and raw.strip().strip("\"'") in HEAD_MIXES:
            return ["heads", "mix"]
        if parts == ["magnitude"] and raw.strip().strip("\"'") in MAGNITUDE_FORMS:
            return ["magnitude", "form"]
        return parts

    @classmethod
    def named_config(cls, field: str, name: str):
        """The table a name stands for in an override: a magnitude form -> MagnitudeConfig(form)."""
        if field == "magnitude" and name in MAGNITUDE_FORMS:
            return MagnitudeConfig(form=name)
        if field == "heads" and name in HEAD_MIXES:
            return HeadMixConfig(mix=name)
        raise ConfigError(f"attention.{field}={name!r} is a name, not a table; set the whole table")

    @classmethod
    def from_dict(cls, data: dict) -> "AttentionConfig":
        return from_dict(cls, data, where="attention")


class Route(NamedTuple):
    """How one attention layer computes, decided once by :func:`route`.

    path: "sdpa" (torch's fused scaled_dot_product_attention, masks and priors as a float mask), "explicit" (the
    formula step by step, [T, T] weights), "prefix_blocks" (the low-rank prefix magnitude form block by block,
    attnlab.mechanisms.magnitude.prefix_blocks: no [T, T] matrix kept) or "triton" (the fused kernels for causal
    softmax with a per-key log-prior or the low-rank prefix prior, attnlab.functional.kernels: no [T, T] matrix
    either) or "flex" (FlexAttention with the prior read inside its kernel, attnlab.functional.flex; backend
    "flex" only).
    forced: why a request took a slower path than the configuration's own (None when it did not).
    cacheable: whether a K/V cache gives exactly the full forward's output (causal, no magnitude weights, no count
    prior: those need the whole prefix at every token, attnlab.nn.kv_cache; no selective attention, whose penalty
    for a new query sums the selection scores of every earlier query; differential attention caches
    its keys and values like softmax attention, each map a softmax over the cached keys; not backend "triton",
    whose kernel takes as many keys as queries).
    """

    path: str
    forced: str | None
    cacheable: bool


ROUTES = ("sdpa", "explicit", "prefix_blocks", "triton", "flex")
GPU_MIN_BLOCK = 256  # magnitude.block=None on a device other than the CPU: at least this many queries per block
LOWRANK_KERNEL_MAX_RANK = 64  # attnlab.functional.kernels.lowrank.MAX_RANK (not imported: it needs triton)
FLEX_CONFIG = ("kernel='dot', normalizer='softmax', mask_form='additive', any magnitude form as a logit prior or a "
               "per-key value gate, count_prior, sink, ssmax, differential, alibi, softcap, no selective attention, "
               "heads.mix 'concat' or 'moh'")
TRITON_CONFIG = ("causal=true, kernel='dot', normalizer='softmax', mask_form='additive', magnitude 'off', a per-key "
                 "form ('causal', 'global') or the low-rank prefix form (form 'prefix', solver 'lowrank', rank <= 64; "
                 "the prior or the value gate), count_prior=false, sink=false, selective=false, heads.mix 'concat' or "
                 "'moh', differential=false, alibi=false, softcap unset")


def route(cfg: "AttentionConfig", *, return_weights: bool = False, dropout: bool = False, device: str | None = None,
          dtype: str | None = None) -> Route:
    """The one decision of how a layer with config ``cfg`` computes its attention.

    return_weights: the caller wants the [T, T] weights; dropout: attention dropout is active (training with
    dropout > 0). Either can force a slower path (the prefix blocks and the Triton kernel keep no weights and have
    no dropout; SDPA returns no weights); :func:`say_route` logs it once. device, dtype: the inputs' device type
    ("cuda", "cpu") and dtype name ("float32"), when known; "auto" picks the Triton kernel on "cuda" only.

    - "triton" for backend "triton", and for backend "auto" on CUDA, in float16, bfloat16 or float32, when Triton
      can run there (attnlab.functional.kernels.available) and the configuration is causal dot-product softmax with
      the additive mask and a per-key logit prior (magnitude form 'causal' or 'global' with apply='logits', the
      kernel attnlab.functional.kernels.prior_attention) or the low-rank prefix form (form 'prefix', solver
      'lowrank', rank <= 64: attnlab.functional.kernels.lowrank_prior_attention for the prior,
      lowrank_gate_attention for the value gate) and nothing the kernels do not compute (:data:`TRITON_CONFIG`);
    - "prefix_blocks" for the prefix magnitude form with the low-rank solver inside causal dot-product softmax with
      the additive mask, no head mixing inside the softmax, no count prior, no sink, no selective attention, no ALiBi, no
      softcap and backend "auto";
    - "flex" for backend "flex" (FlexAttention; the configurations of :data:`FLEX_CONFIG`);
    - else "sdpa" whenever the options reduce to softmax(q k' s + mask) v (attnlab.functional.attention.uses_sdpa:
      a per-key magnitude gate on v and any logit prior keep it; the per-(i, j) value gate, logits mixed across
      heads, selective attention's penalty from head 0 and a softcap do not) and backend is not "explicit";
    - else "explicit".
    """
    logit_mix = cfg.heads.mix in LOGIT_MIXES
    m = cfg.magnitude
    blocks = (_form(cfg) == "prefix" and m.solver == LOWRANK and not cfg.count_prior and not cfg.sink and cfg.causal
              and cfg.kernel == "dot" and cfg.normalizer == "softmax" and cfg.mask_form == "additive"
              and cfg.backend == "auto" and not logit_mix and not cfg.selective and not cfg.alibi
              and cfg.softcap is None)
    value_gate = _form(cfg) == "prefix" and m.apply == "values"
    reducible = uses_sdpa(normalizer=cfg.normalizer, causal=cfg.causal, mask_form=cfg.mask_form,
                          value_gate=value_gate, head_mix=logit_mix or cfg.selective, softcap=cfg.softcap is not None)
    fused = m is not None and ((m.apply == "logits" and m.form != "prefix") or _lowrank_kernel(cfg))
    dtype_fits = dtype is None or dtype in TRITON_DTYPES
    triton = cfg.backend == "triton" or (
        cfg.backend == "auto" and device == "cuda" and fused and dtype_fits and not _triton_misfits(cfg)
        and _triton_available())
    general = "sdpa" if reducible and cfg.backend != "explicit" and not return_weights else "explicit"
    own = "flex" if cfg.backend == "flex" else "triton" if triton else "prefix_blocks" if blocks else (
        "sdpa" if reducible and cfg.backend != "explicit" else "explicit")
    reasons = []
    if return_weights and own != "explicit":
        reasons.append("the weights were requested")
    if dropout and own in ("prefix_blocks", "triton", "flex"):
        reasons.append("attention dropout is on")
    if cfg.backend == "triton" and not dtype_fits:
        reasons.append(f"the inputs are {dtype} (allowed: {', '.join(TRITON_DTYPES)})")
    path = general if reasons else own
    forced = None if not reasons else f"{' and '.join(reasons)}: the {own} path gives way to the {path} one"
    if reasons and cfg.backend in ("sdpa", "triton", "flex"):
        raise ConfigError(f"attention.backend={cfg.backend!r} cannot compute this request ({' and '.join(reasons)}); "
                          f"use backend='auto' or 'explicit'")
    cacheable = cfg.causal and m is None and not cfg.count_prior and not cfg.selective and cfg.backend != "triton"
    return Route(path, forced, cacheable)


def _triton_misfits(cfg: "AttentionConfig") -> list[str]:
    """The fields of cfg that keep it off the Triton kernel (causal dot-product softmax with the additive mask and a
    per-key log-prior or none, attnlab.functional.kernels.prior_attention), as "name=value" items."""
    return [item for item, ok in (
        ("causal=false", cfg.causal), (f"kernel={cfg.kernel!r}", cfg.kernel == "dot"),
        (f"normalizer={cfg.normalizer!r}", cfg.normalizer == "softmax"),
        (f"mask_form={cfg.mask_form!r}", cfg.mask_form == "additive"),
        ("magnitude form 'prefix' with a solver other than 'lowrank' or rank > 64",
         _form(cfg) != "prefix" or _lowrank_kernel(cfg)),
        ("count_prior=true (per (i, j))", not cfg.count_prior), ("sink=true", not cfg.sink),
        ("selective=true", not cfg.selective), (f"heads.mix={cfg.heads.mix!r}", cfg.heads.mix not in LOGIT_MIXES),
        ("differential=true", not cfg.differential), ("alibi=true (per (i, j))", not cfg.alibi),
        (f"softcap={cfg.softcap}", cfg.softcap is None)) if not ok]


def _flex_misfits(cfg: "AttentionConfig") -> list[str]:
    """The fields of cfg that keep it off the FlexAttention backend (attnlab.functional.flex: dot-product softmax
    with the additive mask and a logit prior per key or per (i, j)), as "name=value" items."""
    return [item for item, ok in (
        (f"kernel={cfg.kernel!r}", cfg.kernel == "dot"), (f"normalizer={cfg.normalizer!r}", cfg.normalizer == "softmax"),
        (f"mask_form={cfg.mask_form!r}", cfg.mask_form == "additive"),
        ("magnitude form 'prefix' with apply='values' (a per-(i, j) value gate)",
         not (_form(cfg) == "prefix" and cfg.magnitude.apply == "values")),
        ("selective=true", not cfg.selective), (f"heads.mix={cfg.heads.mix!r}", cfg.heads.mix not in LOGIT_MIXES)) if not ok]


def _lowrank_kernel(cfg: "AttentionConfig") -> bool:
    """Whether cfg's magnitude gate is the low-rank prefix form that the Triton kernels compute: form 'prefix',
    solver 'lowrank' with rank <= 64, as the logit prior (attnlab.functional.kernels.lowrank_prior_attention) or the
    value gate (lowrank_gate_attention)."""
    m = cfg.magnitude
    return m is not None and m.form == "prefix" and m.solver == LOWRANK and m.rank <= LOWRANK_KERNEL_MAX_RANK


def _triton_available() -> bool:
    """Whether the Triton kernels can run (attnlab.functional.kernels.available; imported only when asked)."""
    from .functional.kernels import available
    return available()


@functools.cache
def say_route(forced: str) -> None:
    """Log a forced route once per process (the reason is the key)."""
    logging.getLogger("attnlab").info("attention: %s", forced)


def prefix_block(cfg: "AttentionConfig", device_type: str) -> int:
    """Queries per block on the "prefix_blocks" path: magnitude.block, or by default magnitude.chunk on the CPU
    and at least GPU_MIN_BLOCK elsewhere (docs/speed.md has the chunk sweep behind the minimum)."""
    m = cfg.magnitude
    if m.block is not None:
        return m.block
    return m.chunk if device_type == "cpu" else max(m.chunk, GPU_MIN_BLOCK)


def _form(cfg: "AttentionConfig") -> str:
    """The magnitude form of cfg, or "off"."""
    return "off" if cfg.magnitude is None else cfg.magnitude.form


__all__ = ["AttentionConfig", "GPU_MIN_BLOCK", "TRITON_CONFIG", "HeadMixConfig", "LEARNED_MODES", "MagnitudeConfig", "PROJECTION_MODES", "ProjectionConfig", "QK_NORMS",
           "ROUTES", "Route", "prefix_block", "route", "say_route"]
