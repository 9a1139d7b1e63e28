"""Load a local Hugging Face GPT-2 checkpoint into attnlab.GPT (no network, no transformers import).

GPT-2 stores its projections as Conv1D weights of shape [in, out] (x @ W + b); ours are nn.Linear [out, in],
so every Conv1D weight is transposed, and the fused c_attn [C, 3C] is split into q, k and v.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..config import GPTConfig
from ..errors import ConfigError

_NORMS = ("ln_1", "ln_2")  # the LayerNorms of a block, the same names on both sides
_LINEARS = {"attn.c_proj": "attn.out_proj", "mlp.c_fc": "mlp.fc", "mlp.c_proj": "mlp.proj"}  # HF Conv1D -> ours
_ACTIVATIONS = {"gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}


def gpt2_config(hf: dict, attention="standard") -> GPTConfig:
    """GPTConfig equivalent to a GPT-2 config.json; features we do not implement are refused by name."""
    unsupported = {
        "scale_attn_by_inverse_layer_idx": True, "add_cross_attention": True, "tie_word_embeddings": False,
    }
    for key, bad in unsupported.items():
        if hf.get(key) == bad:
            raise ConfigError(f"GPT-2 checkpoint option {key}={bad} is not supported by attnlab.GPT")
    act = hf.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise ConfigError(f"GPT-2 activation_function={act!r} is not supported; supported: {', '.join(_ACTIVATIONS)}")
    n_embd = hf["n_embd"]
    n_inner = hf.get("n_inner") or 4 * n_embd
    if n_inner % n_embd:
        raise ConfigError(f"GPT-2 n_inner={n_inner} is not a multiple of n_embd={n_embd}")
    config = GPTConfig(
        vocab_size=hf["vocab_size"], block_size=hf["n_positions"], n_layer=hf["n_layer"], n_head=hf["n_head"],
        n_embd=n_embd, dropout=float(hf.get("resid_pdrop", 0.0)), bias=True, attention=attention,
        pos_encoding="learned", layer_norm_eps=float(hf.get("layer_norm_epsilon", 1e-5)),
        activation=_ACTIVATIONS[act], mlp_ratio=n_inner // n_embd,
    )
    attn = config.resolved_attention()
    if attn.n_kv_head != config.n_head:
        raise ConfigError(f"GPT-2 weights have {config.n_head} K/V heads; attention n_kv_head={attn.n_kv_head} cannot load them")
    if not hf.get("scale_attn_weights", True):  # GPT-2 option: logits q.k without 1/sqrt(d)
        config = config.replace(attention=attn.replace(scale=1.0))
    return config


def _read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    if (path / "model.safetensors").exists():
        from safetensors.torch import load_file

        return load_file(str(path / "model.safetensors"))
    if (path / "pytorch_model.bin").exists():
        return torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
    raise ConfigError(f"{path}: no model.safetensors or pytorch_model.bin found")


def convert_state_dict(sd: dict[str, torch.Tensor], n_layer: int) -> dict[str, torch.Tensor]:
    """Hugging Face GPT2 names and layouts -> attnlab.GPT names and layouts."""
    sd = {k.removeprefix("transformer."): v for k, v in sd.items()}
    out = {"wte.weight": sd["wte.weight"], "pos.weight": sd["wpe.weight"],
           "ln_f.weight": sd["ln_f.weight"], "ln_f.bias": sd["ln_f.bias"]}
    for i in range(n_layer):
        src, dst = f"h.{i}.", f"blocks.{i}."
        for ln in _NORMS:
            out[dst + ln + ".weight"] = sd[src + ln + ".weight"]
            out[dst + ln + ".bias"] = sd[src + ln + ".bias"]
        qkv_w = sd[src + "attn.c_attn.weight"].t()  # [3C, C]
        qkv_b = sd[src + "attn.c_attn.bias"]
        for name, w, b in zip(("q", "k", "v"), qkv_w.chunk(3, 0), qkv_b.chunk(3, 0)):
            out[dst + f"attn.{name}_proj.weight"] = w
            out[dst + f"attn.{name}_proj.bias"] = b
        for hf_name, our_name in _LINEARS.items():
            out[dst + our_name + ".weight"] = sd[src + hf_name + ".weight"].t()
            out[dst + our_name + ".bias"] = sd[src + hf_name + ".bias"]
    return {k: v.contiguous() for k, v in out.items()}


def read_gpt2_config(path, attention="standard") -> GPTConfig:
    """The GPTConfig of a local Hugging Face GPT-2 directory (its config.json)."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise ConfigError(f"{path}: not a Hugging Face GPT-2 directory (config.json missing)")
    hf = json.loads((path / "config.json").read_text())
    if hf.get("model_type", "gpt2") != "gpt2":
        raise ConfigError(f"{path}: model_type={hf.get('model_type')!r}, expected 'gpt2'")
    return gpt2_config(hf, attention)


def load_gpt2_weights(model, path) -> None:
    """Load the weights of a local GPT-2 directory into ``model`` (an attnlab.GPT of its architecture; a block_size
    below the checkpoint's n_positions keeps the first block_size position vectors)."""
    config = model.config
    attention = config.attention
    state = convert_state_dict(_read_state_dict(Path(path)), config.n_layer)
    state["pos.weight"] = state["pos.weight"][:config.block_size]
    state["lm_head.weight"] = state["wte.weight"]
    ours, theirs = set(model.state_dict()), set(state)
    if ours != theirs:  # an attention whose parameters GPT-2 does not have (or lacks some GPT-2 has)
        extra, lacking = sorted(ours - theirs), sorted(theirs - ours)
        detail = f"it has {extra[0]!r} (and {len(extra) - 1} more) that GPT-2 lacks" if extra else \
            f"it lacks GPT-2's {lacking[0]!r} (and {len(lacking) - 1} more)"
        raise ConfigError(f"attention={attention!r} cannot load GPT-2 weights: {detail}")
    model.load_state_dict(state, strict=True)


def load_gpt2(cls, path, attention="standard"):
    """Build ``cls`` (attnlab.GPT) from a local Hugging Face GPT-2 directory."""
    model = cls(read_gpt2_config(path, attention))
    load_gpt2_weights(model, path)
    return model


# ---------------------------------------------------------------------------------------------------- export

_HF_ACTIVATIONS = {"gelu_tanh": "gelu_new", "gelu": "gelu"}


def gpt2_refusal(config: GPTConfig) -> str | None:
    """Why a model of ``config`` is not GPT-2's architecture (so cannot become a GPT2LMHeadModel), or None."""
    attn = config.resolved_attention()
    plain = attn.replace(n_head=None, n_kv_head=None, bias=None, dropout=None, scale=None)
    if config.pos_encoding != "learned":
        return f"pos_encoding={config.pos_encoding!r}; GPT-2 has learned absolute positions"
    if not config.bias or not (attn.bias is None or attn.bias):
        return "bias=false; GPT-2 has biases in every linear layer and LayerNorm"
    if attn.n_kv_head != config.n_head:
        return f"{attn.n_kv_head} K/V heads for {config.n_head} query heads; GPT-2 has multi-head attention"
    if plain != type(attn)() or attn.scale not in (None, 1.0):
        name = config.attention if isinstance(config.attention, str) else "a custom AttentionConfig"
        return f"attention {name!r} is not GPT-2's softmax(q.k / sqrt(d)) attention"
    if not config.mlp_ratio:
        return "mlp_ratio=0 (attention-only blocks); every GPT-2 block has an MLP"
    if config.activation not in _HF_ACTIVATIONS:
        return f"activation={config.activation!r}; GPT-2 uses {' or '.join(_HF_ACTIVATIONS)}"
    return None


def gpt2_hf_config(config: GPTConfig) -> dict:
    """The transformers GPT2Config fields equal to ``config`` (which must pass :func:`gpt2_refusal`)."""
    attn = config.resolved_attention()
    return dict(vocab_size=config.vocab_size, n_positions=config.block_size, n_embd=config.n_embd,
                n_layer=config.n_layer, n_head=config.n_head, n_inner=config.mlp_ratio * config.n_embd,
                activation_function=_HF_ACTIVATIONS[config.activation], layer_norm_epsilon=config.layer_norm_eps,
                resid_pdrop=config.dropout, embd_pdrop=config.dropout,
                attn_pdrop=config.dropout if attn.dropout is None else attn.dropout,
                scale_attn_weights=attn.scale is None, tie_word_embeddings=True, bos_token_id=None,
                eos_token_id=None)


def to_gpt2_state_dict(model) -> dict[str, torch.Tensor]:
    """attnlab.GPT names and layouts -> Hugging Face GPT2LMHeadModel's (the inverse of :func:`convert_state_dict`)."""
    sd = model.state_dict()
    out = {"transformer.wte.weight": sd["wte.weight"], "transformer.wpe.weight": sd["pos.weight"],
           "transformer.ln_f.weight": sd["ln_f.weight"], "transformer.ln_f.bias": sd["ln_f.bias"],
           "lm_head.weight": sd["wte.weight"]}
    for i in range(model.config.n_layer):
        src, dst = f"blocks.{i}.", f"transformer.h.{i}."
        for ln in _NORMS:
            out[dst + ln + ".weight"] = sd[src + ln + ".weight"]
            out[dst + ln + ".bias"] = sd[src + ln + ".bias"]
        qkv = [sd[src + f"attn.{n}_proj.weight"] for n in "qkv"]
        out[dst + "attn.c_attn.weight"] = torch.cat(qkv, 0).t()  # Conv1D [C, 3C]
        out[dst + "attn.c_attn.bias"] = torch.cat([sd[src + f"attn.{n}_proj.bias"] for n in "qkv"], 0)
        for hf_name, our_name in _LINEARS.items():
            out[dst + hf_name + ".weight"] = sd[src + our_name + ".weight"].t()
            out[dst + hf_name + ".bias"] = sd[src + our_name + ".bias"]
    return {k: v.detach().contiguous().cpu() for k, v in out.items()}


def export_gpt2(model, dest, hf_tokenizer=None) -> Path:
    """Write ``model`` (an attnlab.GPT of GPT-2's architecture) as a transformers GPT2LMHeadModel directory:
    config.json and model.safetensors (transformers' own save_pretrained), and the tokenizer files when a
    ``tokenizers.Tokenizer`` is given. Needs transformers."""
    why = gpt2_refusal(model.config)
    if why is not None:
        raise ConfigError(f"cannot export as GPT-2: {why}")
    try:
        import transformers
    except ImportError:
        raise ConfigError("export to Hugging Face needs transformers: pip install 'attnlab[hf]'") from None
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**gpt2_hf_config(model.config)))
    state = to_gpt2_state_dict(model)
    hf.load_state_dict(state, strict=False)  # the attention-mask buffers are not weights
    missing = set(hf.state_dict()) - set(state)
    if any(not name.endswith((".attn.bias", ".attn.masked_bias")) for name in missing):
        raise ConfigError(f"GPT-2 export left weights unset: {sorted(missing)[:3]}")
    dest = Path(dest)
    hf.save_pretrained(dest)
    if hf_tokenizer is not None:
        transformers.PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer).save_pretrained(dest)
    return dest
