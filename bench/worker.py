"""One rank of a launch: `python -m bench.worker --plan PLAN [--events FILE]`, started by torchrun or srun.

Runs, on every rank, each cell of the plan whose world size is this launch's WORLD_SIZE:
build → warm-up → timed window(s) → parity check → phase pass → compute-only window → all-reduce probe
→ profiled pass (never timed). Rank 0 appends "start" / "finish" (with the result row) events to the
events file, one JSON object per line, flushed; the launcher (or `bench run --collect`) turns finished
events into cells.jsonl. A rank whose cell raises writes an "error" event and exits non-zero, so
torchrun tears the launch down and the launcher relaunches the remaining cells.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import socket
import statistics
import sys
import time
import traceback
from contextlib import nullcontext
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.profiler import record_function
from torch.utils.data import DistributedSampler

from bench import engines, metrics, profiling
from bench.config import BenchConfig, config_from_dict
from bench.matrix import Cell
from bench.workloads import get_workload

ERROR_TAIL_LINES = 12
ADAMW_LR = 1e-4  # the optimizer's work per step does not depend on lr; small keeps the loss finite


class Events:
    """Append-only JSON-lines event log, flushed per event (the launcher tails it)."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def emit(self, **event) -> None:
        event["t"] = time.time()
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")
            f.flush()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # note: a CPU-GPU sync point


def _label(name: str, on: bool):
    """record_function only in the profiled pass: the timed steps carry no profiler annotations."""
    return record_function(name) if on else nullcontext()


class Precision:
    """autocast, GradScaler and tf32 flags for one precision."""

    def __init__(self, precision: str, device: torch.device):
        cuda = device.type == "cuda"
        if cuda:  # fp32 means fp32: tf32 off unless asked (cuDNN's default is on)
            torch.backends.cuda.matmul.allow_tf32 = precision == "tf32"
            torch.backends.cudnn.allow_tf32 = precision == "tf32"
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
        self.autocast = lambda: (torch.autocast(device.type, dtype=dtype) if dtype else nullcontext())
        self.scaler = torch.amp.GradScaler(device.type, enabled=precision == "fp16")


class CellRunner:
    """Everything one cell needs on one rank; each method is a phase of the cell."""

    def __init__(self, cell: Cell, config: BenchConfig, device: torch.device, run_dir: Path):
        self.cell, self.config, self.device, self.run_dir = cell, config, device, run_dir
        self.rank, self.ws = dist.get_rank(), dist.get_world_size()
        r = config.run
        torch.manual_seed(r.seed)
        if device.type == "cuda":
            torch.cuda.manual_seed_all(r.seed)
            torch.cuda.reset_peak_memory_stats(device)
        else:
            _reset_peak_rss()
        self.workload = get_workload(cell.model, cell.model_size, config.workload.options())
        module = self.workload.build_model().to(device)
        self.n_params = sum(p.numel() for p in module.parameters() if p.requires_grad)
        self.model = engines.wrap(cell.engine, module, cell.bucket_cap_mb, cell.comm_dtype, device)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=ADAMW_LR)
        self.precision = Precision(cell.precision, device)
        self.steps_wall_s = 0.0  # time inside step loops (for the launcher's overhead figure)

        p = config.profile
        n_steps = (r.warmup_steps + r.timed_steps * r.repeats + r.phase_steps + r.compute_only_steps
                   + (p.steps if p.enabled else 0))
        per_step = cell.per_rank_batch * cell.grad_accum
        # The dataset the workload stands for (MRPC: 3,668 pairs, so padded lengths vary as they would),
        # else enough distinct samples for a few steps; later steps cycle through new sampler epochs.
        n_samples = max(self.workload.default_num_samples() or per_step * self.ws * min(n_steps, 4),
                        per_step * self.ws)
        self.dataset = self.workload.make_dataset(n_samples, device, r.seed)
        self.sampler = DistributedSampler(self.dataset, num_replicas=self.ws, rank=self.rank, shuffle=True,
                                          seed=r.seed, drop_last=True)
        self.schedule = self._index_schedule(n_steps)
        self.cursor = 0

    def _index_schedule(self, n_steps: int) -> list[list[torch.Tensor]]:
        """Per step, grad_accum index tensors of per_rank_batch samples from the DistributedSampler."""
        b, k = self.cell.per_rank_batch, self.cell.grad_accum
        flat, epoch = [], 0
        while len(flat) < n_steps * k * b:
            self.sampler.set_epoch(epoch)
            flat += list(self.sampler)
            epoch += 1
        idx = torch.tensor(flat[: n_steps * k * b], dtype=torch.int64).view(n_steps, k, b)
        return [[idx[s, m] for m in range(k)] for s in range(n_steps)]

    def _next(self) -> list[torch.Tensor]:
        micro = self.schedule[self.cursor]
        self.cursor += 1
        return micro

    # ---- one optimizer step -------------------------------------------------------------------------

    def step(self, sync: bool = True, labels: bool = False, phases: dict | None = None) -> torch.Tensor:
        """grad_accum micro-steps (all but the last under no_sync(); all of them when not `sync`) + optimizer.

        `phases`: a dict to add forward/backward/optimizer milliseconds to, with device syncs between
        phases (the instrumented pass only). Returns the last micro-step's loss (not divided by K).
        """
        model, k, dev = self.model, self.cell.grad_accum, self.device
        clock = time.perf_counter
        for i, idx in enumerate(self._next()):
            ctx = model.no_sync() if (i < k - 1 or not sync) else nullcontext()
            with ctx:
                with _label("data_movement", labels):
                    batch = self.dataset.batch(idx)
                if phases is not None:
                    _sync(dev)
                    t0 = clock()
                with _label("forward", labels), self.precision.autocast():
                    loss = self.workload.loss(model, batch)
                if phases is not None:
                    _sync(dev)
                    t1 = clock()
                with _label("backward", labels):
                    self.precision.scaler.scale(loss / k).backward()
                if phases is not None:
                    _sync(dev)
                    phases["forward"] = phases.get("forward", 0.0) + (t1 - t0) * 1e3
                    phases["backward"] = phases.get("backward", 0.0) + (clock() - t1) * 1e3
        if labels and sync:
            # The all-reduces were issued inside backward; on GPU they may still run: wait for them here so
            # the trace shows how long the step waits for its gradients.
            with _label("sync_grads", labels):
                _sync(dev)
        if phases is not None:
            phases["sync_wait"] = engines.sync_wait_ms(model) if sync else None
            t2 = clock()
        with _label("opt_step", labels):
            self.precision.scaler.step(self.optimizer)
            self.precision.scaler.update()
            self.optimizer.zero_grad(set_to_none=True)
        if phases is not None:
            _sync(dev)
            phases["optimizer"] = (clock() - t2) * 1e3
        return loss.detach()

    def timed_window(self, n: int, sync: bool = True) -> tuple[list[float], torch.Tensor]:
        """n steps timed per step (CUDA events on GPU, perf_counter on CPU) → per-step ms over ranks (max)."""
        dist.barrier()
        _sync(self.device)
        t_start = time.perf_counter()
        if self.device.type == "cuda":
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(n)]
            for start, end in events:
                start.record()
                loss = self.step(sync=sync)
                end.record()
            torch.cuda.synchronize(self.device)
            local = [start.elapsed_time(end) for start, end in events]
        else:
            local = []
            for _ in range(n):
                t0 = time.perf_counter()
                loss = self.step(sync=sync)
                local.append((time.perf_counter() - t0) * 1e3)
        self.steps_wall_s += time.perf_counter() - t_start
        gathered = [None] * self.ws
        dist.all_gather_object(gathered, local)
        return metrics.step_times_over_ranks(gathered), loss

    def untimed(self, n: int, **kw) -> None:
        t0 = time.perf_counter()
        for _ in range(n):
            self.step(**kw)
        _sync(self.device)
        self.steps_wall_s += time.perf_counter() - t0

    # ---- checks and probes --------------------------------------------------------------------------

    def params_identical(self) -> bool:
        """Every rank's parameters equal rank 0's, bit for bit (one broadcast per dtype)."""
        ok = True
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in self.model.parameters():
            by_dtype.setdefault(p.dtype, []).append(p.detach().reshape(-1))
        for tensors in by_dtype.values():
            mine = torch.cat(tensors)
            ref = mine.clone()
            dist.broadcast(ref, 0)
            ok = ok and torch.equal(mine, ref)
        flag = torch.tensor([1 if ok else 0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag.item())

    def mean_over_ranks(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return t.item() / self.ws

    def max_over_ranks(self, value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def allreduce_probe(self, iters: int) -> tuple[int, float | None, int]:
        """Time all-reduces of the engine's largest bucket (in the comm dtype) → (bytes, seconds, buckets)."""
        sizes = engines.bucket_sizes_bytes(self.cell.engine, self.model, self.cell.bucket_cap_mb)
        dtype = engines.COMM_TORCH_DTYPES[self.cell.comm_dtype] or torch.float32
        numel = max(1, max(sizes) // 4)  # gradients are fp32: bytes / 4 elements
        buf = torch.ones(numel, dtype=dtype, device=self.device)
        nbytes = numel * buf.element_size()
        if iters == 0:
            return nbytes, None, len(sizes)
        for _ in range(2):  # warm-up: first collectives set up connections and buffers
            dist.all_reduce(buf)
        dist.barrier()
        _sync(self.device)
        t0 = time.perf_counter()
        for _ in range(iters):
            dist.all_reduce(buf)
        _sync(self.device)
        seconds = self.max_over_ranks((time.perf_counter() - t0) / iters)
        return nbytes, seconds, len(sizes)

    def profiled_pass(self) -> str:
        """The profiler pass (bench.profiling); returns the trace folder relative to the run folder."""
        rel = f"traces/{self.cell.cell_id}"
        t0 = time.perf_counter()
        profiling.profiled_pass(lambda: self.step(labels=True), self.config.profile, self.run_dir / rel,
                                self.rank, cuda=self.device.type == "cuda")
        self.steps_wall_s += time.perf_counter() - t0
        return rel

    def peak_mem_mb(self) -> float:
        if self.device.type == "cuda":
            local = torch.cuda.max_memory_allocated(self.device) / 2**20
        else:
            local = _peak_rss_mb()
        return self.max_over_ranks(local)

    def work_per_step(self, steps: list[list[torch.Tensor]]) -> tuple[float | None, float | None]:
        """(tokens, model FLOPs) per optimizer step summed over ranks, counted outside any timed window."""
        tokens, flops = 0.0, 0.0
        for micro in steps:
            for idx in micro:
                batch = self.dataset.batch(idx)
                t = self.workload.tokens_in_batch(batch)
                f = self.workload.train_flops_per_sample(batch)
                tokens = None if t is None or tokens is None else tokens + t
                flops = None if f is None or flops is None else flops + f * len(idx)
        out = []
        for value in (tokens, flops):
            known = self.max_over_ranks(0.0 if value is None else 1.0) > 0
            out.append(self.mean_over_ranks(value or 0.0) * self.ws / len(steps) if known else None)
        return out[0], out[1]

    # ---- the cell -----------------------------------------------------------------------------------

    def run(self) -> dict:
        """All phases of the cell; returns the measured part of the result row (meaningful on rank 0)."""
        r, cell = self.config.run, self.cell
        self.untimed(r.warmup_steps)
        first_timed = self.cursor
        samples: list[float] = []
        for _ in range(r.repeats):
            window, last_loss = self.timed_window(r.timed_steps)
            samples += window
        timed_steps = self.schedule[first_timed:self.cursor]
        phases: list[dict] = []
        for _ in range(r.phase_steps):
            phases.append({})
            t0 = time.perf_counter()
            self.step(phases=phases[-1])
            self.steps_wall_s += time.perf_counter() - t0
        final_loss = self.mean_over_ranks(float(last_loss.float()))
        status = "ok" if self.params_identical() else "diverged"
        compute_only = None
        if r.compute_only_steps:  # no_sync from here on: ranks' parameters drift apart, checked above
            # Replay the timed window's batches: with variable-length data (MRPC-like) other batches have
            # other padded widths, so their compute differs and exposed communication could go negative.
            replay = [timed_steps[i % len(timed_steps)] for i in range(r.compute_only_steps)]
            self.schedule[self.cursor:self.cursor + len(replay)] = replay
            window, _ = self.timed_window(r.compute_only_steps, sync=False)
            compute_only = metrics.percentile(window, 50)
        nbytes, probe_s, n_buckets = self.allreduce_probe(r.probe_iters)
        trace_dir = self.profiled_pass() if self.config.profile.enabled else None
        tokens, flops = self.work_per_step(timed_steps)
        peak_mem = self.peak_mem_mb()

        p50 = metrics.percentile(samples, 50)
        algbw = metrics.algbw_gbps(nbytes, probe_s)
        flops_per_s = metrics.throughput(flops, p50)
        peak = _peak_flops(self.device, cell.precision)

        def phase_p50(name):
            values = [ph[name] for ph in phases if ph.get(name) is not None]
            return metrics.percentile(values, 50)

        return {
            "status": status,
            "n_timed_steps": len(samples),
            "step_time_ms_p50": p50,
            "step_time_ms_p90": metrics.percentile(samples, 90),
            "step_time_ms_mean": statistics.fmean(samples),
            "step_time_ms_min": min(samples),
            "step_time_ms_std": statistics.stdev(samples) if len(samples) > 1 else None,
            "samples_per_s": metrics.throughput(cell.global_batch, p50),
            "tokens_per_s": metrics.throughput(tokens, p50),
            "compute_only_ms_p50": compute_only,
            "exposed_comm_ms": metrics.exposed_comm_ms(p50, compute_only),
            "peak_mem_mb": peak_mem,
            "allreduce_bytes": nbytes,
            "allreduce_algbw_gbps": algbw,
            "allreduce_busbw_gbps": metrics.busbw_gbps(algbw, self.ws),
            "n_buckets": n_buckets,
            "forward_ms_p50": phase_p50("forward"),
            "backward_ms_p50": phase_p50("backward"),
            "sync_wait_ms_p50": phase_p50("sync_wait"),
            "optimizer_ms_p50": phase_p50("optimizer"),
            "final_loss": final_loss,
            "model_tflops_per_s": None if flops_per_s is None else flops_per_s / 1e12,
            "mfu": metrics.mfu(flops_per_s, None if peak is None else peak * self.ws),
            "n_params": self.n_params,
            "seq_len": getattr(self.workload, "seq_len", None),  # sequence models only
            "trace_dir": trace_dir,
            "step_times_ms": samples,
            "steps_wall_s": self.steps_wall_s,
        }


def _reset_peak_rss() -> None:
    """Reset the process's peak RSS (Linux VmHWM) so that each cell reports its own peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass  # not Linux (or not allowed): _peak_rss_mb falls back to the peak since the process started


def _peak_rss_mb() -> float:
    """Peak resident memory of this process since the last reset (VmHWM), else since it started."""
    try:
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+)\s+kB", status).group(1)) / 1024
    except (OSError, AttributeError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _peak_flops(device: torch.device, precision: str) -> float | None:
    """The device's peak FLOP/s from bench.peaks (written separately); None on CPU or when unknown."""
    if device.type != "cuda":
        return None
    try:
        from bench.peaks import peak_flops_per_s
    except ImportError:
        return None
    return peak_flops_per_s(torch.cuda.get_device_name(device), precision)


def _inject(fault: str | None, cell: Cell, rank: int, ws: int) -> None:
    """Test-only faults (debug.fault): hang every rank, or crash the last rank."""
    if fault == "hang":
        while True:
            time.sleep(1)
    if fault == "crash" and rank == ws - 1:
        raise RuntimeError(f"injected crash in {cell.cell_id} on rank {rank} (debug.fault)")


def _launcher_alive(pid: int | None, device: torch.device) -> bool:
    """All ranks agree whether the launcher still runs (a killed launcher must not leave a sweep going)."""
    if pid is None:
        return True
    try:
        os.kill(pid, 0)
        alive = 1
    except ProcessLookupError:
        alive = 0
    flag = torch.tensor([alive], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def _ranks_from_slurm() -> None:
    """Started by plain `srun` (one task per GPU) rather than torchrun: take the ranks from SLURM's
    variables. MASTER_ADDR and MASTER_PORT must be exported by the job script (env:// rendezvous)."""
    if "RANK" in os.environ or "SLURM_PROCID" not in os.environ:
        return
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ.get("SLURM_LOCALID", "0")
    os.environ["LOCAL_WORLD_SIZE"] = os.environ.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True, help="plan JSON written by `bench run`")
    parser.add_argument("--events", type=Path, default=None,
                        help="events file (default: <run_dir>/events/<host>-<pid>.jsonl)")
    args = parser.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    config = config_from_dict(plan["config"])
    run_dir = Path(plan["run_dir"])
    _ranks_from_slurm()
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    events = Events(args.events or run_dir / "events" / f"{socket.gethostname()}-{os.getpid()}.jsonl")
    events.emit(event="hello", rank=rank, pid=os.getpid(), pgid=os.getpgid(0))

    # 0 (a plan for your own torchrun/srun): share this node's cores among its ranks
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
    threads = plan["threads_per_rank"] or max(1, (os.cpu_count() or 1) // local_ranks)
    torch.set_num_threads(threads)
    if config.run.device == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=config.run.pg_timeout_s),
                            **({"device_id": device} if backend == "nccl" else {}))
    host = socket.gethostname()
    gpu_name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    cells = [Cell.from_dict(c) for c in plan["cells"] if c["world_size"] == ws]
    try:
        for cell in cells:
            if not _launcher_alive(plan.get("launcher_pid"), device):
                print("bench.worker: the launcher is gone; stopping", file=sys.stderr)
                return 1
            if rank == 0:
                events.emit(event="start", cell_id=cell.cell_id)
            t_cell = time.perf_counter()
            try:
                _inject(config.debug.fault_for(cell.cell_id), cell, rank, ws)
                runner = CellRunner(cell, config, device, run_dir)
                row = runner.run()
                del runner
            except Exception as e:
                status = "oom" if isinstance(e, torch.OutOfMemoryError) else "failed"
                tail = traceback.format_exc().strip().splitlines()[-ERROR_TAIL_LINES:]
                events.emit(event="error", cell_id=cell.cell_id, rank=rank, status=status,
                            error="\n".join(tail))
                raise
            if rank == 0:
                row |= {"device": device.type, "backend": backend, "threads_per_rank": threads,
                        "gpu_name": gpu_name, "hostname": host, "cell_wall_s": time.perf_counter() - t_cell}
                events.emit(event="finish", cell_id=cell.cell_id, row=row)
            if device.type == "cuda":
                torch.cuda.empty_cache()
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
