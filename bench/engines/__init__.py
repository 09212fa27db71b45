"""The engines the matrix sweeps, by name: one module per engine, registered below.

Adding an engine: a module with an `Engine` subclass (bench/engines/base.py: its facts, `wrap`, its bucket
layout) and one line in `_BUILT_IN`. Nothing else tests an engine's name: the matrix, the side-by-side
groups, the probe, the projection and the report ask the engine. An engine outside this package (a test's,
a user's experiment) is a module path in DDPBENCH_ENGINE_MODULES (comma-separated), each module holding
an `ENGINE` or `ENGINES`: read here, so the launcher and every rank see the same registry. A plug-in adds
engines and never replaces one: a name already registered (`torch`, the reference) is refused.
"""

from __future__ import annotations

import importlib
import os
import re

from bench.engines import ddp_core_engines, fsdp2, torch_ddp
from bench.engines.base import Engine

PLUGIN_VARIABLE = "DDPBENCH_ENGINE_MODULES"
_BUILT_IN = (torch_ddp.ENGINE, *ddp_core_engines.ENGINES, fsdp2.ENGINE)
BUILT_IN_NAMES = tuple(e.name for e in _BUILT_IN)
# an engine's name starts its cells' ids (bench.matrix.Cell.cell_id), which keep only these characters
NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


class PluginError(ValueError):
    """DDPBENCH_ENGINE_MODULES names a module that cannot be imported (whatever it raises), holds no engine,
    or an engine that would replace another (a built-in's name, or one another plug-in took); the config
    turns it into a one-line error naming the variable and its value (exit 2)."""


def _plugin_engines(path: str) -> list[Engine]:
    """The engines a plug-in module holds (`ENGINES`, else `ENGINE`); PluginError saying why not."""
    try:
        module = importlib.import_module(path)
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - the user's module: any failure is its cause
        kind = f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
        raise PluginError(f"module {path!r}: importing it raised {kind}") from None
    if not hasattr(module, "ENGINES") and not hasattr(module, "ENGINE"):
        raise PluginError(f"module {path!r}: defines neither ENGINE (an Engine) nor ENGINES (a list of them)")
    found = getattr(module, "ENGINES", None)
    if found is None:
        found = [module.ENGINE]
    elif isinstance(found, (str, bytes, dict)) or not hasattr(found, "__iter__"):
        raise PluginError(f"module {path!r}: ENGINES={found!r} is not a list of Engine instances")
    found = list(found)
    for engine in found:
        if not isinstance(engine, Engine):
            raise PluginError(f"module {path!r}: {engine!r} is not an instance of bench.engines.Engine")
        if not isinstance(engine.name, str) or not NAME.match(engine.name):
            raise PluginError(f"module {path!r}: engine name {engine.name!r} must be letters, digits, "
                              "'_', '.' or '-' (it starts its cells' ids)")
    if not found:
        raise PluginError(f"module {path!r}: ENGINES is empty")
    return found


def _registry() -> tuple[dict[str, Engine], str | None]:
    """The engines by name, and why a plug-in could not be added (None when all could). A plug-in never
    replaces an engine: one named like a built-in (`torch`, the reference every row is compared with) or
    like an engine of an earlier plug-in is refused."""
    engines = {e.name: e for e in _BUILT_IN}
    for path in filter(None, (p.strip() for p in os.environ.get(PLUGIN_VARIABLE, "").split(","))):
        try:
            found = _plugin_engines(path)
        except PluginError as exc:
            return {e.name: e for e in _BUILT_IN}, str(exc)
        for engine in found:
            if engine.name in engines:
                whose = ("a built-in engine" if engine.name in BUILT_IN_NAMES
                         else "an engine of an earlier module")
                return ({e.name: e for e in _BUILT_IN},
                        f"module {path!r}: engine {engine.name!r} is the name of {whose}; a plug-in cannot "
                        "replace it (give it a name of its own)")
            if engine.reference:
                return ({e.name: e for e in _BUILT_IN},
                        f"module {path!r}: engine {engine.name!r} says reference=True; torch DDP is the "
                        "reference every engine is compared with")
            engines[engine.name] = engine
    return engines, None


REGISTRY, _PLUGIN_FAILURE = _registry()


def names() -> tuple[str, ...]:
    """Every registered engine, built-in ones first; PluginError when a plug-in could not be added."""
    if _PLUGIN_FAILURE:
        raise PluginError(_PLUGIN_FAILURE)
    return tuple(REGISTRY)


def loaded() -> tuple[str, ...]:
    """The engines registered, built-in ones first, without raising for a plug-in that could not be added:
    for readers of recorded rows (the report's colours), which need no plug-in to run."""
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


__all__ = ["PLUGIN_VARIABLE", "Engine", "PluginError", "default_sweep", "get", "loaded", "names", "reference"]
