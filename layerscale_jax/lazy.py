"""Names of a package that load on first use (PEP 562), so that importing one submodule does not import the others
(and their jax, flax, optax) through the package's ``__init__``.

    __getattr__, __dir__ = lazy_names(__name__, globals(), {"build": ".bundle", "ArchConfig": "layerscale_jax.arch"})

Each name maps to the module it comes from (relative to the package when it starts with a dot). A name is imported
once and then kept in the package's globals; an attribute that is no listed name is looked up as a submodule
(``optim.gradients``), else ``AttributeError``.
"""
from __future__ import annotations

import importlib
from typing import Callable


def lazy_names(package: str, namespace: dict, sources: dict[str, str]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for the package ``package`` whose module globals are ``namespace``."""

    def __getattr__(name: str):
        if name in sources:
            value = namespace[name] = getattr(importlib.import_module(sources[name], package), name)
            return value
        try:
            return importlib.import_module(f"{package}.{name}")
        except ModuleNotFoundError as err:
            if err.name != f"{package}.{name}":
                raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(sources))

    return __getattr__, __dir__
