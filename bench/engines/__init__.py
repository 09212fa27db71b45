"""The engines the matrix sweeps, by name: one module per engine, registered below.

Adding an engine: a module with an `Engine` subclass (bench/engines/base.py: its facts, `wrap`, its bucket
layout) and one line in `_BUILT_IN`. Nothing else tests an engine's name: the matrix, the side-by-side
groups, the probe, the projection and the report ask the engine. An engine outside this package (a test's,
a user's experiment) is a module path in DDPBENCH_ENGINE_MODULES (comma-separated), each module holding
an `ENGINE` or `ENGINES`: read here, so the launcher and every rank see the same registry.
"""

from __future__ import annotations

import importlib
import os

from bench.engines import ddp_core_engines, torch_ddp
from bench.engines.base import Engine

PLUGIN_VARIABLE = "DDPBENCH_ENGINE_MODULES"
_BUILT_IN = (torch_ddp.ENGINE, *ddp_core_engines.ENGINES)


def _registry() -> dict[str, Engine]:
    engines = list(_BUILT_IN)
    for path in filter(None, (p.strip() for p in os.environ.get(PLUGIN_VARIABLE, "").split(","))):
        module = importlib.import_module(path)
        engines += list(getattr(module, "ENGINES", ())) or [module.ENGINE]
    return {e.name: e for e in engines}


REGISTRY = _registry()


def names() -> tuple[str, ...]:
    """Every registered engine, built-in ones first."""
    return tuple(REGISTRY)


def get(name: str) -> Engine:
    """The engine called `name` (KeyError naming the registered ones otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"engine {name!r} is not registered; registered: {', '.join(REGISTRY)}") from None


def reference() -> Engine:
    """The engine the others are compared with (torch DDP)."""
    return next(e for e in REGISTRY.values() if e.reference)


__all__ = ["Engine", "PLUGIN_VARIABLE", "get", "names", "reference"]
