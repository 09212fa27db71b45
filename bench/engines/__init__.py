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

from bench.engines import ddp_core_engines, fsdp2, torch_ddp
from bench.engines.base import Engine

PLUGIN_VARIABLE = "DDPBENCH_ENGINE_MODULES"
_BUILT_IN = (torch_ddp.ENGINE, *ddp_core_engines.ENGINES, fsdp2.ENGINE)


class PluginError(ValueError):
    """DDPBENCH_ENGINE_MODULES names a module that cannot be imported or holds no engine; the config
    turns it into a one-line error naming the variable and its value (exit 2)."""


def _registry() -> tuple[dict[str, Engine], str | None]:
    """The engines by name, and why a plug-in could not be added (None when all could)."""
    engines = list(_BUILT_IN)
    for path in filter(None, (p.strip() for p in os.environ.get(PLUGIN_VARIABLE, "").split(","))):
        try:
            module = importlib.import_module(path)
            found = list(getattr(module, "ENGINES", ())) or [module.ENGINE]
        except (ImportError, AttributeError) as exc:
            return {e.name: e for e in engines}, f"module {path!r}: {type(exc).__name__}: {exc}"
        engines += found
    return {e.name: e for e in engines}, None


REGISTRY, _PLUGIN_FAILURE = _registry()


def names() -> tuple[str, ...]:
    """Every registered engine, built-in ones first; PluginError when a plug-in could not be added."""
    if _PLUGIN_FAILURE:
        raise PluginError(_PLUGIN_FAILURE)
    return tuple(REGISTRY)


def default_sweep() -> tuple[str, ...]:
    """The engines `matrix.engine` lists when a config leaves it out (Engine.in_default_sweep)."""
    return tuple(n for n in names() if REGISTRY[n].in_default_sweep)


def get(name: str) -> Engine:
    """The engine called `name` (KeyError naming the registered ones otherwise)."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise KeyError(f"engine {name!r} is not registered; registered: {', '.join(REGISTRY)}") from None


def reference() -> Engine:
    """The engine the others are compared with (torch DDP)."""
    return next(e for e in REGISTRY.values() if e.reference)


__all__ = ["PLUGIN_VARIABLE", "Engine", "PluginError", "default_sweep", "get", "names", "reference"]
