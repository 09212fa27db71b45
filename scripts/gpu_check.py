"""`make gpu-check`: the acceptance run for a GPU machine, in one command, with one evidence folder.

    python scripts/gpu_check.py [--out gpu-check] [--dry-run [--gpus G]]

On a machine without a usable CUDA device it says why and exits 2, creating nothing (`--dry-run` prints
the plan for G GPUs there too). Otherwise it prints
its time estimate, then runs, each stage under its own time limit, a stage that fails or overruns costing
only its own claims:

1. the suite's GPU tests, `pytest -m gpu` (junit XML → pytest.csv);
2. the `gpu-check` preset (bench/configs/gpu-check.toml): torch DDP beside fsdp2 at fp32, bf16 and fp16 on
   gpu-node's transformer, side by side, at world size 1 and at every GPU, adaptive rounds, one profiled
   reference cell; then `bench analyze` on it;
3. one compiled cell (torch + inductor, bf16, one rank) beside its eager twin;

and writes OUT/summary.md and OUT/claims.csv: one line per claim, PASS, FAIL or SKIP with the figure that
decides it (docs/gpu-node.md says what each proves). Exit 0 when no claim FAILs, 1 when one does, 2 without
CUDA. An existing OUT is moved aside to OUT-<time> first, so a second run never mixes with the first.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

EXIT_NO_CUDA = 2
# Assumed, not measured: `pytest -m gpu`'s time. On the one H100 this project saw, two of its tests took
# 27.5 s; its sweep test runs every engine at every world size the machine has (its own limit is 1,500 s).
PYTEST_S = {1: 240.0, 2: 420.0, 4: 600.0, 8: 900.0}
ANALYZE_S = 60.0         # bench analyze of one profiled cell's traces (tens of MB for smollm2-360m)
LIMIT_FACTOR = 2.0       # a stage may run this many times its estimate before it is stopped
BUDGET_1GPU_S = 540.0    # the goal on one H100: 9 minutes
GPU_BUSY_PCT = 70.0      # gpu-node's sizing target (docs/gpu-node.md "Sizing"); HOST_BOUND_BUSY_PCT
COMPILED_SETS = ["matrix.engine=torch", "matrix.compile=none,inductor", "matrix.precision=bf16",
                 "matrix.world_size=1", "matrix.options_cells=*", "profile.enabled=false"]


@dataclass
class Claim:
    """One line of the evidence: what is claimed, PASS / FAIL / SKIP, the figure that decides it."""

    name: str
    result: str
    figure: str
    proves: str


def cuda_or_reason() -> tuple[int, str | None]:
    """(GPUs, None) on a machine whose torch can use CUDA, else (0, why not)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch.cuda.device_count(), None
    from bench.run.checks import unusable_gpus

    why = unusable_gpus() or (f"torch {torch.__version__} sees no CUDA device on this machine "
                              f"(torch.cuda.is_available() is False)")
    return 0, why


def sweep_sets(gpus: int) -> list[str]:
    """The gpu-check preset at world size 1 and at every GPU (weak scaling: 32 samples a rank at each)."""
    return [f"matrix.world_size=1,{gpus}" if gpus > 1 else "matrix.world_size=1"]


def plan_estimate(sets: list[str], gpus: int) -> tuple[float, float]:
    """(low, high) seconds of a `bench run --config gpu-check` with `sets`, by bench.run.estimate."""
    from bench.run.estimate import estimate_range
    from bench.run.planner import plan

    planned = plan("gpu-check", sets, plan_only=True, gpus_per_node=gpus)
    return estimate_range(planned.config, list(planned.cells), gpus=planned.gpus)  # packed as the run is


def run_stage(cmd: list[str], limit_s: float, log: Path) -> tuple[int | None, float]:
    """Run `cmd` in its own session with output to `log`; past `limit_s` its whole process group is stopped
    (SIGTERM, then SIGKILL 10 s later). Returns (exit code or None when stopped, seconds)."""
    t0 = time.monotonic()
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            return proc.wait(timeout=limit_s), time.monotonic() - t0
        except subprocess.TimeoutExpired:
            for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            return None, time.monotonic() - t0


def pytest_claims(xml_path: Path, csv_path: Path, code: int | None, seconds: float) -> list[Claim]:
    """pytest.csv from the junit XML, and the claim that every GPU test passed."""
    rows = []
    if xml_path.is_file():
        for case in ET.parse(xml_path).getroot().iter("testcase"):
            outcome, message = "passed", ""
            for tag in ("failure", "error", "skipped"):
                node = case.find(tag)
                if node is not None:
                    outcome, message = {"failure": "failed", "error": "error"}.get(tag, tag), (
                        node.get("message") or "")[:300]
            rows.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                         "seconds": case.get("time"), "message": message})
    write_csv(csv_path, ["test", "outcome", "seconds", "message"], rows)
    counts = {k: sum(r["outcome"] == k for r in rows) for k in ("passed", "failed", "error", "skipped")}
    stopped = " (stopped at its time limit)" if code is None else ""
    figure = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['error']} errors, "
              f"{counts['skipped']} skipped in {seconds:.0f} s{stopped}")
    ok = code == 0 and counts["passed"] > 0 and not counts["failed"] and not counts["error"]
    return [Claim("gpu tests", "PASS" if ok else "FAIL", figure,
                  "the suite's GPU tests (NCCL parity, the GPU sweep, memory, no host sync in a step, the "
                  "parity gate and fsdp2's window on CUDA) pass on this machine")]


def read_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "results.csv"
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def num(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def gate_figure(row: dict) -> str:
    """The gate's gradient errors beside the bounds it used (measured in the run: BOUND_FACTOR × torch DDP's
    own error at the precision, bench/worker/parity.py)."""
    parts = [("gradient error", "parity_grad_error", "parity_grad_bound"),
             (f"worst tensor {row.get('parity_tensor') or ''}".rstrip(), "parity_tensor_error",
              "parity_tensor_bound")]
    out = [f"torch DDP's own {num(row.get('parity_ddp_error')):.3g}"] if num(row.get("parity_ddp_error")) \
        is not None else []
    for name, key, bound in parts:
        value, limit = num(row.get(key)), num(row.get(bound))
        out.append(f"{name} —" if value is None else f"{name} {value:.3g} (≤ {limit:.3g})"
                   if limit is not None else f"{name} {value:.3g} (not judged)")
    return ", ".join(out)


def sweep_claims(rows: list[dict], code: int | None, wall_s: float, estimate: tuple[float, float],
                 name: str) -> list[Claim]:
    """The sweep ran whole, its cells passed the parity gate, fsdp2's compute-only window holds no
    communication at one rank, the adaptive rounds reached their target, and the estimate held."""
    out = []
    statuses = {r["cell_id"]: r["status"] for r in rows}
    bad = {c: s for c, s in statuses.items() if s != "ok"}
    out.append(Claim(f"{name}: every cell ran", "PASS" if rows and not bad and code == 0 else "FAIL",
                     f"{len(rows)} cells, {len(rows) - len(bad)} ok" + (
                         "; " + ", ".join(f"{c}: {s}" for c, s in list(bad.items())[:4]) if bad else "")
                     + ("" if code == 0 else f"; bench run exited {code} (None: stopped at its limit)"),
                     "the engines run on CUDA/NCCL at every precision: none failed, hung or ran out of "
                     "memory"))
    for r in rows:
        gated = r.get("parity_gate")
        if not gated:
            continue
        verdict = {"passed": "PASS", "diverged": "FAIL"}.get(gated, "SKIP")
        out.append(Claim(f"parity: {r['cell_id']}", verdict if r["status"] in ("ok", "diverged") else "FAIL",
                         f"{gated}; {gate_figure(r)}" + (f"; compile_s {num(r.get('compile_s')):.0f}"
                                                         if num(r.get("compile_s")) is not None else ""),
                         "the engine hands its optimizer torch DDP's gradient at the same weights and "
                         "batch, within torch DDP's own rounding at the precision (bench/worker/parity.py)"))
    for r in rows:
        if r["engine"] != "fsdp2" or r["world_size"] != "1" or r["status"] not in ("ok", "diverged"):
            continue
        low, high = num(r.get("exposed_comm_ms_ci95_low")), num(r.get("exposed_comm_ms_ci95_high"))
        exposed, step = num(r.get("exposed_comm_ms")), num(r.get("step_time_ms_p50"))
        holds = low is not None and high is not None and low <= 0 <= high
        out.append(Claim(f"fsdp2 window: {r['cell_id']}", "PASS" if holds else "FAIL",
                         f"exposed communication {exposed} ms, 95 % [{low}, {high}], step {step} ms",
                         "at one rank, fsdp2's compute-only window does all the step's work but "
                         "communication (its optimizer step included): step − compute-only ≈ 0"))
    groups = [r for r in rows if r["status"] in ("ok", "diverged") and r.get("stopped_by")]
    short = [r for r in groups if r["stopped_by"] != "target"]
    if groups:
        out.append(Claim(f"{name}: adaptive rounds", "PASS" if not short else "FAIL",
                         f"{len(groups) - len(short)} of {len(groups)} cells stopped at the target; "
                         + ", ".join(f"{r['cell_id']}: {r['stopped_by']} at "
                                     f"±{num(r['step_time_half_width_pct'])} % after {r['n_timed_steps']} "
                                     "rounds" for r in short[:3]),
                         "the timed rounds reach ±run.target_ci_pct on this GPU within their caps"))
    low, high = estimate
    inside = low * 0.75 <= wall_s <= high * 1.25
    out.append(Claim(f"{name}: wall time vs --dry-run", "PASS" if inside else "FAIL",
                     f"{wall_s / 60:.1f} min against the estimate {low / 60:.1f}-{high / 60:.1f} min (±25 %)",
                     "the --dry-run estimate's range (bench.run.estimate) holds on this machine"))
    return out


def busy_claims(run_dir: Path) -> list[Claim]:
    """The profiled reference cell keeps the GPU ≥ 70 % busy (launch_stats.csv from bench analyze)."""
    path = run_dir / "launch_stats.csv"
    if not path.is_file():
        return [Claim("gpu busy: reference engine", "FAIL", "no launch_stats.csv (bench analyze failed?)",
                      "gpu-node's sizing keeps torch DDP's step GPU-bound")]
    import pandas as pd

    from bench.analyze.hta_tables import host_bound_cells

    table = host_bound_cells(pd.read_csv(path, dtype={"cell_id": str}))
    return [Claim(f"gpu busy: {r.cell_id}", "PASS" if r.gpu_busy_pct >= GPU_BUSY_PCT else "FAIL",
                  f"GPU busy {r.gpu_busy_pct:.1f} % of the profiled step (≥ {GPU_BUSY_PCT:.0f} %)",
                  "gpu-node's sizing (smollm2-360m, seq 512, 32 samples a rank) keeps torch DDP's step "
                  "GPU-bound: its comparisons measure the GPU, not Python") for r in table.itertuples()]


def network_claims(rows: list[dict], gpus: int) -> list[Claim]:
    """At every GPU: NCCL's transport was recorded, and the probe's busbw beside nccl-tests' figures."""
    proves_bw = ("the all-reduce probe's bus bandwidth is at least ¼ of nccl-tests' published 8×H100 "
                 "NVLink figure at that message size (bench/project/network.py h100-nvlink)")
    if gpus < 2:
        return [Claim("busbw vs nccl-tests", "SKIP", "one GPU: nothing crosses a link", proves_bw)]
    from bench.report.findings import BUSBW_FLOOR_FRACTION, expected_busbw_gbps, nvlink_preset

    ok = [r for r in rows if r["status"] == "ok" and r["world_size"] == str(gpus)]
    out = []
    measured = [r for r in ok if num(r.get("allreduce_busbw_gbps"))]
    if measured:
        best = max(measured, key=lambda r: num(r["allreduce_busbw_gbps"]))
        size, busbw = num(best["allreduce_bytes"]), num(best["allreduce_busbw_gbps"])
        preset = nvlink_preset(best.get("gpu_name") or "")
        expected = expected_busbw_gbps(preset, size, gpus) if preset else None
        result = ("SKIP" if expected is None
                  else "PASS" if busbw >= BUSBW_FLOOR_FRACTION * expected else "FAIL")
        out.append(Claim("busbw vs nccl-tests", result,
                         f"{busbw:.1f} GB/s at {size / 2**20:.1f} MiB on {gpus} GPUs"
                         + (f" against ≈{expected:.0f} GB/s ({preset})" if expected else
                            f" (no published figure for {best.get('gpu_name')})"), proves_bw))
    else:
        out.append(Claim("busbw vs nccl-tests", "FAIL", "no busbw measured", proves_bw))
    transports = sorted({r.get("nccl_transport") or "" for r in ok})
    out.append(Claim("nccl transport", "PASS" if ok and all(transports) else "FAIL",
                     ", ".join(t or "(empty)" for t in transports) or "no cell",
                     "NCCL's INFO log is read: each cell at every GPU says how the ranks were connected"))
    return out


def packing_claims(rows: list[dict], gpus: int) -> list[Claim]:
    """World size 1 on a node of several GPUs ran packed (run.pack auto): its groups in launches at once,
    each on its own GPU (docs/design.md "Packing")."""
    proves = ("world sizes below the node's GPUs run in launches at once on disjoint GPUs, a group on one "
              "(bench/run/packing.py); compare their steps with world size 1's on a 1-GPU check")
    if gpus < 2:
        return [Claim("packing: world size 1", "SKIP", "one GPU: nothing to pack", proves)]
    ones = [r for r in rows if r["world_size"] == "1" and r["status"] in ("ok", "diverged")]
    slots = {r.get("slot_gpus") for r in ones}
    packed = {r.get("packed_launches") for r in ones}
    holds = (bool(ones) and all(num(p) and num(p) > 1 for p in packed) and None not in slots
             and "" not in slots and len(slots) > 1)
    steps = ", ".join(f"{r['cell_id']}: {num(r.get('step_time_ms_p50'))} ms on GPU {r.get('slot_gpus')}"
                      for r in ones[:4])
    return [Claim("packing: world size 1", "PASS" if holds else "FAIL",
                  f"{len(ones)} cells, packed_launches {sorted(packed)}, GPUs {sorted(map(str, slots))}; "
                  f"{steps}", proves)]


def safely(name: str, make, *args) -> list[Claim]:
    """`make(*args)`'s claims; a bug or a missing dependency there (pandas on a bare image) is one FAIL
    line naming it, not the end of the evidence."""
    try:
        return make(*args)
    except Exception as e:  # noqa: BLE001 - any failure becomes a claim; the run goes on
        return [Claim(name, "FAIL", f"could not evaluate: {type(e).__name__}: {e}", "(see the logs)")]


def write_csv(path: Path, columns: list[str], rows: list[dict]) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def write_summary(out: Path, claims: list[Claim], facts: list[str]) -> None:
    write_csv(out / "claims.csv", ["claim", "result", "figure", "proves"],
              [{"claim": c.name, "result": c.result, "figure": c.figure, "proves": c.proves} for c in claims])
    counts = {k: sum(c.result == k for c in claims) for k in ("PASS", "FAIL", "SKIP")}
    lines = ["# make gpu-check", "", *facts, "",
             f"**{counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP** (claims.csv; "
             "docs/gpu-node.md says what each line proves)", "",
             "| claim | result | figure |", "|---|---|---|",
             *(f"| {c.name} | {c.result} | {c.figure.replace('|', '/')} |" for c in claims), "",
             "Files: pytest.csv (each GPU test), sweep/ and compiled/ (run folders: results.csv, traces, "
             "launch_stats.csv), logs/ (each stage's output)."]
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu_check.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "gpu-check",
                        help="evidence folder (default gpu-check)")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the stages and the estimate; run nothing")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="wall-time budget: each stage is stopped early enough for the later ones and "
                             "the summary (default: 540 s on one GPU, else the estimate's upper end + 25 %%)")
    parser.add_argument("--gpus", type=int, default=None, metavar="G",
                        help="with --dry-run: the GPUs to plan for (default: this machine's; 1 without CUDA)")
    args = parser.parse_args(argv)
    if args.gpus is not None and not (args.dry_run and 1 <= args.gpus <= 64):
        parser.error(f"--gpus={args.gpus}: only with --dry-run, and 1 to 64")
    gpus, why = cuda_or_reason()
    if not gpus and not args.dry_run:
        print(f"gpu-check: needs a CUDA device: {why}. Nothing was run or written.", file=sys.stderr)
        return EXIT_NO_CUDA
    import torch

    if args.gpus is not None or not gpus:  # a plan for a GPU machine, made here (a laptop, a login node)
        gpus, name = args.gpus or 1, f"GPU (planned{'' if why is None else '; here: ' + why})"
    else:
        name = torch.cuda.get_device_name(0)

    sets = sweep_sets(gpus)
    sweep_est, compiled_est = plan_estimate(sets, gpus), plan_estimate(COMPILED_SETS, gpus)
    pytest_s = PYTEST_S[max(k for k in PYTEST_S if k <= gpus)]
    low = pytest_s + sweep_est[0] + compiled_est[0] + ANALYZE_S
    high = pytest_s + sweep_est[1] + compiled_est[1] + ANALYZE_S
    print(f"gpu-check on {gpus} × {name}: estimated {low / 60:.1f}-{high / 60:.1f} min "
          f"(pytest -m gpu ~{pytest_s / 60:.0f} min assumed; sweep {sweep_est[0] / 60:.1f}-"
          f"{sweep_est[1] / 60:.1f} min; compiled cell {compiled_est[0] / 60:.1f}-{compiled_est[1] / 60:.1f}"
          f" min; analyze ~{ANALYZE_S / 60:.0f} min)"
          + (f"; over the {BUDGET_1GPU_S / 60:.0f}-minute goal for one GPU"
             if gpus == 1 and high > BUDGET_1GPU_S else ""), flush=True)
    budget = args.budget_s or (BUDGET_1GPU_S if gpus == 1 else 1.25 * high)
    if args.dry_run:
        return 0
    out = args.out
    if out.exists():
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(out.stat().st_mtime))
        aside = out.with_name(f"{out.name}-{stamp}")
        out.rename(aside)
        print(f"gpu-check: the earlier {out} is now {aside}")
    (out / "logs").mkdir(parents=True)
    t_start = time.monotonic()
    py = sys.executable
    claims: list[Claim] = []

    name_line = (f"- machine: {gpus} × {name}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
                 f"NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}; git {git_sha()}; "
                 f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}")

    def record(stage: str) -> None:
        """The evidence so far, rewritten after every stage: a run stopped from outside keeps it."""
        wall = time.monotonic() - t_start
        write_summary(out, claims, [name_line, f"- {stage}; wall time {wall / 60:.1f} min against the "
                                               f"estimate {low / 60:.1f}-{high / 60:.1f} min"])

    def limit(estimate_s: float, later_s: float) -> float:
        """A stage's time limit: LIMIT_FACTOR × its estimate, but leaving the later stages their lowest
        estimates (`later_s`) within the budget; at least a minute."""
        left = budget - (time.monotonic() - t_start) - later_s
        return max(60.0, min(LIMIT_FACTOR * estimate_s, left))

    stage_s = limit(pytest_s, sweep_est[0] + ANALYZE_S + compiled_est[0])
    print(f"[1/4] pytest -m gpu (limit {stage_s / 60:.1f} min)", flush=True)
    # only the modules that hold GPU tests (a module of CPU tests whose dev dependency this machine lacks
    # cannot then stop the stage), and without the repo's addopts (pytest-benchmark's flag among them)
    files = [str(f.relative_to(REPO)) for f in sorted((REPO / "tests").glob("test_*.py"))
             if "pytest.mark.gpu" in f.read_text()]
    code, seconds = run_stage([py, "-m", "pytest", "-o", "addopts=", "-m", "gpu", "-q", "-rs", "-p",
                               "no:cacheprovider", f"--junitxml={out / 'pytest.xml'}", *files], stage_s,
                              out / "logs" / "pytest.log")
    claims += safely("gpu tests", pytest_claims, out / "pytest.xml", out / "pytest.csv", code, seconds)
    record("after pytest -m gpu (1 of 4 stages)")

    stage_s = limit(sweep_est[1], ANALYZE_S + compiled_est[0])
    print(f"[2/4] bench run --config gpu-check {' '.join(sets)} (limit {stage_s / 60:.1f} min)", flush=True)
    bench = [py, "-m", "bench", "run", "--config", "gpu-check"]
    code, seconds = run_stage([*bench, *(a for s in sets for a in ("--set", s)), "--out", str(out / "sweep")],
                              stage_s, out / "logs" / "sweep.log")
    rows = read_rows(out / "sweep")
    claims += safely("sweep", sweep_claims, rows, code, seconds, sweep_est, "sweep")
    claims += safely("network", network_claims, rows, gpus)
    claims += safely("packing", packing_claims, rows, gpus)
    record("after the sweep (2 of 4 stages)")

    stage_s = limit(ANALYZE_S, compiled_est[0])
    print(f"[3/4] bench analyze (the profiled reference cell; limit {stage_s / 60:.1f} min)", flush=True)
    run_stage([py, "-m", "bench", "analyze", str(out / "sweep")], stage_s, out / "logs" / "analyze.log")
    claims += safely("gpu busy", busy_claims, out / "sweep")
    record("after bench analyze (3 of 4 stages)")

    stage_s = limit(compiled_est[1], 0.0)
    print(f"[4/4] the compiled cell (limit {stage_s / 60:.1f} min)", flush=True)
    code, seconds = run_stage([*bench, *(a for s in COMPILED_SETS for a in ("--set", s)), "--out",
                               str(out / "compiled")], stage_s, out / "logs" / "compiled.log")
    claims += safely("compiled", sweep_claims, read_rows(out / "compiled"), code, seconds, compiled_est,
                     "compiled")

    wall = time.monotonic() - t_start
    record("complete (4 of 4 stages)")
    times = {"gpus": gpus, "low_s": low, "high_s": high, "wall_s": wall}
    (out / "estimate.json").write_text(json.dumps(times, indent=2) + "\n")
    failed = [c for c in claims if c.result == "FAIL"]
    print(f"gpu-check: {len(claims) - len(failed)} of {len(claims)} claims PASS or SKIP; {len(failed)} FAIL; "
          f"{wall / 60:.1f} min; evidence: {out / 'summary.md'}")
    return 1 if failed else 0


def git_sha() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True, timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


if __name__ == "__main__":
    sys.exit(main())
