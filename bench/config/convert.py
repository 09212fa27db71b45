"""One TOML or `--set` value checked against its field's type and converted to it (CLI values arrive as
strings; a matrix axis is a list, comma-separated on the command line)."""

from __future__ import annotations

import typing

from bench.config.checks import ConfigError, fail


def field_types(cls) -> dict:
    """A section's fields and their types (the annotations resolved)."""
    return typing.get_type_hints(cls)


def convert_value(key: str, hint, value, from_cli: bool):
    """Check/convert one value against its field type; CLI values arrive as strings."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is tuple:  # a matrix axis: a list (CLI: comma-separated)
        if from_cli:
            text = value.strip()
            if text.startswith("["):  # [a, b]; without the opening one a bracket is the value's (a glob's)
                if len(text) < 2 or not text.endswith("]"):
                    fail(key, value, "must be a list: a,b or [a, b] (its '[' is not closed)")
                text = text[1:-1]
            value = [v for v in text.split(",") if v.strip()]
        elif not isinstance(value, list):
            value = [value]
        return tuple(convert_value(key, args[0], v, from_cli) for v in value)
    if args and type(None) in args:  # Optional[T]
        if value is None or (from_cli and value.strip().lower() in ("", "none", "null")):
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return convert_value(key, inner, value, from_cli)
    if args and str in args:  # a number or a keyword (pg_timeout_s: "auto"); the section checks the word
        (inner,) = [a for a in args if a is not str]
        try:
            return convert_value(key, inner, value, from_cli)
        except ConfigError:
            if isinstance(value, str):
                return value.strip().strip('"').strip("'")
            raise
    if from_cli:
        value = value.strip().strip('"').strip("'")
        try:
            if hint is bool:
                if value.lower() not in ("true", "false"):
                    raise ValueError
                return value.lower() == "true"
            return hint(value)
        except ValueError:
            fail(key, value, f"must be a {hint.__name__}")
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        fail(key, value, f"must be a {hint.__name__}")
    return value
