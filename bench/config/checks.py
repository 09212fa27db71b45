"""The config's errors and value checks: ConfigError (the CLI's exit 2), the message that names a key and its
value, the "did you mean" of a near miss, and the bounds every section holds its numbers to."""

from __future__ import annotations

import difflib
import math


class ConfigError(ValueError):
    """A configuration value that cannot run; the message names the key and the value."""


ECHO_CHARS = 80  # a value longer than this is shortened in messages (a 100 KB value is not echoed whole)


def fail(key: str, value, why: str):
    """Raise ConfigError naming the key and its value (shortened) and why."""
    text = repr(value)
    if len(text) > ECHO_CHARS:
        text = text[:ECHO_CHARS - 1] + "…"
    raise ConfigError(f"{key}={text}: {why}")



def did_you_mean(word, choices) -> str:
    """"; did you mean 'default'?" when `word` is a near miss of one of `choices` (a typo), else ""."""
    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""



def check_choices(key: str, values, choices) -> None:
    for v in values:
        if v not in choices:
            fail(key, v, f"must be one of {list(choices)}{did_you_mean(v, choices)}")


def check_min(key: str, values, minimum, strict: bool = False, maximum: float | None = None) -> None:
    """Every value finite, at least (or, strict, above) `minimum` and at most `maximum`: a NaN compares
    false with everything, so it would pass a plain bound check (and, as a timeout, turn the watchdog off)."""
    for v in values:
        if isinstance(v, float) and not math.isfinite(v):
            fail(key, v, "must be a finite number")
        if (v <= minimum) if strict else (v < minimum):
            fail(key, v, f"must be {'>' if strict else '>='} {minimum}"
                 + (f" and <= {maximum:g}" if maximum is not None else ""))
        if maximum is not None and v > maximum:
            fail(key, v, f"must be <= {maximum:g} ({'>' if strict else '>='} {minimum})")


# Upper bounds: far beyond any real run, low enough that a typo (1e30 MiB buckets, 1e300 s) is caught
# before anything is created rather than by a cell failing later.
MAX_WORLD_SIZE = 65536
MAX_BUCKET_MB = 16384.0          # 16 GiB: no gradient bucket is larger
MAX_STEPS = 1_000_000
MAX_BATCH = 1 << 24
MAX_SECONDS = 7 * 24 * 3600.0    # a week
MAX_THREADS = 4096
MAX_TARGET_CI_PCT = 100.0        # ±100 % of the median: any wider target is no target
MAX_LAUNCHES = 100               # MLPerf asks 5-10 full runs; a hundred launches of every cell is far beyond
MAX_SLOW_MS = 60_000.0           # a straggler fault of a minute per step is a hang; use "hang"
