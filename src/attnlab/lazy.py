"""Packages whose public names load on first use (PEP 562), so that importing a package for one light name (a
config, a list of allowed values) does not import torch and every module beside it."""

from __future__ import annotations

import importlib


def lazy_exports(package: str, homes: dict[str, str]):
    """``(__getattr__, __dir__)`` for the package ``package``: each public name in ``homes`` (name -> the relative
    module that defines it) is imported on its first lookup and then kept as a plain attribute."""
    module = importlib.import_module(package)

    def __getattr__(name: str):
        home = homes.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home, package), name)
        setattr(module, name, value)  # the next lookup is a plain attribute
        return value

    def __dir__():
        return sorted({*vars(module), *homes})

    return __getattr__, __dir__
