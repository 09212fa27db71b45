"""Open one Chrome-trace file (Kineto/torch.profiler JSON, optionally gzipped) into compact columns.

Only complete events (`"ph": "X"`) carry durations; they are all the analysis needs. Each is kept as one
row of parallel numpy arrays (ts and dur in microseconds, as the file has them) and the few `args` the
analysis reads are pulled out in the same pass. The file's text is read a few MB at a time (gunzipped and
decoded on the way), never whole: holding a big trace's text (and its bytes, while decoding) was most of
the peak memory. The top level is walked with json's scanner; the `traceEvents` array is cut into runs of
whole events a few MB long, each decoded by msgspec straight into typed records that keep only the fields
read here (`Event`, `Args`: no dict per event, no unread arg decoded), then appended to the columns and
dropped. A cut is only taken where the text before it decodes as whole events, so a `},{` inside a string
cannot split one. A file that cannot be read raises TraceError with one line naming the file and the
reason; the caller reports it and goes on with the other files.

The stages, each its own module: trace_text.py reads the text, trace_json.py walks it and decodes the
events, trace.py's Columns fills the Trace; this module puts them together and names what went wrong.
"""

from __future__ import annotations

import re
from pathlib import Path

from bench.analyze.trace import Columns, Trace
from bench.analyze.trace_json import stream_events
from bench.analyze.trace_text import TextWindow, TooLong, TraceError, text_chunks

__all__ = ["TraceError", "find_trace_files", "load_trace", "trace_rank"]


def load_trace(path: str | Path) -> Trace:
    """Parse one Chrome-trace file (`*.json` or `*.json.gz`) into a Trace; TraceError when it cannot be."""
    path = Path(path)
    columns = Columns()
    text = TextWindow(text_chunks(path))
    try:
        meta = stream_events(text, columns.add)
    except TooLong as exc:
        raise TraceError(f"{path}: not a profiler trace: {exc}") from exc
    except (StopIteration, IndexError) as exc:  # no value where one must be; past the end: cut short
        pos = exc.value if isinstance(exc, StopIteration) else None
        if isinstance(pos, int) and pos < len(text.text):
            what = f"no JSON value at character {text.base + pos}"
        else:
            empty = text.eof and text.base + len(text.text) == 0
            what = "empty" if empty else "cut short: it ends inside a value"
        raise TraceError(f"{path}: not valid JSON ({what})") from exc
    except ValueError as exc:  # the scanner's ways of saying "not JSON here"
        raise TraceError(f"{path}: not valid JSON ({_where(exc, text)})") from exc
    if meta is None:
        raise TraceError(f"{path}: not a Chrome trace: no 'traceEvents' list")
    return columns.trace(path, meta)


def _where(exc: ValueError, text: TextWindow) -> str:
    """What is wrong, and where: json's message at its character of the file, or the walk's own words."""
    pos = getattr(exc, "pos", None)
    return f"{exc.msg} at character {text.base + pos}" if isinstance(pos, int) else str(exc)


_RANK_IN_NAME = re.compile(r"rank[-_]?(\d+)", re.IGNORECASE)


def trace_rank(trace: Trace) -> int | None:
    """The rank: `distributedInfo.rank` in the trace, else `rank<N>` in the file name, else None."""
    info = trace.meta.get("distributedInfo")
    if isinstance(info, dict) and isinstance(info.get("rank"), int):
        return info["rank"]
    m = _RANK_IN_NAME.search(trace.path.name)
    return int(m.group(1)) if m else None


def find_trace_files(folder: Path) -> list[Path]:
    """Every `*.json` / `*.json.gz` file under `folder` (recursively), sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name.endswith((".json", ".json.gz")))
