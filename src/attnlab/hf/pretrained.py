"""save_pretrained / from_pretrained for attnlab.GPT: a Hugging Face-style model directory, read and written
locally (no network).

    DEST/config.json         {"model_type": "attnlab-gpt", "attnlab_variant": name or null, "config": GPTConfig}
    DEST/model.safetensors   the unique tensors (the tied head stored once; attnlab.weights)

The config holds the attention's full AttentionConfig, not only a variant name, so a model reloads exactly even
if the registry's preset of that name changes later. Both files are written atomically.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..atomic import atomic_path, write_text
from ..config import GPTConfig
from ..errors import ConfigError
from ..registry import get_variant
from ..weights import load_weights, write_weights

MODEL_TYPE = "attnlab-gpt"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


def save_pretrained(model, path) -> Path:
    """Write ``model`` (an attnlab.GPT) to the directory ``path``; returns it."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = model.config
    name = config.attention if isinstance(config.attention, str) else None
    if name is not None:
        config = config.replace(attention=get_variant(name))
    data = {"model_type": MODEL_TYPE, "architectures": ["attnlab.GPT"], "attnlab_variant": name,
            "config": config.to_dict()}
    with atomic_path(path / WEIGHTS_FILE) as tmp:
        write_weights(model, tmp)
    write_text(path / CONFIG_FILE, json.dumps(data, indent=1) + "\n")
    return path


def load_pretrained(cls, path, map_location="cpu"):
    """An instance of ``cls`` (attnlab.GPT) from a directory written by :func:`save_pretrained`."""
    path = Path(path)
    if not (path / CONFIG_FILE).is_file() or not (path / WEIGHTS_FILE).is_file():
        raise ConfigError(f"{path} is not an attnlab model directory: it needs {CONFIG_FILE} and {WEIGHTS_FILE} "
                          f"(written by GPT.save_pretrained)")
    data = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
    if data.get("model_type") != MODEL_TYPE:
        raise ConfigError(f"{path / CONFIG_FILE} has model_type={data.get('model_type')!r}, not {MODEL_TYPE!r}; a "
                          f"Hugging Face GPT-2 directory loads with GPT.from_hf_gpt2")
    model = cls(GPTConfig.from_dict(data["config"]))  # the attention as its full AttentionConfig
    load_weights(model, path / WEIGHTS_FILE)
    return model.to(map_location)
