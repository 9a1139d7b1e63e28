"""Saving a comparison's figures so that regenerating its report rewrites a figure only when it is missing or stale.

A figure is *stale* when what it was drawn from changed: the numbers (the report's results and the run curves)
or the code that draws it (the source of what draws it: :mod:`.plots` and :func:`.hijack_report.plot_hijack` for a
report). Each PNG carries a key of both in a text chunk (:data:`KEY_FIELD`); :func:`is_current` compares it with
the key of today's inputs. The key deliberately leaves out the matplotlib version and the fonts, so a clean checkout on another machine keeps the
shipped pictures instead of rewriting them pixel by pixel, and ``attnlab report results/NAME`` leaves a current
checkout clean.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..atomic import atomic_path

KEY_FIELD = "attnlab-inputs"
"""The PNG text chunk holding the key of a figure's inputs."""


def inputs_key(*inputs, drawn_by: tuple = ()) -> str:
    """The key (sha256, hex) of the drawing code (the source of the modules or functions ``drawn_by``) and
    ``inputs`` (JSON-serialisable; other values by ``str``)."""
    import inspect

    digest = hashlib.sha256("".join(inspect.getsource(code) for code in drawn_by).encode())
    digest.update(json.dumps(inputs, sort_keys=True, default=str, allow_nan=True).encode())
    return digest.hexdigest()


def is_current(path, key: str | None) -> bool:
    """True when ``path`` is a PNG drawn from the inputs whose key is ``key`` (False for key None: always draw)."""
    path = Path(path)
    if key is None or not path.is_file():
        return False
    from PIL import Image

    try:
        with Image.open(path) as image:
            return getattr(image, "text", {}).get(KEY_FIELD) == key
    except OSError:  # unreadable or not a PNG: redraw it
        return False


def save_figure(fig, path, key: str | None = None, **savefig) -> Path:
    """Write ``fig`` to ``path`` as a PNG atomically, with ``key`` in its :data:`KEY_FIELD` text chunk."""
    path = Path(path)
    metadata = {"Software": None, **({KEY_FIELD: key} if key else {})}
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", metadata=metadata, **savefig)
    return path
