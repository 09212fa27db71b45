"""bench.run.nccl_log: the launcher's NCCL debug variables, NCCL's connection lines parsed into transports,
env.json's per-launch entry, NVLink in `nvidia-smi topo -m`; the launcher setting, reading and recording all
of it; and the report's finding when the transport or the all-reduce bandwidth falls short of an NVLink
node's."""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from pathlib import Path

from report_fixtures import H100_ENV, row, write_run

from bench.config import load_config
from bench.matrix import expand
from bench.nvidia import topology_has_nvlink
from bench.report import build_report
from bench.run import nccl_log
from bench.run.launch import Launch
from bench.run.progress import Progress
from bench.run.sweep import Sweep

# Lines as NCCL prints them: "<host>:<pid>:<tid> [<cudaDev>] NCCL INFO " + the format strings quoted in
# bench/run/nccl_log.py's docstring (src/debug.cc; src/transport/{p2p,shm,net,coll_net,nvls}.cc), filled in.
P = "node07:81234:81301 [0] NCCL INFO "
P2P_LINES = [
    P + "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    P + "Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read",
    P + "Channel 02/1 : 0[0] -> 7[7] via P2P/CUMEM",
]
SHM_LINES = [  # 2.18 - 2.28: "via SHM/%s/%s"; the newest NCCL: "via SHM/direct"
    P + "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct",
    P + "Channel 01 : 1[1] -> 0[0] via SHM/direct",
]
NET_LINES = [
    P + "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA",
    P + "Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA",
    P + "Channel 01/0 : 0[0] -> 8[0] [send] via NET/IB/1(3)/GDRDMA(PCI)/Shared",  # PXN: proxy rank 3
    P + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    P + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/AWS Libfabric/0/GDRDMA",  # a plugin's name with a space
]
OTHER_LINES = [
    P + "Channel 00/0 : 0[18000] -> 1[3b000] via P2P/IPC/read",  # before 2.19: bus ids in hex
    P + "Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer/read",
    P + "Channel 03/0 : 0[0] -> 2[2] via P2P/indirect/1[1]",
    P + "CollNet 00/0 : 0 [send] via COLLNET/SHARP/0/GDRDMA",
    P + "NVLS comm 0x5581c1e0 headRank 0 nHeads 8 nvlsRanks 8 buffSize 1048576 nvlsPerRankSize 50331648 "
        "nvlsTotalSize 402653184",
]
NOT_CONNECTIONS = [  # rings, trees and NVLS support are not connections
    P + "Channel 00/24 : 0 1 2 3 4 5 6 7",
    P + "Trees [0] 1/-1/-1->0->-1 [1] 1/-1/-1->0->-1",
    P + "NVLS multicast support is available on dev 0 (NVLS_NCHANNELS 24)",
    P + "24 coll channels, 24 collnet channels, 16 nvls channels, 32 p2p channels, 32 p2p channels per peer",
    P + "Connected all rings, use ring PXN 0 GDR 1",
    "node07:81234:81301 [0] NCCL WARN Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct",  # not INFO
]

EVIDENCE = Path("/work/gpu-evidence/default-1xH100-partial/env.json")
# `nvidia-smi topo -m` of an 8-GPU NVSwitch node (first rows; the tool underlines the header, as in env.json)
TOPO_NVLINK = (
    "\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t0-55,112-167\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tNV18\tNV18\tNV18\tNV18\tNV18\t0-55,112-167\t0\t\tN/A\n\n"
    "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
)
TOPO_PCIE = (
    "\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tSYS\t0-15\t0\t\tN/A\nGPU1\tSYS\t X \t16-31\t1\t\tN/A\n\n"
    "Legend:\n\n  X    = Self\n  NV#  = Connection traversing a bonded set of # NVLinks\n"
)


def test_connection_lines_become_transports():
    counts = nccl_log.count_connections(P2P_LINES + SHM_LINES + NET_LINES + OTHER_LINES + NOT_CONNECTIONS)
    assert counts == Counter({
        "P2P/CUMEM": 3, "SHM": 2, "NET/IB": 3, "NET/Socket": 1, "NET/AWS Libfabric": 1, "P2P/IPC": 1,
        "P2P/direct": 1, "P2P/indirect": 1, "COLLNET/SHARP": 1, "NVLS": 1})
    assert nccl_log.count_connections(NOT_CONNECTIONS) == Counter()


def test_summary_names_each_transport_once_fastest_first():
    assert nccl_log.summary(nccl_log.count_connections(P2P_LINES)) == "P2P/CUMEM"
    assert nccl_log.summary(nccl_log.count_connections(SHM_LINES)) == "SHM"
    assert nccl_log.summary(nccl_log.count_connections(NET_LINES[:2] + P2P_LINES + OTHER_LINES[-1:])) == \
        "NVLS+P2P/CUMEM+NET/IB"
    assert nccl_log.summary(Counter()) is None


def test_debug_env_on_gpu_only_and_never_over_the_users(tmp_path):
    env = nccl_log.debug_env("cuda", tmp_path / "logs", 3, {})
    assert env == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,GRAPH",
                   "NCCL_DEBUG_FILE": str((tmp_path / "logs").resolve() / "nccl-launch-3.%h.%p.log")}
    assert nccl_log.debug_env("cpu", tmp_path, 3, {}) == {}
    for var in nccl_log.DEBUG_VARS:
        assert nccl_log.debug_env("cuda", tmp_path, 3, {var: "x"}) == {}


def test_log_files_expand_host_and_pid(tmp_path):
    for name in ("nccl-launch-2.node07.100.log", "nccl-launch-2.node07.101.log",
                 "nccl-launch-20.node07.1.log", "nccl-launch-2.node07.102.txt"):
        (tmp_path / name).write_text("")
    found = nccl_log.log_files(str(tmp_path / "nccl-launch-2.%h.%p.log"))
    assert sorted(p.name for p in found) == ["nccl-launch-2.node07.100.log", "nccl-launch-2.node07.101.log"]
    old = tmp_path / "fixed.log"
    old.write_text("")
    os.utime(old, (1000.0, 1000.0))
    assert nccl_log.log_files(str(old), since=2000.0) == []  # a user's fixed name, left by an earlier launch
    assert nccl_log.log_files(str(old)) == [old]
    assert nccl_log.log_files(None) == []


def test_record_launch_writes_env_json(tmp_path):
    (tmp_path / "env.json").write_text(json.dumps({"torch": "2.13"}))
    log = tmp_path / "logs" / "nccl-launch-0.node07.5.log"
    log.parent.mkdir()
    log.write_text("\n".join(SHM_LINES + NOT_CONNECTIONS) + "\n")
    vars_ = nccl_log.debug_env("cuda", tmp_path / "logs", 0, {})
    nccl_log.record_launch(tmp_path, 0, 2, [log], vars_)
    env = json.loads((tmp_path / "env.json").read_text())
    assert env["torch"] == "2.13"
    assert env["nccl_transport"]["0"] == {
        "world_size": 2, "transport": "SHM", "connections": {"SHM": 2},
        "log_files": ["logs/nccl-launch-0.node07.5.log"], "set_by": "bench", "debug_vars": vars_}
    assert not list(tmp_path.glob(".env.json*"))


def test_topology_nvlink_from_the_matrix_not_the_legend():
    assert topology_has_nvlink(TOPO_NVLINK)
    assert not topology_has_nvlink(TOPO_PCIE)
    assert not topology_has_nvlink(None)
    if EVIDENCE.is_file():  # the H100 node lent on 2026-11-25: one GPU, so no NVLink between GPUs
        assert not topology_has_nvlink(json.loads(EVIDENCE.read_text())["topology"])


# A stand-in for torchrun + bench.worker: writes NCCL lines where NCCL_DEBUG_FILE says (as NCCL expands it),
# the NCCL variables it was given, and a start and a finish event for every cell of the plan.
FAKE_RANKS = r"""
import json, os, socket, sys, time
plan, events = sys.argv[1], sys.argv[2]
pattern = os.environ.get("NCCL_DEBUG_FILE")
lines = json.loads(os.environ["FAKE_NCCL_LINES"])
if pattern:
    with open(pattern.replace("%h", socket.gethostname()).replace("%p", str(os.getpid())), "w") as f:
        f.write("\n".join(lines) + "\n")
elif os.environ.get("NCCL_DEBUG"):  # NCCL's default: the rank's stdout
    print("\n".join(lines), flush=True)
seen = {v: os.environ.get(v) for v in ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")}
cells = json.load(open(plan))["cells"]
with open(events, "a") as f:
    for c in cells:
        f.write(json.dumps({"event": "start", "t": time.time(), "cell_ids": [c["cell_id"]]}) + "\n")
        f.write(json.dumps({"event": "finish", "t": time.time(), "cell_id": c["cell_id"], "status": "ok",
                            "error": None, "row": {"seen": seen}}) + "\n")
"""


def _fake_launch(tmp_path, monkeypatch, device: str, lines: list[str]):
    overrides = [f"run.device={device}", "matrix.engine=torch", "matrix.world_size=2",
                 "matrix.scaling=strong", "matrix.grad_accum=1", "profile.enabled=false"]
    config = load_config("cpu-smoke", overrides, cuda_available=device == "cuda")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "env.json").write_text("{}")
    script = tmp_path / "fake_ranks.py"
    script.write_text(FAKE_RANKS)
    monkeypatch.setenv("FAKE_NCCL_LINES", json.dumps(lines))
    cells = expand(config)

    def command(self):
        plan = self.logs / f"launch-{self.k}.plan.json"
        plan.write_text(json.dumps({"cells": [c.to_dict() for c in self.pending]}))
        return [sys.executable, str(script), str(plan), str(self.reader.path)]

    monkeypatch.setattr(Launch, "command", command)
    Sweep(config, run_dir, Progress(len(cells), stream=open(os.devnull, "w"))).run(cells)
    records = [json.loads(line) for line in (run_dir / "cells.jsonl").read_text().splitlines()]
    return run_dir, records


def test_launcher_sets_nccl_debug_and_records_the_transport(tmp_path, monkeypatch):
    for var in nccl_log.DEBUG_VARS:
        monkeypatch.delenv(var, raising=False)
    run_dir, records = _fake_launch(tmp_path, monkeypatch, "cuda", SHM_LINES + NOT_CONNECTIONS)
    assert records and all(r["nccl_transport"] == "SHM" for r in records)
    seen = records[0]["seen"]
    assert seen["NCCL_DEBUG"] == "INFO" and seen["NCCL_DEBUG_SUBSYS"] == "INIT,GRAPH"
    assert seen["NCCL_DEBUG_FILE"] == str((run_dir / "logs").resolve() / "nccl-launch-0.%h.%p.log")
    assert len(list((run_dir / "logs").glob("nccl-launch-0.*.log"))) == 1
    entry = json.loads((run_dir / "env.json").read_text())["nccl_transport"]["0"]
    assert entry["world_size"] == 2 and entry["transport"] == "SHM" and entry["set_by"] == "bench"


def test_launcher_keeps_the_users_nccl_debug_and_reads_their_file(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.delenv("NCCL_DEBUG_SUBSYS", raising=False)
    monkeypatch.setenv("NCCL_DEBUG_FILE", str(tmp_path / "mine.%h.%p.txt"))
    run_dir, records = _fake_launch(tmp_path, monkeypatch, "cuda", P2P_LINES)
    assert records[0]["seen"] == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": None,
                                  "NCCL_DEBUG_FILE": str(tmp_path / "mine.%h.%p.txt")}
    assert records[0]["nccl_transport"] == "P2P/CUMEM"
    entry = json.loads((run_dir / "env.json").read_text())["nccl_transport"]["0"]
    assert entry["set_by"] == "user" and entry["transport"] == "P2P/CUMEM"


def test_launcher_reads_the_ranks_output_when_the_users_nccl_debug_names_no_file(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.delenv("NCCL_DEBUG_SUBSYS", raising=False)
    monkeypatch.delenv("NCCL_DEBUG_FILE", raising=False)
    run_dir, records = _fake_launch(tmp_path, monkeypatch, "cuda", NET_LINES[3:4])
    assert records[0]["nccl_transport"] == "NET/Socket"
    entry = json.loads((run_dir / "env.json").read_text())["nccl_transport"]["0"]
    assert entry["log_files"] == ["logs/launch-0.out", "logs/launch-0.err"] and entry["set_by"] == "user"


def test_launcher_on_cpu_sets_no_nccl_variables(tmp_path, monkeypatch):
    for var in nccl_log.DEBUG_VARS:
        monkeypatch.delenv(var, raising=False)
    run_dir, records = _fake_launch(tmp_path, monkeypatch, "cpu", P2P_LINES)
    assert records[0]["seen"] == dict.fromkeys(nccl_log.DEBUG_VARS)
    assert records[0]["nccl_transport"] is None
    assert "nccl_transport" not in json.loads((run_dir / "env.json").read_text())


# ---- the report's finding: a slow transport or a busbw far below the NVLink node's ----------------------
def _transport_run(tmp_path, transport: str, busbw: float, topology: str = TOPO_NVLINK):
    rows = []
    for ws, t, bw in ((1, "", 0.0), (2, transport, busbw)):
        r = row("torch", ws, 10.0)
        r.update(nccl_transport=t, allreduce_busbw_gbps=bw, allreduce_bytes=25 * 2**20,
                 gpu_name="NVIDIA H100 80GB HBM3")
        rows.append(r)
    env = H100_ENV | {"topology": topology, "gpu_count": 8}
    return build_report(write_run(tmp_path / "results" / "run", rows, env), tmp_path / "out")


def test_report_flags_shm_on_an_nvlink_node(tmp_path):
    md = (_transport_run(tmp_path, "SHM", 12.0).parent / "summary.md").read_text()
    assert ("At 2 ranks NCCL connected the GPUs via SHM although `nvidia-smi topo -m` shows NVLink between "
            "them; all-reduce bus bandwidth 12.0 GB/s at 25.0 MiB against ≈251 GB/s for the h100-nvlink "
            "preset") in md
    assert "--gpu-bind=none" in md


def test_report_flags_busbw_far_below_the_nvlink_preset(tmp_path):
    md = (_transport_run(tmp_path, "P2P/CUMEM", 40.0).parent / "summary.md").read_text()
    assert "At 2 ranks the all-reduce bus bandwidth is far below the NVLink node's (NCCL transport " \
           "P2P/CUMEM); all-reduce bus bandwidth 40.0 GB/s" in md


def test_report_says_nothing_for_a_healthy_or_pcie_node(tmp_path):
    healthy = (_transport_run(tmp_path / "a", "P2P/CUMEM", 180.0).parent / "summary.md").read_text()
    pcie = (_transport_run(tmp_path / "b", "SHM", 12.0, TOPO_PCIE).parent / "summary.md").read_text()
    for md in (healthy, pcie):
        assert "NCCL connected the GPUs via" not in md and "far below the NVLink" not in md
