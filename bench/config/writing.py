"""Writing the resolved config as TOML (the run folder's config.toml; `bench advise`'s best.toml)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bench.config.sections import BenchConfig

# TOML's basic string: these characters escaped, every other control character as \uXXXX
TOML_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b", "\f": "\\f"}


def toml_value(value) -> str:
    """`value` (bool, number, string or a list of them) as TOML: every string, whatever it holds (a
    newline, a quote, a control character), a valid basic string that reads back as itself."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, str):
        return '"' + "".join(TOML_ESCAPES.get(c) or (f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c)
                             for c in value) + '"'
    return repr(value)


def to_toml(config: BenchConfig) -> str:
    """The resolved config as TOML (None values are left out: absent means the default, None)."""
    data = config.to_dict()
    lines = [f"description = {toml_value(data.pop('description'))}"]
    for section, values in data.items():
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {toml_value(v)}" for k, v in values.items() if v is not None]
    return "\n".join(lines) + "\n"
