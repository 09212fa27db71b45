"""`python -m bench run`: validate a preset, expand its matrix, sweep it, write results/<run-id>/.

    python -m bench run --config NAME|PATH [--set section.key=value ...] [--out DIR] [--resume]
                        [--dry-run] [--report] [--plan-only [--nnodes N] [--gpus-per-node G]]
                        [--collect DIR]

Exit codes: 0 done (failed cells are recorded, not fatal), 2 bad configuration or folder, 130 interrupted.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import signal
import socket
import sys
import time
from collections import Counter
from pathlib import Path

from bench import results, run_folder
from bench.config import (
    BenchConfig,
    ConfigError,
    config_from_dict,
    load_config,
    read_tables,
    resolve_path,
    to_toml,
)
from bench.matrix import Cell, by_launch, estimate_seconds, expand, expected_rounds
from bench.run_checks import check_device, cpu_oversubscription
from bench.schema import STATUSES, TRACE_GLOB, MiB, backend_for

RETRYABLE = tuple(s for s in STATUSES if s not in ("ok", "skipped"))  # what --retry may name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="preset name in bench/configs/ (cpu-smoke, default, gpu-node, ...)"
                        " or a path to a TOML file")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a key (repeatable; lists comma-separated: matrix.world_size=1,2)")
    parser.add_argument("--out", type=Path, help="run folder (default: results/<preset>-<host>-<timestamp>)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out: skip the cells already in its cells.jsonl")
    parser.add_argument("--retry", default="", metavar="STATUS[,STATUS]",
                        help=f"with --resume: run again the recorded cells with these statuses "
                             f"(of {', '.join(RETRYABLE)}); their new record supersedes the old")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the cells and a time estimate; run nothing")
    parser.add_argument("--report", action="store_true", help="build the report (bench.report) at the end")
    parser.add_argument("--plan-only", action="store_true",
                        help="write the run folder and plan.json for your own torchrun/srun, run nothing")
    parser.add_argument("--nnodes", type=int, default=1,
                        help="with --plan-only: nodes the plan will run on (GPU-count check)")
    parser.add_argument("--gpus-per-node", type=int, default=None, metavar="G",
                        help="with --plan-only: GPUs on each node the plan will run on (default: this "
                             "machine's); lets a GPU-less login node plan a CUDA run")
    parser.add_argument("--collect", type=Path, metavar="DIR",
                        help="build cells.jsonl/results.csv of DIR from its workers' events/*.jsonl")


def _error(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _machine(config: BenchConfig) -> tuple[int, bool]:
    """(GPUs present, bf16 supported) for the run's device."""
    import torch

    if config.run.device != "cuda" or not torch.cuda.is_available():
        return 0, True
    # including_emulation=False: a V100 "supports" bf16 only by emulation, far below its fp16 rate
    return torch.cuda.device_count(), torch.cuda.is_bf16_supported(including_emulation=False)


def _unusable_gpus() -> str | None:
    """Why the driver's GPUs are out of torch's reach (bench.nvidia), None without a driver's GPU."""
    import torch

    from bench.nvidia import unusable_gpus

    return unusable_gpus(torch.__version__, torch.version.cuda)


def cuda_for_auto() -> bool:
    """run.device="auto": whether torch can use CUDA. ConfigError when it cannot but the NVIDIA driver shows
    GPUs (a wheel newer than the driver, a CPU-only wheel, an empty CUDA_VISIBLE_DEVICES): "auto" would
    otherwise benchmark the CPU of a GPU node and say nothing."""
    import torch

    if torch.cuda.is_available():
        return True
    reason = _unusable_gpus()
    if reason:
        raise ConfigError(f"run.device='auto': {reason}. Install a torch this driver runs (make setup), or "
                          "pass --set run.device=cpu to measure the CPU on purpose")
    return False


def _comparable(config: BenchConfig) -> dict:
    data = config.to_dict()
    data.pop("debug")  # test-only fault injection may differ between a run and its resumption
    return data


def first_difference(saved: dict, now: dict, prefix: str = "") -> tuple[str, object, object] | None:
    """The first dotted key whose value differs between two nested config dicts: (key, saved, now)."""
    for key in list(saved) + [k for k in now if k not in saved]:
        a, b = saved.get(key), now.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            found = first_difference(a, b, f"{prefix}{key}.")
            if found:
                return found
        elif a != b:
            return f"{prefix}{key}", a, b
    return None


def default_run_dir(preset: str) -> Path:
    """results/<preset>-<host>-<date>-<time>.<ms>, with a suffix if that exists (two runs in one ms)."""
    now = time.time()
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now)) + f".{int(now % 1 * 1000):03d}"
    out = Path("results") / f"{preset}-{socket.gethostname()}-{stamp}"
    n = 1
    while out.exists():
        n += 1
        out = out.with_name(f"{preset}-{socket.gethostname()}-{stamp}-{n}")
    return out


def prepare_run_dir(args, config: BenchConfig) -> Path:
    """The run folder, created (or checked, with --resume); raises ConfigError when it must not be used."""
    preset = resolve_path(args.config).stem
    out = args.out or default_run_dir(preset)
    if args.resume:
        saved = out / run_folder.CONFIG
        if not saved.is_file():
            raise ConfigError(f"--resume: {str(out)!r} holds no config.toml to resume")
        differs = first_difference(_comparable(config_from_dict(read_tables(saved))), _comparable(config))
        if differs:
            key, was, now = differs
            raise ConfigError(f"--resume: {key}={now!r} differs from {was!r} in {str(saved)!r}; resume with "
                              "the same preset and --set values, or use a new --out")
        if (out / run_folder.ENV).is_file():  # a user model's file must be the one the run measured
            from bench.workloads import check_model_unchanged

            try:
                check_model_unchanged(json.loads((out / run_folder.ENV).read_text()).get("user_model"),
                                      config.workload.model)
            except ValueError as e:
                raise ConfigError(f"--resume: {e}; use a new --out") from None
        return out
    if out.exists():
        raise ConfigError(f"--out={str(out)!r} already exists; refusing to overwrite it "
                          "(--resume continues it, or choose another --out)")
    try:
        out.mkdir(parents=True)
        (out / run_folder.CONFIG).write_text(to_toml(config))
    except OSError as e:  # under a file, in /proc, read-only, full: nothing is left half-made
        if out.is_dir() and not any(p for p in out.iterdir() if p.name != run_folder.CONFIG):
            shutil.rmtree(out, ignore_errors=True)
        raise ConfigError(f"--out={str(out)!r}: cannot create the run folder ({e.strerror or e})") from None
    return out


def lock_run_dir(run_dir: Path):
    """Hold an exclusive lock on run_dir for this process's life; ConfigError if another run holds it.

    Two `bench run` processes on one folder (a --resume started while the first still runs) would both
    launch the same cells and write duplicate rows; the lock makes the second one refuse instead.
    The lock file's descriptor is not inherited by the launches and goes away with this process.
    """
    handle = open(run_dir / ".lock", "a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise ConfigError(f"--out={str(run_dir)!r} is in use by another bench run (pid {holder}); "
                          "wait for it to finish or stop it, then --resume") from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def write_env(run_dir: Path, config: BenchConfig) -> None:
    """env.json: the machine and software fingerprint, plus threads and variables per launch."""
    from bench import envinfo
    from bench.launch import launch_env
    from bench.workloads import describe_model_spec

    device = config.run.device
    threads = {str(ws): config.run.threads_for(ws) for ws in sorted(set(config.matrix.world_size))}
    # what each launch adds to the environment above, per world size (env_vars is the launcher's own)
    launch_vars = {ws: launch_env(device, n) for ws, n in threads.items()}
    info = envinfo.collect(device, backend_for(device), [sys.executable, "-m", "bench", *sys.argv[1:]],
                           extra={"threads_per_rank": threads, "launch_env_vars": launch_vars,
                                  "user_model": describe_model_spec(config.workload.model)})
    (run_dir / run_folder.ENV).write_text(json.dumps(info, indent=2) + "\n")


def record_skipped(run_dir: Path, config: BenchConfig, cells: list[Cell], done: set[str]) -> None:
    for cell in cells:
        if cell.skip_reason and cell.cell_id not in done:
            results.append_record(run_dir, results.make_record(cell, config, "skipped", cell.skip_reason))


def dry_run(config: BenchConfig, cells: list[Cell]) -> int:
    runnable = [c for c in cells if not c.skip_reason]
    profiled = {c.cell_id for c in runnable if config.profile.covers(c.cell_id)}
    for cell in cells:
        print(f"{'skip' if cell.skip_reason else 'run ':4}  {cell.cell_id}"
              + (f"  ({cell.skip_reason})" if cell.skip_reason else "")
              + ("  [profiled]" if cell.cell_id in profiled else ""))
    est = estimate_seconds(config, cells)
    print(f"{len(runnable)} cells to run ({len(profiled)} profiled), {len(cells) - len(runnable)} skipped, "
          f"{len(by_launch(runnable))} launches; estimated wall time ~{est / 60:.1f} min "
          f"(bench.matrix.RATES: calibrated on a 2-core CPU and one H100; GPU all-reduce speed assumed)")
    r = config.run
    if r.adaptive and runnable:
        rounds = sorted(expected_rounds(config, cells))
        median = rounds[len(rounds) // 2]
        print(f"timed rounds per cell expected: {rounds[0]}-{rounds[-1]} (median {median}), "
              f"until ±{r.target_ci_pct:g} % (run.target_ci_pct), at most {r.max_timed_steps} rounds or "
              f"{r.max_group_s:g} s a group")
    return 0


def collect_events(run_dir: Path) -> int:
    """Records for the finished (or failed) cells found in run_dir/events/*.jsonl, not yet in cells.jsonl."""
    from bench.launch import EventReader

    config = config_from_dict(read_tables(run_dir / run_folder.CONFIG))
    plan = json.loads((run_dir / "plan.json").read_text())
    by_id = {c["cell_id"]: Cell.from_dict(c) for c in plan["cells"]}
    done = {r["cell_id"] for r in results.read_records(run_dir)}
    # per cell, its finish event, else the earliest error event of a rank that failed itself (a `peer` event
    # only says that another rank's group failed; a later error is usually a peer's timeout in a collective
    # with the rank that failed first)
    outcomes: dict[str, dict] = {}
    traces: dict[str, str] = {}
    for path in sorted((run_dir / run_folder.EVENTS).glob("*.jsonl")):
        for ev in EventReader(path).read():
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
    added = 0
    for cell_id, cell in by_id.items():
        if cell_id in outcomes and cell_id not in done:
            record = results.record_from_event(cell, config, outcomes[cell_id])
            if cell_id in traces:
                record = results.record_with_traces(record, traces[cell_id])
            results.append_record(run_dir, record)
            added += 1
    results.write_csv(run_dir)
    nodes = merge_node_envs(run_dir)
    missing = [i for i in by_id if i not in done and i not in outcomes]
    print(f"collected {added} cells into {run_dir / results.CSV_FILE}; {len(missing)} not run yet"
          + (f"; env.json describes {len(nodes)} node(s): {', '.join(nodes)}" if nodes else ""))
    return 0


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


def plan_only(run_dir: Path, config: BenchConfig, cells: list[Cell]) -> int:
    from bench.launch import write_plan

    runnable = [c for c in cells if not c.skip_reason]
    plan = run_dir / "plan.json"
    write_plan(plan, config, run_dir, runnable, launcher_pid=None,
               profile=[c for c in runnable if config.profile.covers(c.cell_id)])
    print(f"wrote {plan} ({len(runnable)} cells to run; re-running it skips the cells that finished). "
          "On every node, per world size N = nodes × GPUs per node:")
    print(f"  torchrun --nnodes $NNODES --nproc-per-node $GPUS --rdzv-backend c10d "
          f"--rdzv-endpoint $HEAD:29500 -m bench.worker --plan {plan}")
    print(f"then: python -m bench run --collect {run_dir}")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.collect:
        missing = [name for name in (run_folder.CONFIG, "plan.json") if not (args.collect / name).is_file()]
        if missing:  # checked before the lock file is made: a wrong folder is left as it was
            return _error(f"--collect={str(args.collect)!r}: no {' or '.join(missing)} there; --collect "
                          "takes a folder written by --plan-only")
        try:
            _lock = lock_run_dir(args.collect)  # noqa: F841 (held until exit)
            return collect_events(args.collect)
        except (ConfigError, OSError, ValueError) as e:
            return _error(f"--collect={str(args.collect)!r}: {e}")
    if not args.config:
        return _error("--config NAME|PATH is required")
    retry = {s.strip() for s in args.retry.split(",") if s.strip()}
    unknown = sorted(retry - set(RETRYABLE))
    if unknown:
        return _error(f"--retry={unknown[0]!r}: must be statuses among {list(RETRYABLE)}")
    if retry and not args.resume:
        return _error(f"--retry={args.retry!r}: needs --resume (it re-runs cells of an existing run folder)")
    for flag, value in (("--nnodes", args.nnodes), ("--gpus-per-node", args.gpus_per_node)):
        if value is not None and value < 1:
            return _error(f"{flag}={value}: must be at least 1")
    if args.gpus_per_node is not None and not args.plan_only:
        return _error(f"--gpus-per-node={args.gpus_per_node}: only with --plan-only (a run uses this "
                      "machine's GPUs)")
    # --plan-only --gpus-per-node G plans for the compute nodes, not for this (maybe GPU-less) machine:
    # "auto" resolves to cuda, and the world sizes are checked against --nnodes × G.
    planned_gpus = args.gpus_per_node if args.plan_only else None
    try:
        config = load_config(args.config, args.set,
                             cuda_available=(lambda: True) if planned_gpus else cuda_for_auto)
        gpu_count, bf16_ok = _machine(config)
        if planned_gpus and config.run.device == "cuda":
            gpu_count, bf16_ok = planned_gpus, True  # bf16 is the nodes' to check: a cell fails there
        if config.run.device == "cuda" and not gpu_count:  # asked for cuda: say why torch has none
            reason = _unusable_gpus()
            if reason:
                raise ConfigError(f"run.device='cuda': {reason}")
            if args.plan_only:
                raise ConfigError("run.device='cuda': this machine has no CUDA device; to plan for GPU "
                                  "nodes from here, pass --gpus-per-node G (the GPUs of each node)")
        check_device(config, gpu_count, nnodes=args.nnodes if args.plan_only else 1)
        crowded = cpu_oversubscription(config)
        if crowded:
            print(crowded, file=sys.stderr)
        from bench.envinfo import timing_warnings

        for warning in timing_warnings(dict(os.environ)):  # recorded in env.json and the report too
            print(f"warning: {warning}", file=sys.stderr)
        cells = expand(config, bf16_supported=bf16_ok,
                       gpu_count=None if args.plan_only else gpu_count)
        if args.dry_run:
            return dry_run(config, cells)
        run_dir = prepare_run_dir(args, config)
        _lock = lock_run_dir(run_dir)  # noqa: F841 (held until exit)
    except ConfigError as e:
        return _error(str(e))
    if args.resume:  # an earlier launch's processes must not run beside this one
        from bench.lifetime import leftovers, stop

        left = leftovers(run_dir)
        if left:
            stop(left)
            print(f"--resume: stopped {len(left)} process(es) an earlier launch into {run_dir} left running "
                  f"(pids {', '.join(map(str, left))})", file=sys.stderr)
    if not (run_dir / run_folder.ENV).exists():
        write_env(run_dir, config)
    done = {r["cell_id"] for r in results.read_records(run_dir) if r["status"] not in retry}
    record_skipped(run_dir, config, cells, done)
    if args.plan_only:
        return plan_only(run_dir, config, [c for c in cells if c.cell_id not in done])
    todo = [c for c in cells if not c.skip_reason and c.cell_id not in done]
    print(f"run folder: {run_dir}  ({len(todo)} cells to run, {len(cells) - len(todo)} done or skipped)")
    return sweep(run_dir, config, todo, args.report)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def sweep(run_dir: Path, config: BenchConfig, todo: list[Cell], report: bool) -> int:
    from bench.launch import Sweep
    from bench.progress import Progress

    progress = Progress(total=len(todo), profiled=sum(config.profile.covers(c.cell_id) for c in todo))
    runner = Sweep(config, run_dir, progress)
    t0 = time.perf_counter()
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # SIGTERM stops as cleanly as Ctrl-C
    try:
        stats = runner.run(todo)
    except OSError as e:  # the run folder stopped taking writes (disk full, read-only): keep what finished
        progress.close()
        print(f"error: cannot write to {run_dir} ({e.strerror or e}); the cells finished before it are in "
              f"{run_dir / results.CELLS_FILE}. Free space, then continue with --resume --out {run_dir} "
              f"(--retry failed,timeout also re-runs those)", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        progress.close()
        print(f"interrupted: finished cells are in {run_dir / results.CELLS_FILE}; "
              f"continue with --resume --out {run_dir}", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)
    progress.close()
    wall = time.perf_counter() - t0
    counts = Counter(r["status"] for r in results.read_records(run_dir))
    print(f"done in {wall:.1f} s, {stats.launches} launches: "
          + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if stats.cells:
        beyond_steps, beyond_timed = stats.wall_s - stats.steps_s, stats.wall_s - stats.timed_s
        print(f"overhead per cell beyond its measured steps: mean {beyond_steps / stats.cells:.2f} s"
              f" (beyond the timed steps only: {beyond_timed / stats.cells:.2f} s;"
              f" launch start-up amortised; {stats.cells} cells)")
    print(f"results: {run_dir / results.CSV_FILE}")
    if config.profile.enabled:
        traces = list((run_dir / "traces").glob(f"*/{TRACE_GLOB}"))
        print(f"traces: {len(traces)} files, {sum(t.stat().st_size for t in traces) / MiB:.1f} MiB "
              f"in {run_dir / 'traces'}")
    if not report:
        from bench.pipeline import STEPS  # what --report runs before the report, in order

        steps = [f"python -m bench {name} {run_dir}" for name, _ in (*STEPS, ("report", None))]
        print(f"no report (run without --report); build it with: {' && '.join(steps)}")
    return write_report(run_dir) if report else 0


# What --report runs after the sweep, in order: each writes into the run folder what the report shows.
def write_report(run_dir: Path) -> int:
    """--report: analyze, project, advise, then the report on the run folder (bench.pipeline, lazily)."""
    from bench.pipeline import after_run

    return after_run(run_dir)
