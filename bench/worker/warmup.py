"""A group's warm-up on every rank: the run.warmup_steps rounds every cell steps before its timed rounds
(compiled cells: until recompiling stops, their compile time measured), a heartbeat while a compile runs
inside one step, and the changepoint test that finds where each cell's warm-up really ended
(`warmup_found`: the timed rounds it reaches into are left out of the measurement).
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import torch

from bench import metrics
from bench.worker import measure, steady
from bench.worker.guard import Guard, failure
from bench.worker.trainer import Trainer, sync_device

# Warm-up steps a compiled cell may add beyond run.warmup_steps while it still recompiles (a graph
# recompiled for the rebuilt buckets, a guard that failed); every cell of its group takes them too, so
# all step the same batches.
MAX_RECOMPILE_STEPS = 5
# torch.compile failures that say the configuration cannot be compiled (not a bug of the cell): the cell
# is `skipped` with torch's message. DDPOptimizer (torch/_dynamo/backends/distributed.py) splits the
# graph at DDP's buckets and refuses a first bucket larger than the others (seen with torch 2.13 at
# bucket_cap_mb=0.1).
KNOWN_COMPILE_REFUSALS = ("First bucket should be smaller/equal to other buckets",)
# How often a compiling step says it is alive: well inside any watchdog limit (run.cell_timeout_s is at
# least tens of seconds), and rare enough to cost nothing (one events line a minute; a cold inductor
# compile of smollm2-360m can take longer than the 600 s the GPU presets allow a silent cell).
HEARTBEAT_S = 60.0


@contextmanager
def heartbeat(progress, what: str):
    """While the block runs, `progress(f"{what} (N s)")` every HEARTBEAT_S from a thread: a compile runs
    inside one step, and the launcher's watchdog (run.cell_timeout_s) hears nothing else meanwhile."""
    done = threading.Event()
    t0 = time.perf_counter()

    def beat():
        while not done.wait(HEARTBEAT_S):
            progress(f"{what} ({time.perf_counter() - t0:.0f} s)")

    thread = threading.Thread(target=beat, name="bench-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def warm_up(trainers: list[Trainer], n: int, device: torch.device, guard: Guard,
            progress=lambda phase: None) -> tuple[dict, dict[str, list[float]]]:
    """Collective. n rounds of every trainer's step, then more (at most MAX_RECOMPILE_STEPS) while a
    compiled trainer still compiled in the last round. Returns per compiled cell the seconds of its
    warm-up steps that compiled (compile_s): 0 when every graph it runs was compiled earlier in the
    process for an identical model (dynamo guards on code, shapes and dtypes, not on the module object, so
    a second trainer of the same model reuses the first one's graphs); and per cell id its warm-up steps'
    times, each timed as a timed round's step (measure.StepTimer) and the slowest rank's: the start of the
    series the warm-up test reads (`warmup_found`). A step that raises fails its cell
    (`guard`: the others step on); a compiled cell torch refuses (KNOWN_COMPILE_REFUSALS) is `skipped`
    with torch's reason. The ranks agree on both after every round."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    compile_s: dict[str, float] = {}
    compiled = [t for t in trainers if t.cell.compile not in (None, "none")]
    timers = {t.cell.cell_id: measure.StepTimer(device) for t in trainers}
    for round_ in range(n + MAX_RECOMPILE_STEPS):
        recompiled = False
        for trainer in trainers:
            cell = trainer.cell
            if cell.cell_id in guard.local:  # failed here, or on a rank that said so at the last agree
                continue
            if trainer not in compiled:
                timers[cell.cell_id].time(guard.step(trainer))
                continue
            graphs, t0 = counters["stats"]["unique_graphs"], time.perf_counter()
            try:
                with heartbeat(progress, f"compiling {cell.cell_id}"):
                    timers[cell.cell_id].time(trainer.step)
            except Exception as e:  # noqa: BLE001 - a known refusal is a skip; any other failure the cell's
                if not any(text in str(e) for text in KNOWN_COMPILE_REFUSALS):
                    guard.step_failed(cell.cell_id, *failure(e, cell.cell_id))
                    continue
                guard.fail(cell.cell_id, "skipped", f"compile={cell.compile}: {type(e).__name__}: " + next(
                    line for line in str(e).splitlines() if any(t in line for t in KNOWN_COMPILE_REFUSALS)))
                # dynamo remembers the failed frame (DDP's forward) and would run it eagerly for every
                # later cell of this process: start afresh (the group's other compiled cells recompile)
                torch._dynamo.reset()
                recompiled = True
                continue
            sync_device(device)
            if counters["stats"]["unique_graphs"] != graphs:
                compile_s[cell.cell_id] = compile_s.get(cell.cell_id, 0.0) + time.perf_counter() - t0
                recompiled = True
        guard.agree()
        if round_ + 1 >= n and not measure.max_over_ranks(float(recompiled), device):
            break
    for trainer in compiled:  # compiled, but every graph it runs was compiled before in this process
        if trainer.cell.cell_id not in guard.failed:
            compile_s.setdefault(trainer.cell.cell_id, 0.0)
    gathered = measure.gather_times(list(timers.values()))
    return compile_s, {cell_id: metrics.step_times_over_ranks(ranks)
                       for cell_id, ranks in zip(timers, gathered)}


def warmup_found(warm: list[list[float]], per_rank: list[list[list[float]]]) -> tuple[list[int], int]:
    """Where each engine's warm-up ends, found by the changepoint test (bench.worker.steady.warmup_end) on its
    series: its warm-up steps, then its timed rounds (the slowest rank's). Returns (per engine the steps
    of its series found to be warm-up, 0 for none; the timed rounds the group leaves out as warm-up: the
    latest engine's end past the warm-up steps, the same for every engine so that rounds stay paired)."""
    found, first = [], 0
    for series_head, ranks in zip(warm, per_rank):
        end, _ = steady.warmup_end(list(series_head) + metrics.step_times_over_ranks(ranks))
        found.append(end)
        first = max(first, end - len(series_head))
    return found, first

