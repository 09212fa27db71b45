"""A real one-host SLURM cluster for the tests: munged + slurmctld + slurmd (Debian's slurm-wlm and munge),
every file of it — slurm.conf, state, spool, pid files, logs, the munge socket and key — in one temporary
folder, found by the client commands through SLURM_CONF.

The node has FAKE_GPUS GPUs for SLURM's GRES plugin: character devices this fixture makes in its folder
(mknod, /dev/null's and /dev/zero's numbers), so SLURM schedules, binds and sets CUDA_VISIBLE_DEVICES for
them as for real ones (nothing opens them); where mknod is not allowed the node has none, and the yielded
environment says how many (TEST_GPUS_ENV).

`local_slurm()` starts it, waits until the node is idle, yields the environment the commands need, and
cancels its jobs, stops exactly the three daemons it started (by the pids in their pid files) and any
job step of this cluster a cancel left (by pid), then removes the folder — also when a test or the start
fails. `missing()` says why it cannot run here (no packages, not root); the `slurm` fixture skips with
that reason.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.lifetime import alive

COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "scancel", "squeue", "sinfo",
            "runuser")
MEMORY_MB = 4096       # the node's RealMemory: below any test machine's, so slurmd does not drain it
START_TIMEOUT_S = 30   # until the node is idle
STOP_TIMEOUT_S = 10    # SIGTERM → SIGKILL grace per daemon
FAKE_GPUS = ((1, 3), (1, 5))  # (major, minor) of each fake GPU device: /dev/null's and /dev/zero's
TEST_GPUS_ENV = "DDPBENCH_TEST_CLUSTER_GPUS"  # in the yielded environment: the node's GPUs (0: none made)


def missing() -> str | None:
    """Why a local cluster cannot start here, or None."""
    absent = [c for c in COMMANDS if shutil.which(c) is None]
    if absent:
        return f"needs slurm-wlm and munge (missing: {', '.join(absent)}; scripts/install_system_packages.sh)"
    if os.geteuid() != 0:
        return "needs root: slurmd and munged run as root and munge here"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "needs the munge user (Debian's munge package creates it)"
    return None


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def fake_gpus(root: Path, host: str) -> int:
    """FAKE_GPUS character devices in root/gpus and the gres.conf naming them; 0 (and no gres.conf) where
    this process may not make devices (no CAP_MKNOD)."""
    folder = root / "gpus"
    folder.mkdir()
    try:
        for i, (major, minor) in enumerate(FAKE_GPUS):
            os.mknod(folder / f"nvidia{i}", 0o600 | stat.S_IFCHR, os.makedev(major, minor))
    except OSError:
        return 0
    files = f"{folder}/nvidia[0-{len(FAKE_GPUS) - 1}]"
    (root / "gres.conf").write_text(f"NodeName={host} Name=gpu File={files}\n")
    return len(FAKE_GPUS)


def slurm_conf(root: Path, host: str, cpus: int, gpus: int = 0) -> str:
    """The cluster's configuration. KillWait=2: scancel's SIGTERM → SIGKILL grace (30 s by default).
    MinJobAge=4: `sbatch --wait` polls every 2 s only while that is under MinJobAge / 2, else every 8,
    then 32 s (slurm's sbatch.c _job_wait): with the default 300 a 12 s job took 42 s to return."""
    ctld, slurmd = free_ports(2)
    return f"""\
ClusterName=ddpbench-test
SlurmctldHost={host}
SlurmUser=root
SlurmdUser=root
SlurmctldPort={ctld}
SlurmdPort={slurmd}
AuthType=auth/munge
AuthInfo=socket={root}/munge/munge.socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
KillWait=2
MinJobAge=4
{"GresTypes=gpu" if gpus else ""}
NodeName={host} CPUs={cpus} RealMemory={MEMORY_MB}{f" Gres=gpu:{gpus}" if gpus else ""} State=UNKNOWN
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def _stop(pids: list[int]) -> None:
    """SIGTERM to each process by its id, then SIGKILL to those still there after STOP_TIMEOUT_S."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _step_sessions(root: Path) -> list[int]:
    """The sessions of this cluster's job steps: slurmstepd (which slurmd starts in a session of its own,
    re-parented to init, its environment cleared) whose working directory is this cluster's folder."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if Path(f"/proc/{entry}/comm").read_text().strip() != "slurmstepd":
                continue
            if Path(os.readlink(f"/proc/{entry}/cwd")) == root:
                out.append(os.getsid(int(entry)))
        except (OSError, ProcessLookupError):
            continue
    return sorted(set(out))


def _in_sessions(sids: list[int]) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) in sids:
                    out.append(int(entry))
            except (ProcessLookupError, PermissionError):
                continue
    return out


def _cancel_jobs(env: dict[str, str]) -> None:
    """scancel every job of this cluster and wait (KillWait + a margin) until none is left."""
    subprocess.run(["scancel", "--user", "root"], env=env, timeout=10, capture_output=True)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while time.monotonic() < deadline:
        out = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, env=env,
                             timeout=10)
        if out.returncode != 0 or not out.stdout.strip():
            return
        time.sleep(0.2)


@contextlib.contextmanager
def local_slurm() -> Iterator[dict[str, str]]:
    """A running one-node cluster; yields the environment for its commands (SLURM_CONF)."""
    root = Path(tempfile.mkdtemp(prefix="ddpbench-slurm-"))
    root.chmod(0o755)  # munged (user munge) must reach root/munge
    host = socket.gethostname().split(".")[0]
    started: dict[str, int] = {}
    try:
        for sub in ("state", "spool"):
            (root / sub).mkdir()
        munge_dir = root / "munge"
        munge_dir.mkdir(mode=0o700)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))  # this cluster's own key
        key.chmod(0o400)
        munge = pwd.getpwnam("munge")
        for path in (munge_dir, key):
            os.chown(path, munge.pw_uid, munge.pw_gid)
        conf = root / "slurm.conf"
        gpus = fake_gpus(root, host)
        conf.write_text(slurm_conf(root, host, os.cpu_count() or 1, gpus))
        env = os.environ | {"SLURM_CONF": str(conf), TEST_GPUS_ENV: str(gpus)}
        subprocess.run(["runuser", "-u", "munge", "--", "munged", "--socket", str(munge_dir / "munge.socket"),
                        "--key-file", str(key), "--pid-file", str(munge_dir / "munged.pid"),
                        "--log-file", str(munge_dir / "munged.log"), "--seed-file",
                        str(munge_dir / "munged.seed"), "--force"], check=True, timeout=20)
        started["munged"] = _wait_pid(munge_dir / "munged.pid")
        subprocess.run(["slurmctld", "-c"], check=True, timeout=20, env=env)  # -c: no saved state
        started["slurmctld"] = _wait_pid(root / "slurmctld.pid")
        subprocess.run(["slurmd"], check=True, timeout=20, env=env)
        started["slurmd"] = _wait_pid(root / "slurmd.pid")
        _wait_idle(env, root)
        yield env
    finally:
        if "slurmd" in started:
            _cancel_jobs(env)
        steps = _in_sessions(_step_sessions(root))  # what a cancel left (none, normally)
        _stop(list(started.values()) + steps)
        shutil.rmtree(root, ignore_errors=True)


def _wait_pid(path: Path, timeout_s: float = 10) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = _read_pid(path)
        if pid and alive(pid):
            return pid
        time.sleep(0.05)
    raise RuntimeError(f"{path.name}: no live pid after {timeout_s:g} s")


def _wait_idle(env: dict[str, str], root: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, env=env, timeout=10)
        state = out.stdout.strip()
        if state == "idle":
            return
        time.sleep(0.2)
    logs = "\n".join((root / f).read_text(errors="replace")[-1500:] for f in ("slurmctld.log", "slurmd.log")
                     if (root / f).exists())
    raise RuntimeError(f"the node is {state!r}, not idle, after {START_TIMEOUT_S} s:\n{logs}")


@pytest.fixture(scope="module")
def slurm():
    """The local cluster's environment (SLURM_CONF) for a test module; skipped with the reason it cannot
    run here."""
    reason = missing()
    if reason:
        pytest.skip(reason)
    with local_slurm() as env:
        yield env
