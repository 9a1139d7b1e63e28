"""Atomic file writes: write a temporary file beside the target, then ``os.replace`` it into place.

A reader, or a process killed mid-write, never sees half a file: at worst a stray ``.<name>.*.tmp`` is left.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path) -> Iterator[Path]:
    """Yield a temporary path next to ``path`` (parents created); on success move it onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")  # unique per writer
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_text(path, text: str) -> Path:
    """Write ``text`` (UTF-8, flushed to disk) to ``path`` atomically; returns the path."""
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    return Path(path)
