"""Checkpoints: model weights as safetensors plus a torch-saved training state, written atomically.

Layout of ``<run dir>/checkpoint/``::

    model.safetensors   the model's unique tensors (a tied weight is stored once; see "tied" in its metadata)
    state.pt            torch.save'd dict: optimizer, step, tokens, RNG and batch-generator states, ...
    meta.json           {"format", "step", "tokens", "saved_at"}; written last, it marks a complete checkpoint

Atomicity: a new checkpoint is built in ``<run dir>/.checkpoint-<random>.new/``; every file is fsync'ed, then
meta.json, then the folder. Only then is the old ``checkpoint/`` renamed to ``.checkpoint-<random>.old/``, the
new folder renamed to ``checkpoint/``, the run directory fsync'ed and the old folder deleted. A process killed
at any moment therefore leaves at least one *complete* checkpoint folder (one with meta.json), and
:func:`find_checkpoint` picks the complete folder with the highest step among ``checkpoint/`` and the
``.checkpoint-*`` leftovers; the next save removes the leftovers.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from pathlib import Path

import torch
from torch import nn

from ..rundir import CHECKPOINT_DIR
from ..weights import load_weights, unique_tensors, write_weights

__all__ = ["CHECKPOINT_DIR", "save_checkpoint", "load_checkpoint", "find_checkpoint", "unique_tensors", "load_weights"]

WEIGHTS = "model.safetensors"
STATE = "state.pt"
META = "meta.json"
FORMAT = 1  # of the checkpoint folder (meta.json)


# --------------------------------------------------------------------------------------------- weights


# --------------------------------------------------------------------------------------------- durability


def _fsync_path(path: Path) -> None:
    """fsync a file or a directory (directories: where the OS allows it)."""
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if path.is_dir() else 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------------------------------------- save / load


def save_checkpoint(run_dir: str | Path, model: nn.Module, state: dict, meta: dict | None = None) -> Path:
    """Atomically replace ``<run_dir>/checkpoint/`` with the weights of ``model`` and ``state`` (see module doc).

    ``state`` must hold ``"step"``; ``meta`` adds fields to meta.json. If anything fails (or the process is
    interrupted) before the swap, the previous checkpoint is left exactly as it was. Returns the folder.
    """
    run_dir = Path(run_dir)
    final = run_dir / CHECKPOINT_DIR
    tmp = run_dir / f".checkpoint-{secrets.token_hex(6)}.new"
    tmp.mkdir(parents=True)
    try:
        write_weights(model, tmp / WEIGHTS)
        torch.save(state, tmp / STATE)
        info = {"format": FORMAT, "step": int(state["step"]), "saved_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
        info.update(meta or {})
        for name in (WEIGHTS, STATE):
            _fsync_path(tmp / name)
        (tmp / META).write_text(json.dumps(info, indent=1), encoding="utf-8")
        _fsync_path(tmp / META)
        _fsync_path(tmp)
    except BaseException:
        _remove(tmp)
        raise
    old = None
    if final.exists():
        old = run_dir / f".checkpoint-{secrets.token_hex(6)}.old"
        os.rename(final, old)
    os.rename(tmp, final)
    _fsync_path(run_dir)
    for leftover in run_dir.glob(".checkpoint-*"):  # the previous checkpoint and stale pieces of crashed saves
        _remove(leftover)
    return final


def _meta(folder: Path) -> dict | None:
    """meta.json of a complete checkpoint folder, else None."""
    try:
        meta = json.loads((folder / META).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not (isinstance(meta, dict) and isinstance(meta.get("step"), int)):
        return None
    if not ((folder / WEIGHTS).is_file() and (folder / STATE).is_file()):
        return None
    return meta


def find_checkpoint(run_dir: str | Path) -> Path | None:
    """The complete checkpoint folder of ``run_dir`` with the highest step (``checkpoint/`` on ties), or None."""
    run_dir = Path(run_dir)
    candidates = [run_dir / CHECKPOINT_DIR, *sorted(run_dir.glob(".checkpoint-*"))]
    best, best_step = None, -1
    for folder in candidates:
        meta = _meta(folder) if folder.is_dir() else None
        if meta is not None and meta["step"] > best_step:
            best, best_step = folder, meta["step"]
    return best


def load_checkpoint(folder: str | Path, model: nn.Module | None = None, map_location="cpu") -> dict:
    """Load the training state of a checkpoint folder, and its weights into ``model`` if given."""
    folder = Path(folder)
    if model is not None:
        load_weights(model, folder / WEIGHTS)
    return torch.load(folder / STATE, map_location=map_location, weights_only=True)
