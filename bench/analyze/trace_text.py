"""Reading a trace file's text (the loader's first stage, bench/analyze/load.py): a few MB at a time,
gunzipped when it is gzip and decoded as UTF-8 on the way, never whole; and the window of it a parse scans,
refilled as the scan moves on, with a bound on how long one value may be."""

from __future__ import annotations

import codecs
import gzip
import json
import re
import zlib
from collections.abc import Iterator
from pathlib import Path


class TraceError(Exception):
    """A trace file that cannot be analysed (unreadable, corrupt, not a Chrome trace)."""


CHUNK_BYTES = 1 << 22  # bytes read (after gunzip) at a time
AHEAD = 1 << 16        # text kept ahead of a scan (unless the file ends first): no number is cut in two
# The longest single value (an event, a top-level key's value) held to parse it: a profiler's events are
# hundreds of bytes; a 300 KB gzip holding one 300 MB event took 1 GB before this bound (issue 45).
MAX_VALUE_CHARS = 1 << 25  # 32 Mi characters


class TooLong(ValueError):
    """A single value of the trace longer than MAX_VALUE_CHARS."""


def text_chunks(path: Path) -> Iterator[str]:
    """The file's text, CHUNK_BYTES at a time: gunzipped when it is gzip (by its magic number, not its
    name), decoded as UTF-8 incrementally (a character split between two reads is kept whole)."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc
    with fh:
        zipped = fh.read(2) == b"\x1f\x8b"
        fh.seek(0)
        stream = gzip.GzipFile(fileobj=fh) if zipped else fh
        decoder = codecs.getincrementaldecoder("utf-8")()
        while True:
            try:
                block = stream.read(CHUNK_BYTES)
            except (EOFError, OSError, zlib.error) as exc:  # truncated: EOFError; corrupt: BadGzipFile, zlib
                if zipped:
                    raise TraceError(f"{path}: corrupt or truncated gzip: {exc}") from exc
                raise TraceError(f"{path}: cannot read: {exc}") from exc
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                raise TraceError(f"{path}: not UTF-8 text: {exc}") from exc
            if text:
                yield text
            if not block:
                return


_SPACE = re.compile(r"[ \t\n\r]*")


class TextWindow:
    """The part of a file's text being parsed: `text` starts at character `base` of the file. Scans refill
    it so that at least AHEAD characters (or the rest of the file) lie ahead; a value longer than what is
    held (an event straddling two reads) is retried with the next chunk appended."""

    def __init__(self, chunks: Iterator[str]):
        self.chunks, self.text, self.base, self.eof = chunks, "", 0, False
        self.scan_once = json.JSONDecoder().scan_once

    def _next(self) -> str:
        chunk = next(self.chunks, None)
        if chunk is None:
            self.eof = True
            return ""
        return chunk

    def ensure(self, pos: int, ahead: int | None = None) -> int:
        """Keep the text from pos on, with at least `ahead` (default AHEAD) characters after it unless the
        file ends first; returns pos in the kept text."""
        ahead = AHEAD if ahead is None else ahead
        if self.eof or len(self.text) - pos >= ahead:
            return pos
        parts, held = [self.text[pos:]], len(self.text) - pos
        while held < max(CHUNK_BYTES, 2 * ahead) and not self.eof:
            parts.append(self._next())
            held += len(parts[-1])
        self.base += pos
        self.text = "".join(parts)
        return 0

    def more(self) -> None:
        """Append the next chunk to what is held (TooLong past MAX_VALUE_CHARS: one value that long)."""
        if len(self.text) > MAX_VALUE_CHARS:
            raise TooLong(f"one value longer than {MAX_VALUE_CHARS >> 20} Mi characters from character "
                          f"{self.base}: no profiler writes one")
        self.text += self._next()

    def scan(self, pos: int):
        """(value, end) of the JSON value at pos (pos is valid in the text after ensure)."""
        pos = self.ensure(pos)
        while True:
            try:
                return self.scan_once(self.text, pos)
            except (StopIteration, ValueError):
                if self.eof:
                    raise
                self.more()  # cut off by the end of what is held: read on, then retry

    def skip(self, pos: int) -> int:
        """The first non-whitespace position at or after pos (len(text) at the file's end)."""
        pos = self.ensure(pos)
        end = _SPACE.match(self.text, pos).end()
        while end == len(self.text) and not self.eof:
            pos = self.ensure(end)
            end = _SPACE.match(self.text, pos).end()
        return end

    def at(self, pos: int) -> str:
        return self.text[pos]  # IndexError past the end: not valid JSON

    def done(self, pos: int) -> bool:
        pos = self.skip(pos)
        return pos == len(self.text) and self.eof
