"""Loading a config: a preset or a TOML file, its device table, the `--set` overrides, each section built and
checked (the precedence is the package docstring's, bench/config/__init__.py)."""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from pathlib import Path

from bench.config.checks import ConfigError, did_you_mean, fail
from bench.config.convert import convert_value, field_types
from bench.config.run import DEVICES, RunConfig
from bench.config.sections import SECTIONS, BenchConfig
from bench.schema import ENGINE_OPTION_NAMES

CONFIG_DIR = Path(__file__).parents[1] / "configs"
DEVICE_SECTIONS = ("on_cpu", "on_cuda")


def parse_set(items: list[str]) -> dict[str, str]:
    """`--set section.key=value` items → {"section.key": "value"} (values converted later, by type)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected section.key=value")
        out[key.strip()] = value
    return out


def _apply(tables: dict, key: str, value) -> None:
    """Set a dotted key in the nested tables; unknown sections/keys are reported by `_build`."""
    section, dot, name = key.partition(".")
    if not dot:
        if key != "description":
            raise ConfigError(f"{key}={value!r}: unknown key (use section.key, sections: {list(SECTIONS)})")
        tables["description"] = value
        return
    target = tables.setdefault(section, {})
    if not isinstance(target, dict):
        raise ConfigError(f"{key}={value!r}: {section!r} is not a table")
    target[name] = value


def _build(tables: dict, cli: dict[str, str], given_options_apply: bool = True) -> BenchConfig:
    """Nested TOML tables + CLI strings → a validated BenchConfig. given_options_apply: an engine option
    given with --set (even at its default) must apply to a listed engine, and so must one the TOML gives
    unless --set chose the engines (a preset's peers options then stay unswept for engines it no longer
    lists); off for a resolved config, which lists every key."""
    unknown = set(tables) - set(SECTIONS) - {"description", *DEVICE_SECTIONS}
    if unknown:
        key = sorted(unknown)[0]
        raise ConfigError(f"{key}={tables[key]!r}: unknown key (sections: {list(SECTIONS)})")
    for key, value in cli.items():
        if key != "description" and key.partition(".")[0] not in SECTIONS:
            raise ConfigError(f"{key}={value!r}: unknown key (use section.key, sections: {list(SECTIONS)})")
    sections = {}
    for name, cls in SECTIONS.items():
        hints = field_types(cls)
        values = {}
        if not isinstance(tables.get(name, {}), dict):
            fail(name, tables[name], "must be a table ([" + name + "] with keys)")
        raw = dict(tables.get(name, {}))
        raw_cli = {k.partition(".")[2]: v for k, v in cli.items() if k.partition(".")[0] == name}
        for key, value in list(raw.items()) + list(raw_cli.items()):
            if key not in hints:
                raise ConfigError(f"{name}.{key}={value!r}: unknown key; {name} keys: {sorted(hints)}"
                                  f"{did_you_mean(key, hints)}")
        for key, value in raw.items():
            values[key] = convert_value(f"{name}.{key}", hints[key], value, from_cli=False)
        for key, value in raw_cli.items():
            values[key] = convert_value(f"{name}.{key}", hints[key], value, from_cli=True)
        sections[name] = cls(**values)
        if name == "matrix" and given_options_apply:
            given = set(raw_cli) | (set() if "engine" in raw_cli else set(raw))
            sections[name].check_options_apply([k for k in ENGINE_OPTION_NAMES if k in given])
    description = cli.get("description", tables.get("description", ""))
    if not isinstance(description, str):
        fail("description", description, "must be a string")
    return BenchConfig(description=description, **sections)


def resolve_path(name_or_path: str) -> Path:
    """A preset name (`bench/configs/<name>.toml`) or a path to a TOML file."""
    path = Path(name_or_path)
    if path.is_dir():
        raise ConfigError(f"--config={name_or_path!r}: is a directory, not a TOML file")
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ConfigError(f"--config={name_or_path!r}: no such file")
        return path
    preset = CONFIG_DIR / f"{name_or_path}.toml"
    if not preset.is_file():
        names = sorted(p.stem for p in CONFIG_DIR.glob("*.toml"))
        raise ConfigError(f"--config={name_or_path!r}: no such preset; presets: {names}"
                          f"{did_you_mean(name_or_path, names)}")
    return preset


def read_tables(path: Path) -> dict:
    """The TOML file's tables; ConfigError for a file that cannot be read, is not UTF-8 or not TOML."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"--config={str(path)!r}: not valid TOML ({e})") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"--config={str(path)!r}: not UTF-8 text (byte {e.start}); TOML is UTF-8") from None
    except OSError as e:
        raise ConfigError(f"--config={str(path)!r}: cannot be read ({e.strerror})") from None


def load_config(name_or_path: str, overrides: list[str] | None = None,
                cuda_available: bool | Callable[[], bool] | None = None) -> BenchConfig:
    """Load a preset, apply its device table and the `--set` overrides, validate; raises ConfigError.

    The device table (`[on_cpu]`/`[on_cuda]`, dotted keys) is chosen by the device the run resolves to:
    `run.device` from the CLI or the preset, with "auto" meaning cuda when `cuda_available`: a bool, or a
    function asked only for "auto" (`bench run` passes one that refuses GPUs torch cannot use).
    The returned config has `run.device` resolved to "cpu" or "cuda".
    """
    tables = read_tables(resolve_path(name_or_path))
    cli = parse_set(overrides or [])
    for name in (*SECTIONS, *DEVICE_SECTIONS):
        if name in tables and not isinstance(tables[name], dict):
            fail(name, tables[name], "must be a table ([" + name + "] with keys)")
    device = cli.get("run.device", tables.get("run", {}).get("device", RunConfig.device))
    if not isinstance(device, str):
        fail("run.device", device, f"must be one of {list(DEVICES)}")
    device = device.strip()
    if device not in DEVICES:
        fail("run.device", device, f"must be one of {list(DEVICES)}")
    if device == "auto":
        if cuda_available is None:
            import torch

            cuda_available = torch.cuda.is_available()
        elif callable(cuda_available):
            cuda_available = cuda_available()
        device = "cuda" if cuda_available else "cpu"
    for section in DEVICE_SECTIONS:
        table = tables.get(section, {})
        if not isinstance(table, dict):
            fail(section, table, "must be a table of dotted keys")
        if section == f"on_{device}":
            for key, value in _flatten(table):
                _apply(tables, key, value)
    tables.setdefault("run", {})["device"] = device
    cli.pop("run.device", None)
    return _build(tables, cli)


def _flatten(table: dict, prefix: str = ""):
    """Dotted keys of a device table: both `"run.timed_steps" = 5` and `[on_cpu.run] timed_steps = 5`."""
    for key, value in table.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def config_from_dict(data: dict) -> BenchConfig:
    """Rebuild a config from `to_dict()` output or a resolved config.toml's tables."""
    return _build(data, {}, given_options_apply=False)
