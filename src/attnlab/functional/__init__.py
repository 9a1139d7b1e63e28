"""Pure attention math over [batch, heads, seq, head_dim] tensors: no parameters, no state."""

from .attention import attention, repeat_kv, uses_sdpa
from .masks import additive_causal_mask, causal_keep, mask_renormalize, mask_renormalize_softmax
from .positional import alibi_bias, alibi_slopes, apply_rope, rope_angles, sinusoidal_table
from .scores import default_scale, dot_logits, qk_normalize, rbf_augment, rbf_logits, squared_distances

__all__ = [
    "attention", "repeat_kv", "uses_sdpa",
    "additive_causal_mask", "causal_keep", "mask_renormalize", "mask_renormalize_softmax",
    "alibi_bias", "alibi_slopes", "apply_rope", "rope_angles", "sinusoidal_table",
    "default_scale", "dot_logits", "qk_normalize", "rbf_augment", "rbf_logits", "squared_distances",
]
