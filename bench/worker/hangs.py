"""What each rank was doing when its launch hung: kept in the run folder, named in the row.

Every rank registers faulthandler on SIGUSR1 (`register`, bench/worker/main.py) into
`hangs/launch-<k>/rank-<R>.stack`; before the watchdog kills a launch that made no progress within
run.cell_timeout_s, the launcher sends SIGUSR1 to every rank it heard from (`dump_stacks`), waits up to
DUMP_WAIT_S for the files, and the `timeout` row then names each rank's innermost frame (`summary`).
faulthandler writes from its C signal handler, so a rank blocked inside a collective (gloo's wait, a CUDA
sync) still answers, which a Python signal handler would not. The launch also gets torch's flight
recorder variables (`env`), so on NCCL a collective timeout dumps every rank's recent collectives
(sequence numbers, names, states) into the same folder; they are set only where the user has not.
"""

from __future__ import annotations

import faulthandler
import os
import re
import signal
import time
from pathlib import Path

HANGS = "hangs"
DIR_ENV = "BENCH_HANG_DIR"   # the launch's folder for these files, set by the launcher for its ranks
DUMP_WAIT_S = 2.0            # how long the launcher waits for the stacks before it kills
FR_ENTRIES = "2000"          # flight-recorder entries per rank (torch's NCCL default): a few steps' worth
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_open: list = []             # the stack files stay open for faulthandler's C handler


def launch_dir(run_dir: Path, k: int) -> Path:
    return run_dir / HANGS / f"launch-{k}"


def env(folder: Path) -> dict[str, str]:
    """The variables a launch gets so that its ranks leave their state in `folder` (the user's win)."""
    # NCCL's recorder only: gloo's (TORCH_FR_BUFFER_SIZE) cost 65-160 us on every all-reduce of 4 KiB here
    # (560-590 against 650-720 us, 2 ranks), inside the timed steps, and nothing reads it yet
    wanted = {DIR_ENV: str(folder), "TORCH_NCCL_TRACE_BUFFER_SIZE": FR_ENTRIES, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
              # NCCL appends the rank to this prefix
              "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(folder / "nccl-trace-rank-")}
    return {k: v for k, v in wanted.items() if k == DIR_ENV or k not in os.environ}


def register(rank: int) -> Path | None:
    """In a rank: SIGUSR1 writes every thread's Python stack to rank-<R>.stack (no launcher: nothing)."""
    folder = os.environ.get(DIR_ENV)
    if not folder:
        return None
    path = Path(folder) / f"rank-{rank}.stack"
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(path, "w")  # noqa: SIM115 - held open for the signal handler, closed at exit
    _open.append(handle)
    faulthandler.register(signal.SIGUSR1, file=handle, all_threads=True, chain=False)
    return path


def dump_stacks(pids: dict[int, int], folder: Path, wait_s: float = DUMP_WAIT_S) -> None:
    """In the launcher: signal each rank (rank → pid) and wait until every stack file has a frame."""
    for pid in pids.values():
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and not all(innermost(folder / f"rank-{r}.stack") for r in pids):
        time.sleep(0.05)


def innermost(path: Path) -> str | None:
    """'func (file.py:line)' of the main thread's innermost frame in a faulthandler dump, or None."""
    text = path.read_text(errors="replace") if path.is_file() else ""
    blocks = re.split(r"\n(?=(?:Current thread|Thread) 0x)", text)
    main = next((b for b in blocks if b.startswith("Current thread")), blocks[0] if blocks else "")
    for line in main.splitlines():
        m = _FRAME.match(line)
        if m:
            return f"{m['func']} ({Path(m['file']).name}:{m['line']})"
    return None


def summary(run_dir: Path, folder: Path) -> str:
    """'rank 0 in wait (…); rank 1 in inject_fault (…); stacks: hangs/launch-0/' ("" without dumps)."""
    ranks = sorted(folder.glob("rank-*.stack"), key=lambda p: int(p.stem.split("-")[1]))
    parts = [f"rank {p.stem.split('-')[1]} in {where}" for p in ranks if (where := innermost(p))]
    if not parts:
        return ""
    return "; ".join(parts) + f"; every rank's stack: {folder.relative_to(run_dir)}/"
