"""A launch's logs: its stdout and stderr copied into logs/launch-<k>.out/.err with a cap (CappedLog), and
read back for why it ended: its last exception line (`tail`) and a worker ended by a signal (`killed_by`).
"""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

from bench.schema import ERROR_TAIL_LINES, error_text

# A launch's stdout and stderr are kept whole up to LOG_HEAD_BYTES each, then only their last LOG_TAIL_BYTES:
# a model that prints every step must not fill the disk (4 cells of one wrote 38 MB of logs), and the end of
# a log (the exception that stopped a launch, which `tail` reads) is always kept. 4 MiB holds a launch's
# start-up, warnings and NCCL INFO lines (NCCL_DEBUG without a file: about 100 lines per rank) many times.
LOG_HEAD_BYTES = 4 * 2**20
LOG_TAIL_BYTES = 2**20
LOG_DRAIN_S = 10.0     # how long a finished launch's logs may take to receive the end of their pipes


# A Python exception's line in a log: "ValueError: ...", "torch.OutOfMemoryError: ..." (torchrun's
# "Root Cause" box and tensor dumps come after it and can fill a tail).
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception|Interrupt)\b(?::.*)?$")


# torchrun's own exception when a rank fails: its line names no cause (that is the rank's exception, printed
# above it in the same log), so a rank's exception line is preferred to it
TORCHRUN_EXCEPTIONS = ("ChildFailedError",)
# torchrun's report of a worker ended by a signal (its ChildFailedError box: "traceback : Signal 9 (SIGKILL)
# received by PID 1234"): the kernel's OOM killer, an operator's kill -9, a node going down
KILLED_BY = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID \d+")


def killed_by(path: Path) -> str | None:
    """"SIGKILL (signal 9)" when the launch's log says a worker was ended by a signal, else None: the root
    cause's (torchrun's "Root Cause (first observed failure)"; the other workers, which torchrun itself then
    stops, are listed before it with SIGTERM)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    root = text.rfind("Root Cause")
    found = KILLED_BY.search(text, root if root >= 0 else 0)
    return f"{found[2]} (signal {found[1]})" if found else None


def tail(path: Path, lines: int = ERROR_TAIL_LINES) -> str:
    """The log's last exception line first (a rank's, rather than torchrun's ChildFailedError that follows
    it), then its last lines ('' when missing)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    all_lines = text.strip().splitlines()
    exceptions = [line.strip() for line in all_lines if EXCEPTION_LINE.match(line.strip())]
    causes = [e for e in exceptions if not any(n in e.split(":")[0] for n in TORCHRUN_EXCEPTIONS)]
    if lines != ERROR_TAIL_LINES:  # an explicit length: just the tail
        return "\n".join(all_lines[-lines:])
    return error_text((causes or exceptions or [None])[-1], all_lines)


class CappedLog(threading.Thread):
    """Copies a launch's pipe into its log file: the first LOG_HEAD_BYTES as they come (a reader of the log
    sees them live), then only the last LOG_TAIL_BYTES, written at the end after a line saying how much was
    left out. The pipe is drained to its end whatever the file does (a full disk), so the launch never
    blocks on its output. Used as a context: leaving it waits (at most LOG_DRAIN_S) for the pipe's end."""

    def __init__(self, pipe, path: Path):
        super().__init__(daemon=True, name=f"log {path.name}")
        self.pipe, self.path = pipe, path
        self.start()

    def run(self) -> None:
        head, tail, dropped = 0, bytearray(), 0
        try:  # unbuffered: a write the disk refuses is dropped then, never again when the file closes
            f = open(self.path, "wb", buffering=0)
        except OSError:  # a full disk: the pipe is drained all the same (the launcher says why it stops)
            f = open(os.devnull, "wb", buffering=0)
        with f:
            for chunk in iter(lambda: self.pipe.read1(1 << 16), b""):
                keep = chunk[:max(0, LOG_HEAD_BYTES - head)]
                head += len(keep)
                tail += chunk[len(keep):]
                if len(tail) > LOG_TAIL_BYTES:
                    dropped += len(tail) - LOG_TAIL_BYTES
                    del tail[:-LOG_TAIL_BYTES]
                if keep:
                    _write(f, keep)
            if dropped:
                _write(f, f"\n[bench: {dropped} bytes of this output left out here (LOG_HEAD_BYTES="
                          f"{LOG_HEAD_BYTES}, LOG_TAIL_BYTES={LOG_TAIL_BYTES}, bench/run/launch_log.py); its "
                          f"last {LOG_TAIL_BYTES} bytes follow]\n".encode())
            _write(f, bytes(tail))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # the pipe ends when the launch's last process does (they have been stopped by now); a process that
        # somehow still holds it costs the log's end, never the launcher's progress
        self.join(timeout=LOG_DRAIN_S)


def _write(f, data: bytes) -> None:
    """Write and flush; a failed write (disk full, read-only) loses only log text, never the launch."""
    try:
        f.write(data)
        f.flush()
    except OSError:
        pass
