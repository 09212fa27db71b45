"""Microbenchmark: step time of ddp_core's strategies against torch DDP, interleaved in one process group.

World size 2 over gloo, one workload of each built-in family (`mlp/10m`, `transformer/tiny`,
`resnet/tiny`), every engine wrapping an identical copy.
Engines run round-robin, one step each per round, in `bench.stats.round_order`: each engine first in
turn, every other round in the opposite order, so machine noise (other jobs, frequency changes) lands on
all of them alike and no engine always follows the same one. Step time is per step the maximum over ranks
(DESIGN.md), from a barrier to the end of `optimizer.step()`.

`torch #2` is a second, identical torch DDP: its ratio to the first is the noise floor of the run (an A/A
control). A ratio whose interval contains 1 is within noise; one that differs from 1 by no more than the
control does is no difference this run can show.

Run with `make microbench` (not part of `make test`). It prints a table of medians, throughput and the
ratio to torch DDP, then hands each engine's real per-step samples to pytest-benchmark (see `replay`).
"""

from __future__ import annotations

import copy
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from bench import stats
from bench.workloads import get_workload
from ddp_core import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from dist_utils import run_distributed  # noqa: E402  (the tests' spawn + FileStore helper)

WORLD_SIZE = 2
# (per-rank batch, timed rounds): the short resnet step gets more rounds for the same interval width
WORKLOADS = {("mlp", "10m"): (64, 60), ("transformer", "tiny"): (8, 60), ("resnet", "tiny"): (16, 300)}
WARMUP_ROUNDS = 3  # torch DDP rebuilds its buckets after iteration 1: warm up ≥ 2
ENGINES = ("torch", "torch #2", "naive", "bucketed", "overlap")
WIDTHS = (10, 9, 9, 11, 10, 9, 10)  # table columns
FIRST_BUCKET_MB = 1.0  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES is 1 MiB


def build_engine(name, module):
    """Defaults on both sides; ddp_core gets torch's default 1 MiB first bucket so layouts match."""
    if name.startswith("torch"):
        return nn.parallel.DistributedDataParallel(module)
    return DistributedDataParallel(module, strategy=name, first_bucket_mb=FIRST_BUCKET_MB)


def interleaved(rank, world_size, warmup, rounds, family, size, per_rank) -> dict:
    """Every rank: step each engine in turn; return per-step times (max over ranks) and a parity check."""
    workload = get_workload(family, size)
    torch.manual_seed(0)
    base = workload.build_model()
    engines = {name: build_engine(name, copy.deepcopy(base)) for name in ENGINES}
    opts = {name: torch.optim.SGD(m.parameters(), lr=1e-3) for name, m in engines.items()}
    data = workload.make_dataset(max(per_rank * world_size, workload.default_num_samples() or 0),
                                 torch.device("cpu"), seed=0)
    batch = data.batch(torch.arange(rank * per_rank, (rank + 1) * per_rank))
    samples = {name: [] for name in ENGINES}
    for r in range(warmup + rounds):
        for name in (ENGINES[e] for e in stats.round_order(r, len(ENGINES))):
            model, opt = engines[name], opts[name]
            dist.barrier()
            start = time.perf_counter()
            opt.zero_grad(set_to_none=True)
            workload.loss(model, batch).backward()
            opt.step()
            if r >= warmup:
                samples[name].append(time.perf_counter() - start)
    times = torch.tensor([samples[name] for name in ENGINES], dtype=torch.float64)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)  # a step lasts as long as its slowest rank
    # correctness beside the timing: every engine took the same steps on the same data as torch DDP
    torch_params = list(engines["torch"].module.parameters())
    max_diff = {
        name: max((a - b).abs().max().item() for a, b in zip(engines[name].module.parameters(), torch_params))
        for name in ENGINES
    }
    n_params = sum(p.numel() for p in base.parameters())
    n_tensors = sum(1 for p in base.parameters() if p.requires_grad)
    return {"times_s": dict(zip(ENGINES, times.tolist())), "max_diff": max_diff, "n_params": n_params,
            "n_tensors": n_tensors}


@pytest.fixture(scope="module", params=list(WORKLOADS), ids=lambda w: "/".join(w))
def measured(request):
    (family, size), (per_rank, rounds) = request.param, WORKLOADS[request.param]
    result = run_distributed(interleaved, WORLD_SIZE, WARMUP_ROUNDS, rounds, family, size, per_rank,
                             timeout_s=900)[0]
    times, global_batch = result["times_s"], per_rank * WORLD_SIZE
    torch_median = statistics.median(times["torch"])
    print(
        f"\nddp_core microbench: {family}/{size} ({result['n_params'] / 1e6:.1f}M params in "
        f"{result['n_tensors']} tensors), world size {WORLD_SIZE}, gloo/CPU, per-rank batch {per_rank}, "
        f"{rounds} interleaved steps per engine after {WARMUP_ROUNDS} warm-up rounds"
    )
    # "paired": the median over rounds of torch's step / this engine's step in the same round, which
    # cancels noise that lasts a round (another job's burst) better than a ratio of medians; its 95 %
    # interval resamples rounds (bench.stats.paired_ratio, the runner's rule)
    header = ("engine", "p50_ms", "p90_ms", "samples/s", "vs torch", "paired", "95% CI", "max|Δθ|")
    print(f"{header[0]:<10}{header[1]:>9}{header[2]:>9}{header[3]:>11}{header[4]:>10}{header[5]:>9}"
          f"{header[6]:>16}{header[7]:>10}")
    for name in ENGINES:
        ts = sorted(times[name])
        median, p90 = statistics.median(ts), ts[min(len(ts) - 1, int(0.9 * len(ts)))]
        paired, low, high = stats.paired_ratio(times["torch"], times[name])
        ci = f"{low:.3f}–{high:.3f}" if low is not None else "-"
        print(
            f"{name:<10}{median * 1e3:>9.1f}{p90 * 1e3:>9.1f}{global_batch / median:>11.1f}"
            f"{torch_median / median:>9.3f}x{paired:>8.3f}x{ci:>16}{result['max_diff'][name]:>10.2g}"
        )
    return result


class replay:
    """A pytest-benchmark timer that replays measured durations: each round 'lasts' one real sample.

    pytest-benchmark reads its timer twice per round (before and after); this clock advances by the
    next sample on every second read, so its statistics are those of the interleaved measurement
    (which could not run inside its own timing loop without losing the interleaving).
    """

    def __init__(self, samples):
        self.samples, self.reads, self.now = samples, 0, 0.0

    def __call__(self):
        if self.reads % 2 == 1:
            self.now += self.samples[self.reads // 2]
        self.reads += 1
        return self.now


@pytest.mark.parametrize("engine", ENGINES)
def test_step_time(benchmark, measured, engine):
    samples = measured["times_s"][engine]
    assert measured["max_diff"][engine] < 1e-4, f"{engine} diverged from torch DDP: {measured['max_diff']}"
    benchmark._timer = replay(samples)  # private attribute, read by each round's runner
    torch_samples = measured["times_s"]["torch"]
    benchmark.extra_info["throughput_vs_torch_p50"] = statistics.median(torch_samples) / statistics.median(
        samples
    )
    benchmark.extra_info["throughput_vs_torch_paired"] = statistics.median(
        t / e for t, e in zip(torch_samples, samples)
    )
    benchmark.pedantic(lambda: None, rounds=len(samples), iterations=1, warmup_rounds=0)
