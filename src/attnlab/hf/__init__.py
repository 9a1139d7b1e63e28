"""The Hugging Face bridge: GPT-2 checkpoints into attnlab.GPT (gpt2), attnlab attention inside HF models
(attention). transformers itself is imported only where it is needed (`pip install 'attnlab[hf]'`)."""

from .attention import hf_refusal, hf_variants, register_attention
from .gpt2 import convert_state_dict, gpt2_config, load_gpt2

__all__ = ["convert_state_dict", "gpt2_config", "hf_refusal", "hf_variants", "load_gpt2", "register_attention"]
