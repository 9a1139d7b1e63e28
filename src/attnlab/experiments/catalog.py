"""Named comparisons: ``attnlab compare --experiment NAME`` runs a shipped grid of variants x seeds.

Each experiment is a TOML file in ``attnlab/experiments/presets/`` with the keys

    description  one line shown by ``attnlab experiments``
    preset       the run preset the base config starts from (``cpu``, ``tiny``, ...)
    variants     variant names; the first is the baseline of the Welch tests
    seeds        training seeds
    out_dir      where the comparison goes unless ``--out-dir`` says otherwise
    overrides    dotted KEY=VALUE settings applied to the preset (before the command line's own)
    primary      (optional) the primary metric, declared before the runs: val_loss, val_accuracy or a hook's key
                 (attnlab.experiments.verdict); the report tests it against the baseline with Holm's correction

so a result in the README is reproduced by one command, e.g. ``attnlab compare --experiment boneless --jobs 2``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from importlib import resources

from ..errors import ConfigError, unknown_name

__all__ = ["Experiment", "experiment_names", "load_experiment"]

_KEYS = {"description": str, "preset": str, "variants": list, "seeds": list, "out_dir": str, "overrides": list}
_OPTIONAL = {"primary": str}


@dataclass(frozen=True)
class Experiment:
    name: str
    description: str
    preset: str
    variants: list[str]
    seeds: list[int]
    out_dir: str
    overrides: list[str]
    primary: str | None = None

    def base_config(self, extra_overrides=()):
        """The RunConfig every run starts from: the preset, this experiment's overrides, then ``extra``."""
        from ..configio import apply_overrides
        from ..presets import load_preset

        return apply_overrides(load_preset(self.preset), [*self.overrides, *extra_overrides])


def _folder():
    return resources.files(__name__.rsplit(".", 1)[0]).joinpath("presets")


def experiment_names() -> list[str]:
    """The shipped experiment names, sorted."""
    return sorted(p.name[: -len(".toml")] for p in _folder().iterdir() if p.name.endswith(".toml"))


def load_experiment(name: str) -> Experiment:
    """The experiment ``name``; an unknown name or a malformed file is a one-line ConfigError."""
    names = experiment_names()
    if name not in names:
        raise unknown_name("experiment", name, names)
    data = tomllib.loads(_folder().joinpath(f"{name}.toml").read_text(encoding="utf-8"))
    for key, kind in _KEYS.items():
        if not isinstance(data.get(key), kind):
            raise ConfigError(f"experiment {name!r}: {key} must be a {kind.__name__}, got {data.get(key)!r}")
    for key, kind in _OPTIONAL.items():
        if key in data and not isinstance(data[key], kind):
            raise ConfigError(f"experiment {name!r}: {key} must be a {kind.__name__}, got {data[key]!r}")
    unknown = sorted(set(data) - set(_KEYS) - set(_OPTIONAL))
    if unknown:
        raise ConfigError(f"experiment {name!r}: unknown keys {unknown}; allowed: {sorted(_KEYS | _OPTIONAL)}")
    return Experiment(name=name, **data)
