"""Which transport NCCL chose: the launcher's NCCL debug variables, and the parser of NCCL's INFO log.

NCCL says how each pair of ranks is connected only in its INFO log, one line per connection, when the
connection is made (at the first collective that needs it). The formats, from NVIDIA/nccl (read at tags
v2.18.1-1, v2.21.5-1, v2.28.9-1 and commit 5067397c, June 2026), after the prefix
"<host>:<pid>:<tid> [<cudaDev>] NCCL INFO " (src/debug.cc):

    src/transport/p2p.cc   "Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/direct pointer%s"   (same process)
                           "Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/%s%s%s"   CUMEM|MNNVL, /read, /CE
                           "Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/IPC%s%s"  (legacy CUDA IPC)
                           "Channel %02d/%01d : %d[%d] -> %d[%d] via P2P/indirect/%d[%d]%s"
    src/transport/shm.cc   "Channel %02d : %d[%d] -> %d[%d] via SHM/%s/%s"  (direct|CE twice; no /conn index;
                           the newest NCCL drops the second: "via SHM/direct")
    src/transport/net.cc   "Channel %02d/%d : %d[%d] -> %d[%d] [send] via NET/%s/%d%s%s%s"  (net name: IB,
                           Socket or a plugin's; /GDRDMA; (PCI); /Shared; "[receive]" on the other side;
                           "%d(%d)" when a proxy rank (PXN) sends)
    src/transport/coll_net.cc  "CollNet %02d/%1d : %d [send] via COLLNET/%s/%d%s%s"
    src/transport/nvls.cc  "NVLS comm %p headRank %d nHeads %d nvlsRanks %d buffSize %zu ..." when NVLink
                           SHARP buffers are set up (at init, or at the first collective that uses NVLS)

Before 2.19 the device in brackets was the bus id in hex (`%lx`). All of them are logged under the INIT
subsystem, so NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS=INIT,GRAPH writes them (GRAPH adds the rings and
trees NCCL searched). NCCL_DEBUG_FILE expands %h (host) and %p (pid) and is line-buffered, so a file can be
read while the ranks run. Nothing here imports torch: the report reads it too.
"""

from __future__ import annotations

import glob
import json
import os
import re
import time
from collections import Counter
from pathlib import Path

from bench import run_folder

DEBUG_VARS = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
DEBUG_SUBSYS = "INIT,GRAPH"
ENV_KEY = "nccl_transport"  # env.json: per launch, what NCCL connected (see record_launch)

# A connection line: the text after "via". Device ids are decimal (nvmlDev) or hex bus ids (before 2.19).
_CONNECTION = re.compile(
    r"NCCL INFO (?:Channel \d+(?:/\d+)? : \d+\[[0-9a-fA-F]+\] -> \d+\[[0-9a-fA-F]+\]|CollNet \d+/\d+ : \d+)"
    r"(?: \[(?:send|receive)\])? via (?P<via>\S.*?)\s*$")
_NVLS = re.compile(r"NCCL INFO NVLS comm \S+ headRank -?\d+ nHeads \d+")
# Order of the transports in a summary: fastest class first.
_ORDER = ("NVLS", "P2P", "SHM", "NET", "COLLNET")


def debug_env(device: str, logs: Path, k: int, environ: dict[str, str]) -> dict[str, str]:
    """The NCCL debug variables launch k adds: INFO for INIT,GRAPH into logs/nccl-launch-<k>.%h.%p.log (one
    file per rank, not the ranks' stderr). None on CPU (gloo), and none when the user set any of DEBUG_VARS:
    theirs are kept as they are (their file, if any, is parsed)."""
    if device != "cuda" or any(v in environ for v in DEBUG_VARS):
        return {}
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": DEBUG_SUBSYS,
            "NCCL_DEBUG_FILE": str(logs.resolve() / run_folder.nccl_log_file(k))}


def log_files(pattern: str | None, since: float | None = None) -> list[Path]:
    """The files an NCCL_DEBUG_FILE pattern names (%h and %p match any host and pid, %% is %), oldest
    first; with `since`, only those written at or after it (a fixed name is rewritten by every launch)."""
    if not pattern:
        return []
    out, i = [], 0
    while i < len(pattern):
        c = pattern[i]
        if c == "%" and i + 1 < len(pattern):
            nxt = pattern[i + 1]
            out.append("*" if nxt in "hp" else "%" if nxt == "%" else glob.escape(c + nxt))
            i += 2
            continue
        out.append(glob.escape(c))
        i += 1
    files = []
    for name in glob.glob("".join(out)):
        path = Path(name)
        try:
            mtime = path.stat().st_mtime
        except OSError:
            continue
        if path.is_file() and (since is None or mtime >= since - 1.0):  # 1 s: coarse file-system clocks
            files.append((mtime, path))
    return [p for _, p in sorted(files)]


def transport_of(via: str) -> str:
    """The transport class of one connection's "via ..." text: P2P/CUMEM, P2P/IPC, P2P/MNNVL, P2P/direct,
    P2P/indirect, NET/<net name> (NET/IB, NET/Socket), COLLNET/<name>; else its first word (SHM)."""
    parts = via.split("/")
    head = parts[0]
    if head == "P2P" and len(parts) > 1:
        return "P2P/direct" if parts[1].startswith("direct") else f"P2P/{parts[1]}"
    if head in ("NET", "COLLNET") and len(parts) > 1:
        return f"{head}/{parts[1]}"
    return head


def count_connections(lines) -> Counter:
    """Connections per transport class in NCCL INFO log lines; NVLS counts its buffer set-ups."""
    counts: Counter = Counter()
    for line in lines:
        if "NCCL INFO" not in line:
            continue
        m = _CONNECTION.search(line)
        if m:
            counts[transport_of(m.group("via"))] += 1
        elif _NVLS.search(line):
            counts["NVLS"] += 1
    return counts


def summary(counts: Counter) -> str | None:
    """"P2P/CUMEM", "NVLS+P2P/CUMEM", "SHM", "NET/IB+P2P/CUMEM", ...: the transports seen, fastest class
    first; None when the log shows no connection (world size 1, gloo, or NCCL_DEBUG below INFO)."""
    if not counts:
        return None

    def key(name):
        head = name.split("/")[0]
        return (_ORDER.index(head) if head in _ORDER else len(_ORDER), name)

    return "+".join(sorted(counts, key=key))


def parse_files(files: list[Path]) -> Counter:
    counts: Counter = Counter()
    for path in files:
        try:
            with open(path, errors="replace") as f:
                counts += count_connections(f)
        except OSError:
            continue
    return counts


def plan_run_logs(run_dir: Path, world_size: int) -> list[Path]:
    """A plan run's NCCL logs of one world size (`bench slurm`'s script writes them under LOGS as
    run_folder.nccl_plan_log_file), oldest first."""
    return log_files(str(run_dir / run_folder.LOGS / run_folder.nccl_plan_log_file(world_size)))


def plan_run_vars(run_dir: Path, world_size: int) -> dict[str, str]:
    """The debug variables `bench slurm`'s script sets for that world size (what env.json records)."""
    pattern = run_dir.resolve() / run_folder.LOGS / run_folder.nccl_plan_log_file(world_size)
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": DEBUG_SUBSYS, "NCCL_DEBUG_FILE": str(pattern)}


def record_launch(run_dir: Path, k: int | str, world_size: int, files: list[Path],
                  debug_vars: dict[str, str]) -> dict:
    """Write launch k's transports into env.json[ENV_KEY][str(k)] (k: a launch's number, or a plan run's
    `ws<W>`; the file atomically replaced) and return
    the entry: world_size, transport (summary), connections per transport, the log files (relative to the run
    folder when inside it), and the debug variables (`set_by`: bench, or the user's own)."""
    counts = parse_files(files)
    entry = {
        "world_size": world_size,
        "transport": summary(counts),
        "connections": dict(sorted(counts.items())),
        "log_files": [_relative(p, run_dir) for p in files],
        "set_by": "bench" if debug_vars else "user",
        "debug_vars": debug_vars or {v: os.environ[v] for v in DEBUG_VARS if v in os.environ},
    }
    path = run_dir / run_folder.ENV
    try:
        env = json.loads(path.read_text())
    except (OSError, ValueError):
        return entry
    env.setdefault(ENV_KEY, {})[str(k)] = entry
    tmp = path.with_name(f".env.json.{os.getpid()}.{time.monotonic_ns()}.tmp")
    tmp.write_text(json.dumps(env, indent=2) + "\n")
    os.replace(tmp, path)
    return entry


def _relative(path: Path, run_dir: Path) -> str:
    try:
        return path.resolve().relative_to(run_dir.resolve()).as_posix()
    except ValueError:
        return str(path)
