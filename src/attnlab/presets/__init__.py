"""Named run presets: TOML files shipped in this package (``tiny``, ``cpu``, ``gpt2-small``).

Each file has ``[model]``, ``[data]`` and ``[train]`` tables; :func:`load_preset` turns one into a
:class:`~attnlab.train.config.RunConfig` (with ``preset`` set to its name). ``cpu`` is the default.
"""

from __future__ import annotations

import tomllib
from importlib import resources

from ..errors import ConfigError, unknown_name

DEFAULT_PRESET = "cpu"


def _files():
    return resources.files(__name__)


def preset_names() -> list[str]:
    """The shipped preset names, sorted."""
    return sorted(p.name[: -len(".toml")] for p in _files().iterdir() if p.name.endswith(".toml"))


def preset_text(name: str) -> str:
    """The TOML source of preset ``name``; an unknown name raises ConfigError listing the valid ones."""
    names = preset_names()
    if name not in names:
        raise unknown_name("preset", name, names)
    return _files().joinpath(f"{name}.toml").read_text(encoding="utf-8")


def load_preset(name: str = DEFAULT_PRESET):
    """The RunConfig of preset ``name`` (``preset`` set to ``name``)."""
    from ..configio import from_dict
    from ..train.config import RunConfig

    try:
        data = tomllib.loads(preset_text(name))
    except tomllib.TOMLDecodeError as e:  # a packaging bug, but say which file
        raise ConfigError(f"preset {name!r} ({name}.toml): invalid TOML: {e}") from None
    data.setdefault("preset", name)
    try:
        return from_dict(RunConfig, data)
    except ConfigError as e:
        raise ConfigError(f"preset {name!r}: {e}") from None


__all__ = ["DEFAULT_PRESET", "load_preset", "preset_names", "preset_text"]
