"""The variant registry: a name -> a preset of AttentionConfig switches, with a description and a source.

Adding a variant is one `register(...)` call here, its code (new AttentionConfig fields if needed), and its
test; the causal leak test picks up every registered name automatically.
"""

from __future__ import annotations

from dataclasses import dataclass

from .attention_config import AttentionConfig, HeadMixConfig, MagnitudeConfig, ProjectionConfig
from .errors import unknown_name
from .mechanisms.magnitude.names import EPS as LOWRANK_EPS
from .mechanisms.magnitude.names import PRIOR_FLOOR
from .mechanisms.magnitude.names import RANK as LOWRANK_RANK


@dataclass(frozen=True)
class Variant:
    name: str
    config: AttentionConfig
    description: str
    source: str
    notes: str = ""


_REGISTRY: dict[str, Variant] = {}


def register(name: str, description: str, source: str, *, notes: str = "", **fields) -> Variant:
    """Register ``name`` as AttentionConfig(**fields). Names are unique; notes: caveats, design choices."""
    if name in _REGISTRY:
        raise ValueError(f"variant {name!r} is already registered")
    variant = Variant(name, AttentionConfig(**fields), description, source, notes)
    _REGISTRY[name] = variant
    return variant


def variants() -> list[str]:
    """The registered variant names, in registration order."""
    return list(_REGISTRY)


def variant_info(name: str) -> Variant:
    """The registry entry for ``name``; an unknown name raises ConfigError listing the valid ones."""
    if name not in _REGISTRY:
        raise unknown_name("attention variant", name, _REGISTRY)
    return _REGISTRY[name]


def get_variant(name: str) -> AttentionConfig:
    """The AttentionConfig preset of ``name``."""
    return variant_info(name).config


register(
    "standard", "causal multi-head softmax attention, softmax(QK'/sqrt(d)) V (GPT-2)",
    "Vaswani et al. 2017, arXiv:1706.03762; the softmax write-up",
)
register(
    "gqa", "grouped-query attention: 2 K/V heads shared by groups of query heads",
    "Ainslie et al. 2023, arXiv:2305.13245; the softmax write-up", n_kv_head=2,
)
register(
    "mqa", "multi-query attention: one K/V head shared by all query heads",
    "Shazeer 2019, arXiv:1911.02150; the softmax write-up", n_kv_head=1,
)
register(
    "rbf", "Gaussian-kernel weights exp(-||q-k||^2 / 2 sigma^2), row-normalised, sigma^2 = T sqrt(d)",
    "softmax write-up (kernel view of softmax attention)", kernel="rbf",
)
register(
    "mask-renormalize", "causal mask as Mask(B): softmax over all keys, then zero the future and renormalise",
    "masking write-up, form 2", mask_form="renormalize",
)
register(
    "magnitude-causal", "magnitude-gated values, per key: g_j = gate(weight of key j inside its own prefix 1..j)",
    "Magnitude Attention write-up, causal form", magnitude=MagnitudeConfig("causal"),
    notes="exact w_j = y_j / L_jj from Z + eps I = L L', y = L^-1 1 (docs/magnitude.md, prefix identities); keeps the "
          "SDPA fast path. Not the write-up's global mu, which leaks the future in a causal model: that one is "
          "AttentionConfig(magnitude='global', causal=False), or MagnitudeConfig(allow_future_leak=True) to reproduce the write-up. "
          "A cluster of m clones gets gates of 1, 1/2, ..., 1/m (sum ~ ln m, not 1 unit): each key is judged "
          "by the keys before it only.",
)
register(
    "magnitude-prefix", "magnitude-gated values, per (i, j): g_ij = gate(weight of key j inside query i's prefix 1..i)",
    "Magnitude Attention write-up, exact prefix form", magnitude=MagnitudeConfig("prefix"),
    notes="exact M_ij = sum_{m=j..i} (L^-1)_mj y_m: row i is mu of the keys query i may see, so a cluster of m "
          "clones sums to m/(m+eps) ~ 1 unit as in the write-up; needs the explicit path (no SDPA), O(T^3) per head.",
)
register(
    "magnitude-causal-linear", "magnitude-gated values, per key, linear gate: g_j = clamp(beta w_j + gamma, 0, 1), w_j the "
    "weight of key j inside its own prefix 1..j",
    "Magnitude Attention write-up, causal form; the write-up's arithmetic 'the gate passes the weight through'",
    magnitude=MagnitudeConfig("causal", gate="linear"),
    notes="beta = 1, gamma = 0 at init: an isolated key passes whole, the causal form's clones pass 1, 1/2, ..., 1/m of "
          "their values (a harmonic number H_m ~ ln m of units in all). beta and gamma are learned; keeps SDPA.",
)
register(
    "magnitude-prefix-linear", "magnitude-gated values, per (i, j), linear gate: g_ij = clamp(beta M_ij + gamma, 0, 1), "
    "M_ij the weight of key j inside query i's prefix 1..i",
    "Magnitude Attention write-up, exact prefix form; the write-up's arithmetic 'the gate passes the weight through'",
    magnitude=MagnitudeConfig("prefix", gate="linear"),
    notes="beta = 1, gamma = 0 at init: m exact clones pass 1/(m + eps) each, m/(m + eps) ~ 1 unit together, as the write-up "
          "computes; the explicit path (no SDPA), O(T^3) per head.",
)
register(
    "magnitude-causal-logits", "magnitude weights as a logit prior, per key: softmax(z_ij + log max(w_j, floor)), w_j "
    "the weight of key j inside its own prefix 1..j (no value gate)",
    "Magnitude Attention write-up, causal form; as a prior on the scores, the control for the write-up's argument",
    magnitude=MagnitudeConfig("causal", apply="logits"),
    notes=f"p_ij ~ max(w_j, {PRIOR_FLOOR:g}) exp(z_ij): what the magnitude write-up argues against ('methods that just shift attention "
          "scores'), so that the gate on the values can be compared with it. m exact clones get "
          "1, 1/2, ..., 1/m and count as H_m ~ ln m keys, not one. The prior is SDPA's float mask (causal -inf "
          "folded in); gate, beta and gamma are unused.",
)
register(
    "magnitude-prefix-logits", "magnitude weights as a logit prior, per (i, j): softmax(z_ij + log max(M_ij, floor)), "
    "M_ij the weight of key j inside query i's prefix 1..i (no value gate)",
    "Magnitude Attention write-up, exact prefix form; as a prior on the scores, the control for the write-up's "
    "argument", magnitude=MagnitudeConfig("prefix", apply="logits"),
    notes=f"p_ij ~ max(M_ij, {PRIOR_FLOOR:g}) exp(z_ij): m exact clones count as one key (m/(m+eps)), so in the write-up's example "
          "(one key with e^z = 20, 50 clones with e^z = 1) the unique key gets 20/21 instead of 20/70. Per-(i, j) "
          "float mask on SDPA (narrowly faster than the explicit path at T = 256 on CPU); O(T^3) per head for M.",
)
register(
    "magnitude-causal-lowrank", "magnitude-gated values, per key, low-rank solver: Z ~ Phi Phi' + D with Nystrom features "
    "against r = 32 learned landmarks per K/V head, every prefix solved chunk by chunk in O(T r^2); eps = 0.1",
    "Magnitude Attention write-up, causal form; Nystrom: Williams and Seeger 2001",
    magnitude=MagnitudeConfig("causal", solver="lowrank", rank=LOWRANK_RANK, eps=LOWRANK_EPS),
    notes="near-linear in T (the exact causal form is O(T^3) per head) and keeps SDPA; an approximation of "
          "magnitude-causal only where the landmarks sit among the keys and eps is large (docs/magnitude.md#the-low-rank-"
          "solver, docs/studies/magnitude-long.md): at eps = 1e-3 its weights of trained keys are off by as much as "
          "their size. Needs block_size >= r.",
)
register(
    "magnitude-prefix-logits-lowrank", "magnitude-prefix-logits with the low-rank solver: softmax(z_ij + log max(M_ij, "
    "floor)), M_ij from Phi Phi' + D against r = 32 learned landmarks per K/V head; eps = 0.1",
    "Magnitude Attention write-up, prefix form as a logit prior; Nystrom: Williams and Seeger 2001",
    magnitude=MagnitudeConfig("prefix", apply="logits", solver="lowrank", rank=LOWRANK_RANK, eps=LOWRANK_EPS),
    notes="M_ij = (1 - phi_j' c_i) / lambda_j, c_i the r-vector of query i's prefix (docs/magnitude.md#the-low-rank-"
          "solver): O(T r^2) for the solve, O(T^2 r) for M. The hijack experiment's low-rank row. Needs block_size >= r.",
)
# The Boneless write-up's six steps from "just correlation" to attention (step 4 is `standard`), then QK-norm, low rank, MLA.
register(
    "boneless-corr", "no parameters: y = (x x') x per head slice x_h, raw correlation weights (no softmax, no scale, "
    "no Q/K/V/output projections)",
    "Boneless write-up, step 1 (just correlation)", projections=ProjectionConfig("identity", "identity", "identity", out_proj=False),
    normalizer="none", scale=1.0,
    notes="with n_head heads, head h correlates and mixes its own slice x_h of x (n_head=1 is the write-up's (x x') x); "
          "causal masking zeroes the future weights. The output grows with T and |x|^3, as the write-up warns.",
)
register(
    "boneless-softmax", "no parameters: y = softmax(x x' / sqrt(d) + mask) x per head slice x_h",
    "Boneless write-up, step 2 (softmaxed correlation)", projections=ProjectionConfig("identity", "identity", "identity", out_proj=False),
    notes="scale 1/sqrt(head_dim) as in every softmax variant here (the write-up does not state one).",
)
register(
    "boneless-value",
    "softmax(x x' / sqrt(d) + mask) (x W_v) W_o: correlation of x itself mixes value-projected tokens",
    "Boneless write-up, step 3 (weighted sum over value-projected tokens)",
    projections=ProjectionConfig("identity", "identity"),
    notes="keeps the output projection: the write-up's step 4 then adds only W_q and W_k to reach `standard`.",
)
register(
    "identity-qk", "Q and K projections initialised to the identity (W = I, b = 0), then trained",
    "Boneless write-up, step 5", projections=ProjectionConfig("identity_init", "identity_init"),
    notes="the identity weights are raw parameters, not nn.Linear: GPT's N(0, 0.02) init leaves them alone; "
          "attnlab.train.optim decays them (towards 0, not towards I) like every 2-D weight.",
)
register(
    "residual-qk", "residual Q and K projections: Q = x W_q + x, K = x W_k + x (W initialised as usual)",
    "Boneless write-up, step 6", projections=ProjectionConfig("residual", "residual"),
)
register(
    "qk-norm", "cosine logits g cos(q, k): q and k L2-normalised per head, learned scale g (init sqrt(head_dim))",
    "Henry et al. 2020, arXiv:2010.04245; Dehghani et al. 2023, arXiv:2302.05442", qk_norm="learned",
    notes="one scalar g per layer, as in Henry et al.; initialised to sqrt(head_dim), the typical |q.k|/sqrt(d) "
          "logit scale of unit-variance q, k at cos = 1 (Henry et al. initialise g from the training lengths).",
)
register(
    "low-rank", "low-rank Q, K, V projections W = B A, inner rank r = 1/4 of each projection's full rank",
    "Boneless write-up (low-rank attention weights)", projections=ProjectionConfig(rank_fraction=0.25),
    notes="r = min(in, out)/4: half the parameters of a dense square W (r (in + out) = n^2 / 2). B A is initialised "
          "with the dense layer's entrywise std 0.02; its factors are raw parameters, weight-decayed like every 2-D weight.",
)
register(
    "mla", "multi-head latent attention: K, V rebuilt from one cached latent c = RMSNorm(x W_dkv) of width n_embd/4",
    "DeepSeek-V2, arXiv:2405.04434; the Boneless and softmax write-ups", projections=ProjectionConfig(kv_latent_fraction=0.25),
    notes="d_c = n_embd/4 as in DeepSeek-V2-Lite (512 of 2048). Caches d_c floats per token per layer instead of "
          "2 n_kv_head head_dim. No decoupled RoPE key and no query compression (RoPE, if on, rotates the rebuilt K).",
)
register(
    "talking-heads", "talking heads: the logits mixed across heads by a learned [H, H] matrix before the softmax, the "
    "weights by another after it (both identity at init)",
    "Shazeer et al. 2020, arXiv:2003.02436; the masking write-up (head recombination)", heads=HeadMixConfig("talking"),
    notes="the heads keep their count (h_k = h = h_v in the paper's notation). Identity init, so training starts "
          "from plain multi-head attention. Explicit path: no fused kernel mixes heads inside the softmax.",
)
register(
    "moh", "mixture of heads: per token, n_head/2 shared heads always on and the top half of the rest chosen by a "
    "router; the heads weighted by the router before W_o, a load-balance loss (beta 0.01) on the routed heads",
    "Jin et al. 2024, arXiv:2410.11842; the masking write-up (head recombination)", heads=HeadMixConfig("moh"),
    notes="the gate normalisation is the authors' released code's (top-k renormalised, each group scaled by its "
          "active head count; attnlab.mechanisms.heads.functional). On CPU every head is computed and the unchosen ones are "
          "weighted 0, so MoH saves no compute here; with 4 heads, 3 are active per token.",
)
register(
    "coda", "cascaded head-colliding attention: each layer's logits a Gaussian latent, mean s + a_prev + f(s + a_prev) "
    "with f an MLP across the heads at each (i, j) and a_prev the previous layer's sampled logits; noise 1 in training",
    "Zheng et al. 2021, arXiv:2105.14850 (the authors' released code, LZhengisme/CODA); the masking write-up (head recombination)",
    heads=HeadMixConfig("coda"),
    notes="built from the authors' released code, which trains with the task loss alone (no KL term, unit variance, "
          "one sample per step, the mean path at evaluation); the paper's method section is not reproduced here "
          "(docs/heads.md). Explicit path; f has 24 H^2 + 9 H parameters per layer after the first.",
)
register(
    "count-prior", "duplicate-count prior: softmax(z_ij - log c_ij), c_ij the copies of token x_j among x_1..x_i, "
    "so m identical tokens share one token's mass",
    "control for the Magnitude Attention write-up's magnitude prior (the same on exact duplicates, blind to near-duplicates)", count_prior=True,
    notes="reads the token ids, not the keys: the same prior in every layer. On m identical tokens the prefix "
          "magnitude prior gives -log m too (weights 1/m), so a cluster of exact copies cannot tell the two apart.",
)
register(
    "low-temperature", "softmax(QK'/(sqrt(d) T)) V at a fixed temperature T = 0.25 (logits 4x sharper)",
    "softmax write-up (temperature); the sharpening control for a prior that concentrates the mass", temperature=0.25,
    notes="a prior that discounts clusters also sharpens the weights on a unique key; this control sharpens every "
          "row alike without looking at duplicates (qk-norm is the learned-scale control).",
)

register(
    "ssmax", "Scalable-Softmax: softmax((s log n_i) z_ij), n_i the keys query i sees (its prefix length), s learned "
    "per head from 0.43",
    "Nakanishi 2025, arXiv:2501.19399; an answer to attention dilution beside the Magnitude Attention write-up's",
    ssmax=True,
    notes="the logit scale grows with the context a query sees, so a softmax over a longer prefix does not flatten; "
          "folded into the queries, so it keeps SDPA and the K/V cache.")

register(
    "softpick", "Softpick: ReLU(e^z_ij - 1) / sum_k |e^z_ik - 1| over the keys query i sees, in place of the softmax; "
    "rows sum to at most 1, and a query whose logits are all <= 0 attends to nothing",
    "Zuhri et al. 2025, arXiv:2504.20966; an answer to attention dilution beside the Magnitude Attention write-up's",
    normalizer="softpick",
    notes="no mass is forced onto any key, so a crowd of keys with logits <= 0 takes none (no attention sink). The "
          "paper's shifted form with eps 1e-6 after the shift, as the authors' released kernel adds; explicit path.")
register(
    "stick-breaking", "stick-breaking attention: each earlier key, nearest first, takes sigmoid(z_ij) of the stick "
    "the nearer keys left; the rest of the stick goes to the query's own value",
    "Tan et al. 2024, arXiv:2410.17980 (the remainder as the authors' released code, shawntan/stickbreaking-attention); "
    "an answer to attention dilution beside the Magnitude Attention write-up's",
    normalizer="stickbreaking",
    notes="a recency order without positional encoding: the paper trains with none (model.pos_encoding=none); the "
          "variant sets only attention switches, so it runs with the model's positional encoding unless told. Causal "
          "only; log-space form with a reverse cumulative sum; explicit path, K/V cache exact.")

register(
    "gated", "Gated attention: each head's output o_h times an elementwise sigmoid gate of its token, "
    "sigmoid(x W_g)_h, before W_o",
    "Qiu et al. 2025, arXiv:2505.06708 (the elementwise SDPA-output gate G1); an answer to attention sinks and "
    "dilution beside the Magnitude Attention write-up's",
    output_gate=True,
    notes="a query-dependent gate lets a head output nothing without parking its mass on one key; it reads only the "
          "current token, so it keeps SDPA and the K/V cache.")

register(
    "sink", "A learned attention-sink logit per head: p_ij = exp(z_ij) / (exp(s_h) + sum_k exp(z_ik)), one extra "
    "zero-valued key, s_h learned from 0",
    "as in GPT-OSS; the sink token of Xiao et al. 2023, arXiv:2309.17453; an answer to attention dilution beside "
    "the Magnitude Attention write-up's",
    sink=True,
    notes="a query can put mass on nothing, so its weights on the real keys sum to less than 1; on SDPA the sink is a "
          "zero key with s_h in a float mask, so it keeps SDPA (without the is_causal kernel) and the K/V cache.")

register(
    "selective", "selective attention: softmax(z_hij - F_ij), F_ij = sum_{k < i} ReLU(z_0kj) over 0 < j < k: head 0's "
    "logits let each token mask earlier tokens for the queries after it",
    "Leviathan, Kalman and Matias 2024, arXiv:2410.02703; an answer to attention dilution beside the Magnitude "
    "Attention write-up's",
    selective=True,
    notes="parameter-free; a token that has been selected away by later tokens loses mass at every later query, so a "
          "crowd of stale keys can be pushed out of the softmax; explicit path, no K/V cache.")

register(
    "differential", "differential attention: (softmax(Q1 K1'/sqrt(d/2)) - lambda softmax(Q2 K2'/sqrt(d/2))) V per "
    "head over the halves of its query and key, lambda learned per layer from lambda_init = 0.8 - 0.6 exp(-0.3 (l - 1)), "
    "each head RMS-normalised and times 1 - lambda_init",
    "Ye et al. 2024, arXiv:2410.05258; an answer to attention dilution beside the Magnitude Attention write-up's",
    differential=True,
    notes="the second map cancels the mass both maps give to the same keys (attention noise); two SDPA calls on the "
          "half-heads, so it keeps the fused path and the K/V cache.")
