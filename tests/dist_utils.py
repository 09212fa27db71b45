"""Run a function on `world_size` real processes (spawn, gloo, FileStore rendezvous) and collect results.

No TCP ports: ranks meet through a FileStore on a temp file, as torch's own DDP tests do, so there is no
"address already in use" and no retry. A process-group timeout bounds any collective a bug leaves
unmatched, so a broken engine fails the test instead of hanging the suite.

A rank's return value travels as bytes (torch.save), never as a tensor: torch's multiprocessing queue sends
a tensor as a shared-memory handle that dies with the sending process, and a rank exits as soon as it has
put its result, often before the parent has read it ("received 0 items of ancdata", a flaky test_sync).
"""

from __future__ import annotations

import io
import os
import queue as queue_mod
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from bench.lifetime import die_with_parent

PG_TIMEOUT_S = 60


def _worker(rank, world_size, store_path, backend, fn, args, queue):
    die_with_parent()  # a killed pytest or microbench takes its ranks along (daemon=True covers exits only)
    torch.set_num_threads(1)  # the test machine's cores are shared; one thread per rank
    try:
        if backend == "nccl":  # one GPU per rank; NCCL refuses two ranks on one device
            torch.cuda.set_device(rank)
        store = dist.FileStore(store_path, world_size)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=timedelta(seconds=PG_TIMEOUT_S)
        )
        try:
            queue.put((rank, True, to_bytes(fn(rank, world_size, *args))))
        finally:
            dist.destroy_process_group()
    except BaseException:  # report every failure, including assertion errors, to the parent
        queue.put((rank, False, traceback.format_exc()))


def to_bytes(value) -> bytes:
    """`value` (tensors anywhere inside) as plain bytes: nothing in them refers to the sender's memory."""
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def from_bytes(data: bytes):
    return torch.load(io.BytesIO(data), weights_only=False)


def run_distributed(fn, world_size: int, *args, timeout_s: float = 120.0, backend: str = "gloo") -> list:
    """Run `fn(rank, world_size, *args)` on each rank; return the ranks' return values in rank order.

    `fn` must be picklable (a module-level function). A rank's exception is re-raised here as a
    RuntimeError carrying that rank's traceback.
    """
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        procs = [
            ctx.Process(
                target=_worker, args=(r, world_size, store_path, backend, fn, args, queue), daemon=True
            )
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results, failures = {}, {}
        deadline = time.monotonic() + timeout_s
        try:
            while len(results) + len(failures) < world_size and not failures:
                try:
                    rank, ok, value = queue.get(timeout=1.0)
                except queue_mod.Empty:
                    if time.monotonic() > deadline:
                        failures[-1] = f"timed out after {timeout_s} s"
                    elif all(not p.is_alive() for p in procs) and queue.empty():
                        codes = [p.exitcode for p in procs]
                        failures[-1] = f"ranks exited without a result, exit codes {codes}"
                    continue
                (results if ok else failures)[rank] = value
        finally:
            for p in procs:  # after a failure the others may be blocked in a collective: don't wait long
                p.join(timeout=5 if failures else timeout_s)
                if p.is_alive():
                    p.kill()
                    p.join()
    if failures:
        rank = min(failures)
        raise RuntimeError(f"rank {rank} of {world_size} failed:\n{failures[rank]}")
    return [from_bytes(results[r]) for r in range(world_size)]


def assert_no_rank_errors(check, world_size: int, *args, backend: str = "gloo"):
    """Run `check(rank, world_size, *args) -> list[str]` on each rank; fail with every rank's errors."""
    per_rank = run_distributed(check, world_size, *args, backend=backend)
    errors = [f"rank {r}: {e}" for r, errs in enumerate(per_rank) for e in errs]
    assert not errors, "\n".join(errors)
