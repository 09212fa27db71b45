"""What each rank was doing when its launch hung: kept in the run folder, named in the row.

Every rank registers faulthandler on SIGUSR1 (`register`, bench/worker/main.py) into
`hangs/launch-<k>/rank-<R>.stack`; before the watchdog kills a launch that made no progress within
run.cell_timeout_s, the launcher sends SIGUSR1 to every rank it heard from (`dump_stacks`), waits up to
DUMP_WAIT_S for the files, and the `timeout` row then names each rank's innermost frame (`summary`).
faulthandler writes from its C signal handler, so a rank blocked inside a collective (gloo's wait, a CUDA
sync) still answers, which a Python signal handler would not. The launch also gets torch's flight
recorder variables (`env`), so on NCCL a collective timeout dumps every rank's recent collectives
(sequence numbers, names, states) into the same folder; they are set only where the user has not.

The process group's timeout is below the watchdog's limit (run.pg_timeout_s "auto"), so a collective that
never completes is reported by the distributed runtime first: the rank whose collective timed out writes
`rank-<R>.json` (`record_timeout`: which collective, its sequence number on the process group, since when)
and its cell is recorded `timeout` with those words; `bench analyze` reads every rank's record (and NCCL's
flight-recorder dumps) into "rank R stuck in <collective> #seq since <time>".
Reading the records back (`read`, `lines`; `bench analyze` writes hangs.csv, the launcher names them in a
`timeout` row): a rank's `rank-<R>.json`, and NCCL's flight recorder `nccl-trace-rank-<R>`, a pickle of
{"entries": [{collective_seq_id, profiling_name, time_created_ns, state, ...}], ...} as torch's own reader
(torch/distributed/flight_recorder/components/loader.py) reads it: a rank is stuck in its first entry that
did not complete, and the recorder's record wins over the rank's (under NCCL the watchdog ends the process,
so the recorder is often the only one). Ranks stuck at different sequence numbers or in different
collectives are a mismatch: one rank skipped or added a collective.
"""

from __future__ import annotations

import faulthandler
import json
import os
import pickle
import re
import signal
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pandas as pd

HANGS = "hangs"
DIR_ENV = "BENCH_HANG_DIR"   # the launch's folder for these files, set by the launcher for its ranks
DUMP_WAIT_S = 2.0            # how long the launcher waits for the stacks before it kills
FR_ENTRIES = "2000"          # flight-recorder entries per rank (torch's NCCL default): a few steps' worth
_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_open: list = []             # the stack files stay open for faulthandler's C handler
# A collective that outlived the process group's timeout: gloo's words (the timed-out op's own, and "pair
# closure" for a collective on a pair another op's timeout closed: DDP's bucket all-reduces wait in turn, and
# the second often reads this), and NCCL's watchdog's (its Work names the sequence number and the operation:
# "WorkNCCL(SeqNum=8, OpType=ALLREDUCE, ...) ran for ... milliseconds")
TIMED_OUT = re.compile(r"Timed out waiting \d+ ?ms for \w+ operation|Application timeout caused pair closure|"
                       r"collective operation timeout|"
                       r"WorkNCCL\(SeqNum=\d+.*ran for \d+ milliseconds before timing out", re.S)
# gloo's words on the rank whose peer closed their pair (the peer's collective timed out first)
PEER_CLOSED = re.compile(r"Connection closed by peer|Connection reset by peer")
PEER_WAIT_S = 3.0   # how long such a rank waits for the peer's record of its timeout
_NCCL_WORK = re.compile(r"SeqNum=(?P<seq>\d+), OpType=(?P<op>\w+)")
# the Python frames a collective is issued from, innermost first: torch.distributed's own functions, FSDP2's
# gradient reduce-scatter and parameter all-gather
_COLLECTIVE_FRAME = re.compile(r"^(all_reduce|all_gather\w*|reduce_scatter\w*|broadcast\w*|barrier|"
                               r"all_to_all\w*|gather\w*|scatter\w*|reduce|send|recv|"
                               r"foreach_all_gather\w*|foreach_reduce\w*)$")
_state: dict = {}            # this rank's: rank, the process group's timeout (arm)


def launch_dir(run_dir: Path, k: int) -> Path:
    return run_dir / HANGS / f"launch-{k}"


def env(folder: Path) -> dict[str, str]:
    """The variables a launch gets so that its ranks leave their state in `folder` (the user's win)."""
    # NCCL's recorder only: gloo's (TORCH_FR_BUFFER_SIZE) cost 65-160 us on every all-reduce of 4 KiB here
    # (560-590 against 650-720 us, 2 ranks), inside the timed steps, and nothing reads it yet
    wanted = {DIR_ENV: str(folder), "TORCH_NCCL_TRACE_BUFFER_SIZE": FR_ENTRIES,
              "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
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


def arm(rank: int, timeout_s: float, emit=None) -> None:
    """In a rank, once its process group exists: the timeout its collectives run under and how it tells the
    launcher (its events' `emit`) that a collective timed out (record_timeout)."""
    _state.update(rank=rank, timeout_s=timeout_s, emit=emit)


def timed_out(error: BaseException) -> bool:
    """The exception is a collective that outlived the process group's timeout (gloo's or NCCL's words)."""
    return bool(TIMED_OUT.search(str(error)))


def collective_of(error: BaseException) -> tuple[str, int | None]:
    """(the collective, its sequence number) of a timed-out collective: NCCL's Work names both; on gloo the
    innermost frame of the exception's traceback that issues a collective (torch.distributed's function, or
    FSDP2's), else a gradient collective of backward (DDP's bucket all-reduce runs in autograd's callback),
    and the process group's sequence number: the last collective this rank issued on it (the one it waits
    in, when it issued none after)."""
    work = _NCCL_WORK.search(str(error))
    if work:
        return work["op"].lower(), int(work["seq"])
    frames = [f.name for f in traceback.extract_tb(error.__traceback__)][::-1]
    name = next((f for f in frames if _COLLECTIVE_FRAME.match(f)), None)
    if name is None and any("backward" in f for f in frames):
        name = "a gradient collective (backward)"
    name = name or (frames[0] if frames else "a collective")
    try:
        import torch.distributed as dist

        seq = int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
    except (RuntimeError, AttributeError, ValueError):
        seq = None
    return name, seq


def record_timeout(error: BaseException, cell_id: str) -> str:
    """In a rank whose collective timed out: write rank-<R>.json in the launch's hang folder (when there is
    one) and return the words for its cell's row. `since` is when the collective began: the process group's
    timeout before the error (a collective waits that long before it raises)."""
    rank, timeout_s = _state.get("rank", 0), _state.get("timeout_s")
    now = time.time()
    since = now - timeout_s if timeout_s else now
    name, seq = _record(error, cell_id, since, now)
    return (f"rank {rank} stuck in {name}" + (f" #{seq}" if seq is not None else "")
            + f" since {clock(since)}: no peer joined it within the process group's timeout "
            + (f"run.pg_timeout_s={timeout_s:g}s" if timeout_s else "(run.pg_timeout_s)"))


def peer_timed_out(error: BaseException, wait_s: float = PEER_WAIT_S) -> dict | None:
    """gloo: when this rank's collective lost its peer ("Connection closed by peer": the peer's own
    collective timed out first and closed their pair), the peer's record of that timeout, waited for up
    to `wait_s` (the closure can arrive before the peer has written it); None for any other error, or when
    no peer recorded a timeout within the process group's timeout before now (a crash, not a hang)."""
    folder, rank = os.environ.get(DIR_ENV), _state.get("rank", 0)
    if not folder or not PEER_CLOSED.search(str(error)):
        return None
    recent = (_state.get("timeout_s") or 0) + wait_s
    deadline = time.monotonic() + wait_s
    while True:
        for path in Path(folder).glob("rank-*.json"):
            if path.name == f"rank-{rank}.json":
                continue
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if time.time() - float(rec.get("raised", 0)) <= recent:
                return rec
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.05)


def record_lost_peer(error: BaseException, cell_id: str, peer: dict) -> str:
    """In a rank whose collective lost a peer that timed out (peer_timed_out): its own record, without a
    `since` (it raised when the peer left, not after a timeout of its own), and the words for the row."""
    rank, timeout_s = _state.get("rank", 0), _state.get("timeout_s")
    name, seq = _record(error, cell_id, None, time.time())
    theirs = f"{peer.get('collective')}" + (f" #{peer['seq']}" if peer.get("seq") is not None else "")
    return (f"rank {rank} stuck in {name}" + (f" #{seq}" if seq is not None else "")
            + f": its peer rank {peer.get('rank')} left it when its own collective ({theirs}) outlived the "
            + "process group's timeout " + (f"run.pg_timeout_s={timeout_s:g}s" if timeout_s
                                            else "(run.pg_timeout_s)"))


def _record(error: BaseException, cell_id: str, since: float | None, now: float) -> tuple[str, int | None]:
    """Write this rank's rank-<R>.json (when the launch has a hang folder) and emit its `stuck` event."""
    rank, timeout_s = _state.get("rank", 0), _state.get("timeout_s")
    name, seq = collective_of(error)
    record = {"rank": rank, "cell_id": cell_id, "collective": name, "seq": seq, "since": since,
              "raised": now, "timeout_s": timeout_s, "error": str(error).strip().splitlines()[0][:500],
              "traceback": traceback.format_exception(error)[-12:]}
    folder = os.environ.get(DIR_ENV)
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        (Path(folder) / f"rank-{rank}.json").write_text(json.dumps(record, indent=1) + "\n")
    if _state.get("emit"):  # a "stuck" event: the launcher's watchdog hears the rank (its clock starts
        # again), so the rank has run.cell_timeout_s to learn whether its peers failed too and leave
        _state["emit"](event="stuck", rank=rank, cell_id=cell_id, collective=name, seq=seq, since=since)
    return name, seq


def clock(t: float) -> str:
    """A wall-clock instant as the records say it: UTC, to the millisecond."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + " UTC"


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


# --- reading the records back ---------------------------------------------------------------------------
HANGS_FILE = "hangs.csv"
COLUMNS = ["launch", "rank", "cell_id", "collective", "seq", "since", "since_utc", "source", "file"]
_RANK_JSON = re.compile(r"^rank-(\d+)\.json$")
_FR_DUMP = re.compile(r"^nccl-trace-rank-(\d+)$")


class _PlainData(pickle.Unpickler):
    """A flight-recorder dump holds only dicts, lists, strings and numbers: refuse any class (a pickle of
    anything else could run code on load)."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"not a flight-recorder dump: it names {module}.{name}")


def flight_recorder_stuck(path: Path) -> dict | None:
    """The first entry of an NCCL flight-recorder dump that did not complete, as a record; None when every
    entry completed (or the file is no dump)."""
    try:
        with open(path, "rb") as f:
            dump = _PlainData(f).load()
        entries = sorted(dump["entries"], key=lambda e: (e.get("collective_seq_id") or 0))
    except (OSError, pickle.UnpicklingError, EOFError, KeyError, TypeError, AttributeError):
        return None
    open_entries = [e for e in entries if e.get("state") != "completed"]
    if not open_entries:
        return None
    e = open_entries[0]
    since = e.get("time_created_ns")
    return {"collective": str(e.get("profiling_name", "?")).removeprefix("nccl:"),
            "seq": e.get("collective_seq_id"), "since": since / 1e9 if since else None,
            "source": "NCCL flight recorder"}


def read(run_dir: Path) -> pd.DataFrame:
    """One row per launch and rank that left a record of where it was stuck (COLUMNS), launches in order."""
    import pandas as pd  # here: the ranks import this module and never read

    rows: dict[tuple[int, int], dict] = {}
    for folder in sorted((run_dir / HANGS).glob("launch-*")):
        try:
            launch = int(folder.name.split("-")[1])
        except (IndexError, ValueError):
            continue
        for path in sorted(folder.iterdir()):  # the ranks' own records first, then the recorder's
            if (m := _RANK_JSON.match(path.name)) is None:
                continue
            try:
                rec = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            rows[(launch, int(m[1]))] = {"collective": rec.get("collective"), "seq": rec.get("seq"),
                                         "since": rec.get("since"), "cell_id": rec.get("cell_id", ""),
                                         "source": "the rank's process-group timeout", "file": path}
        for path in sorted(folder.iterdir()):
            if (m := _FR_DUMP.match(path.name)) and (rec := flight_recorder_stuck(path)) is not None:
                rows.setdefault((launch, int(m[1])), {}).update(rec | {"file": path})  # the recorder wins
    out = [{"launch": k, "rank": r, "cell_id": v.get("cell_id", ""), **{c: v.get(c) for c in (
            "collective", "seq", "since", "source")},
            "since_utc": clock(v["since"]) if v.get("since") else "",
            "file": str(Path(v["file"]).relative_to(run_dir))} for (k, r), v in sorted(rows.items())]
    frame = pd.DataFrame(out, columns=COLUMNS)
    frame["seq"] = frame["seq"].astype("Int64")
    return frame


def lines(stuck: pd.DataFrame) -> list[str]:
    """"rank R stuck in <collective> #seq since <time>" per row, and per launch whose ranks disagree on the
    collective or its sequence number, that they are a mismatch."""
    import pandas as pd

    out = []
    for launch, rows in stuck.groupby("launch", sort=True):
        for r in rows.itertuples():
            seq = f" #{r.seq}" if pd.notna(r.seq) else ""
            since = f" since {r.since_utc}" if r.since_utc else ""
            cell = f", cell {r.cell_id}" if r.cell_id else ""
            out.append(f"rank {r.rank} stuck in {r.collective}{seq}{since} (launch {launch}{cell}; "
                       f"{r.source})")
        seqs, names = set(rows["seq"].dropna()), set(rows["collective"])
        if len(rows) > 1 and (len(seqs) > 1 or len(names) > 1):
            out.append(f"launch {launch}: the ranks wait in different collectives ("
                       + ", ".join(f"rank {r.rank}: {r.collective}"
                                   + (f" #{r.seq}" if pd.notna(r.seq) else "") for r in rows.itertuples())
                       + "): a collective mismatch, one rank skipped or added a collective")
    return out
