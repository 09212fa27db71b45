"""`bench run --collect`: the records of a plan run (the user's own torchrun or srun, `bench slurm`), built
from its workers' events files, and env.json merged from its nodes' fingerprints.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from bench import run_folder
from bench.config import ConfigError, config_from_dict, read_tables
from bench.matrix import Cell
from bench.run import nccl_log, results
from bench.run.folder import lock_run_dir
from bench.worker.events import EventReader


@dataclass(frozen=True)
class Collected:
    """What a collect found: cells newly recorded, cells of the plan not run yet, the nodes' host names."""

    added: int
    missing: int
    nodes: list[str]


def collect(run_dir: Path) -> Collected:
    """Record the finished (or failed) cells found in run_dir's events/*.jsonl that cells.jsonl lacks,
    rewrite results.csv and merge env.json; ConfigError when run_dir is not a plan run's folder (nothing
    written) or another process holds it. Holds the folder's lock while it writes."""
    missing = [name for name in (run_folder.CONFIG, run_folder.PLAN) if not (run_dir / name).is_file()]
    if missing:  # checked before the lock file is made: a wrong folder is left as it was
        raise ConfigError(f"--collect={str(run_dir)!r}: no {' or '.join(missing)} there; --collect takes a "
                          "folder written by --plan-only")
    by_id = plan_cells(run_dir)  # a broken plan is refused before the lock file is made
    try:
        lock = lock_run_dir(run_dir)
        try:
            return _collect(run_dir, by_id)
        finally:
            lock.close()
    except (OSError, ValueError) as e:  # ConfigError (the lock) included
        raise ConfigError(f"--collect={str(run_dir)!r}: {e}") from None


def plan_cells(run_dir: Path) -> dict[str, Cell]:
    """plan.json's cells by id; ConfigError naming plan.json and what is wrong (not JSON, no cell list, a
    cell without one of the fields every cell has)."""
    path = run_dir / run_folder.PLAN
    try:
        plan = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConfigError(f"{path}: not a readable plan ({e})") from None
    cells = plan.get("cells") if isinstance(plan, dict) else None
    if not isinstance(cells, list):
        raise ConfigError(f"{path}: cells={str(cells)[:80]!r}: expected the list of the plan's cells")
    required = [f.name for f in dataclasses.fields(Cell)
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    by_id = {}
    for i, c in enumerate(cells):
        missing = [k for k in ("cell_id", *required) if k not in c] if isinstance(c, dict) else ["(a table)"]
        if missing:
            name = c.get("cell_id", f"#{i}") if isinstance(c, dict) else f"#{i}"
            raise ConfigError(f"{path}: cell {name} lacks {', '.join(missing)} (every planned cell has "
                              f"{', '.join(required)}); re-plan it with --plan-only")
        by_id[c["cell_id"]] = Cell.from_dict(c)
    return by_id


def events_of(path: Path) -> list[dict]:
    """The events of one workers' file; ConfigError naming the file for a line that is not an event."""
    events = EventReader(path).read()
    for ev in events:
        kind = ev.get("event") if isinstance(ev, dict) else None
        needs = {"finish": {"cell_id": str, "status": str, "row": dict, "t": (int, float)},
                 "traced": {"cell_id": str, "trace_dir": str},
                 "error": {"cell_ids": list, "status": str, "error": str, "t": (int, float)}}.get(kind, {})
        if not isinstance(kind, str) or any(not isinstance(ev.get(k), t) for k, t in needs.items()):
            raise ConfigError(f"{path}: {json.dumps(ev)[:120]} is not an event of bench.worker")
    return events


def _collect(run_dir: Path, by_id: dict[str, Cell]) -> Collected:
    config = config_from_dict(read_tables(run_dir / run_folder.CONFIG))
    done = {r["cell_id"] for r in results.read_records(run_dir)}
    # per cell, its finish event, else the earliest error event of a rank that failed itself (a `peer` event
    # only says that another rank's group failed; a later error is usually a peer's timeout in a collective
    # with the rank that failed first)
    outcomes: dict[str, dict] = {}
    traces: dict[str, str] = {}
    for path in sorted((run_dir / run_folder.EVENTS).glob("*.jsonl")):
        for ev in events_of(path):
            ids = ev.get("cell_ids") or [ev.get("cell_id")]
            if ev["event"] == "finish":
                outcomes[ev["cell_id"]] = ev
            elif ev["event"] == "error" and ev.get("phase") != "profile":
                for cell_id in ids:
                    known = outcomes.get(cell_id)
                    if known is None or _precedence(known) > _precedence(ev):
                        outcomes[cell_id] = ev
            elif ev["event"] == "traced":
                traces[ev["cell_id"]] = ev["trace_dir"]
    # NCCL's INFO logs per world size (`bench slurm`'s script writes them): the transports it chose
    logs = {ws: nccl_log.plan_run_logs(run_dir, ws) for ws in sorted({c.world_size for c in by_id.values()})}
    transport = {ws: nccl_log.summary(nccl_log.parse_files(files)) for ws, files in logs.items()}
    added = 0
    for cell_id, cell in by_id.items():
        if cell_id in outcomes and cell_id not in done:
            record = results.record_from_event(cell, config, outcomes[cell_id])
            if cell_id in traces:
                record = results.record_with_traces(record, traces[cell_id])
            record["nccl_transport"] = record.get("nccl_transport") or transport[cell.world_size]
            results.append_record(run_dir, record)
            added += 1
    results.write_csv(run_dir)
    nodes = merge_node_envs(run_dir)
    for ws, files in logs.items():  # after the merge, which rewrites env.json from the nodes' own
        if files:
            nccl_log.record_launch(run_dir, f"ws{ws}", ws, files, nccl_log.plan_run_vars(run_dir, ws))
    missing = [i for i in by_id if i not in done and i not in outcomes]
    return Collected(added=added, missing=len(missing), nodes=nodes)


def _precedence(error_event: dict) -> tuple[bool, float]:
    """Which error event of a cell says why it failed: a rank's own before a `peer`'s, earliest first."""
    return bool(error_event.get("peer")), error_event["t"]


# env.json keys that describe the plan rather than a machine: kept from the planning machine's env.json
PLAN_KEYS = ("command", "threads_per_rank", "launch_env_vars", "user_model")


def merge_node_envs(run_dir: Path) -> list[str]:
    """env.json from the nodes' env-<host>.json (bench/worker/plan_mode.py): the machine keys of the first
    node (node rank 0, the one that holds rank 0), every node under `nodes`, the planning machine's plan
    keys and its fingerprint under `planned_on`. Returns the nodes' host names (none: env.json unchanged)."""
    found = []
    for path in sorted(run_dir.glob(run_folder.NODE_ENV_GLOB)):
        try:
            found.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    if not found:
        return []
    found.sort(key=lambda info: (info.get("node_rank", 0), info["hostname"]))
    env_path = run_dir / run_folder.ENV
    planned = json.loads(env_path.read_text()) if env_path.is_file() else {}
    planned = planned.get("planned_on", planned)  # a second --collect merges from the same sources
    merged = dict(found[0]) | {k: planned[k] for k in PLAN_KEYS if k in planned}
    merged |= {"nodes": {info["hostname"]: info for info in found}, "planned_on": planned}
    env_path.write_text(json.dumps(merged, indent=2) + "\n")
    return [info["hostname"] for info in found]
