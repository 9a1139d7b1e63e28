"""Model weights as safetensors: every shared tensor stored once (tied weights), the aliases in the metadata.

One home for the weight format of checkpoints (attnlab.train.checkpoint) and of save_pretrained
(attnlab.hf.pretrained).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

FORMAT = 1  # of the weights file


def unique_tensors(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, aliases): the state dict with every shared tensor kept once (under its first name) and
    ``aliases[name] = kept_name`` for the others (e.g. ``{"lm_head.weight": "wte.weight"}`` for tied weights)."""
    tensors, aliases, seen = {}, {}, {}
    for name, t in model.state_dict().items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if t.numel() and key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        tensors[name] = t.detach().contiguous().cpu()
    return tensors, aliases


def write_weights(model: nn.Module, path: Path) -> None:
    """The model's unique tensors as safetensors at ``path``; tied names in the metadata (\"tied\")."""
    tensors, aliases = unique_tensors(model)
    save_file(tensors, str(path), metadata={"tied": json.dumps(aliases), "format": str(FORMAT)})


def load_weights(model: nn.Module, path: str | Path) -> None:
    """Load a safetensors file written by :func:`write_weights` into ``model`` (strict), re-tying aliases."""
    tensors = {}
    with safe_open(str(path), framework="pt", device="cpu") as f:
        aliases = json.loads((f.metadata() or {}).get("tied", "{}"))
        for name in f.keys():
            tensors[name] = f.get_tensor(name)
    for name, target in aliases.items():
        tensors[name] = tensors[target]
    model.load_state_dict(tensors, strict=True)
