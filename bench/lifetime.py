"""No process of a launch outlives its launcher, whatever it is doing (Linux).

Two mechanisms, because a SIGKILLed launcher can forward nothing:
- the parent-death signal (prctl PR_SET_PDEATHSIG): torchrun gets SIGKILL when the launcher dies, and
  every rank gets SIGKILL when its torchrun dies — even a rank stuck in a collective, inside C++, without
  the GIL;
- a watchdog thread in every rank polls the launcher's pid (plan's `launcher_pid`) and ends the rank when
  it is gone, for the cases the signal does not reach (a rank whose parent is not the launcher's torchrun).
Both are no-ops where prctl is missing (not Linux); the launcher's own kill_groups still covers Ctrl-C.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
POLL_S = 0.5          # the watchdog's period: a rank is gone within about this long after its launcher


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask the kernel to send `sig` to this process when its parent dies (preexec_fn, or at a rank's
    start). The parent may already be gone between fork and this call: then exit now."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # orphaned already (re-parented to init)
        os.kill(os.getpid(), sig)


def alive(pid: int) -> bool:
    """The process `pid` exists (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
        except PermissionError:
            return True


def watch_launcher(pid: int | None) -> threading.Thread | None:
    """Start a daemon thread that SIGKILLs this process once `pid` (the launcher) is gone."""
    if pid is None:
        return None

    def watch():
        while alive(pid):
            time.sleep(POLL_S)
        os.kill(os.getpid(), signal.SIGKILL)

    thread = threading.Thread(target=watch, name="launcher-watchdog", daemon=True)
    thread.start()
    return thread


def leftovers(run_dir) -> list[int]:
    """Live processes an earlier launch into `run_dir` started and left (its launcher killed before the
    guarantees above existed, or on a system without prctl): the torchrun pids of logs/launch-*.pid and
    the ranks' pids from their hello events, kept only while their command line still names this run's
    launch plans (a reused pid belongs to someone else and is left alone)."""
    import json

    from bench import run_folder

    logs = Path(run_dir) / run_folder.LOGS
    pids = set()
    for pid_file in logs.glob(run_folder.launch_file("*", "pid")):
        try:
            pids.add(int(pid_file.read_text()))
        except (OSError, ValueError):
            continue
    for events in logs.glob(run_folder.launch_file("*", "events.jsonl")):
        for line in events.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            if event.get("event") == "hello":
                pids.add(int(event["pid"]))
    marker = str(logs.resolve())
    found = []
    for pid in sorted(pids):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and alive(pid):
            found.append(pid)
    return found


def stop(pids: list[int]) -> None:
    """SIGKILL each pid (by id only), then wait until they are gone (a few seconds at most)."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)


# ---- stopping a launch: its process group and its workers' (torchrun gives each a session) ----------

TERM_GRACE_S = 5.0     # SIGTERM → SIGKILL grace when a launch is killed


def _children() -> dict[int, list[int]]:
    """ppid → pids of every process, from /proc (Linux)."""
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(ppid, []).append(int(entry))
    return tree


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid`."""
    tree, out, todo = _children(), [], [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def kill_groups(proc: subprocess.Popen, extra_pgids: set[int]) -> None:
    """Stop a launch: SIGTERM, then SIGKILL after a grace period, to the launch's process group and the
    groups of its workers (torchrun starts each worker in a session of its own), by id only."""
    own = os.getpgid(0)
    pgids = {proc.pid, *extra_pgids} | {g for p in descendants(proc.pid) if (g := _pgid(p)) is not None}
    pgids.discard(own)

    def signal_all(sig):
        for pgid in pgids:
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass

    signal_all(signal.SIGTERM)
    deadline = time.monotonic() + TERM_GRACE_S
    while time.monotonic() < deadline and (proc.poll() is None or any(_alive_group(g) for g in pgids)):
        time.sleep(0.05)
    signal_all(signal.SIGKILL)
    proc.wait()


def _alive_group(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
