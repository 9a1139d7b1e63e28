"""One kind of user error and the helpers that word it.

Every mistake a user can make in a config (a bad value, an unknown key, an unknown variant) raises
:class:`ConfigError` with a single line that names the bad value and what is allowed. The CLI prints that
line and exits with status 2, without a traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
from collections.abc import Iterable


class ConfigError(ValueError):
    """A user-facing configuration mistake; the message is one line naming the value and what is allowed."""


class TrainingDiverged(RuntimeError):
    """The training loss (or gradient norm) became NaN or infinite. One-line message; summary.json says
    "diverged" and the last good checkpoint is left untouched."""


def closest(name: str, allowed: Iterable[str]) -> str | None:
    """The allowed name most similar to ``name`` (for "did you mean ...?"), or None if nothing is close."""
    match = difflib.get_close_matches(name, list(allowed), n=1, cutoff=0.5)
    return match[0] if match else None


def unknown_name(kind: str, name: str, allowed: Iterable[str]) -> ConfigError:
    """Error for an unknown key / variant / choice: names it, suggests the closest, lists the valid ones."""
    allowed = sorted(allowed)
    hint = closest(name, allowed)
    did_you_mean = f" (did you mean {hint!r}?)" if hint else ""
    return ConfigError(f"unknown {kind} {name!r}{did_you_mean}; valid: {', '.join(allowed)}")


def check_choice(field: str, value, allowed: Iterable) -> None:
    """Raise a ConfigError unless ``value`` is one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(f"{field}={value!r} is not allowed; choose one of: {', '.join(map(repr, allowed))}")


def check_number(field: str, value, *, low=None, high=None, low_open=False, integer=False) -> None:
    """Raise a ConfigError unless ``value`` is a number in the stated range (bools are not numbers here)."""
    kind = "an integer" if integer else "a number"
    ok_type = isinstance(value, int) if integer else isinstance(value, (int, float))
    if not ok_type or isinstance(value, bool):
        raise ConfigError(f"{field}={value!r} must be {kind}")
    if low is not None and (value <= low if low_open else value < low):
        raise ConfigError(f"{field}={value!r} must be {'>' if low_open else '>='} {low}")
    if high is not None and value > high:
        raise ConfigError(f"{field}={value!r} must be <= {high}")


def strict_fields(cls):
    """Class decorator for dataclasses: an unknown keyword gives a ConfigError that suggests the closest field.

    Python's own message ("unexpected keyword argument") neither lists the valid fields nor guesses the typo.
    """
    init = cls.__init__
    names = [f.name for f in dataclasses.fields(cls) if f.init]

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        for key in kwargs:
            if key not in names:
                raise unknown_name(f"{cls.__name__} field", key, names)
        init(self, *args, **kwargs)

    cls.__init__ = __init__
    return cls
