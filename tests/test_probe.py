"""The all-reduce probe (nccl-tests style) and its size sweep: real ranks (spawn, gloo, FileStore)."""

from __future__ import annotations

import types

import pytest
import torch
from dist_utils import run_distributed

from bench.config import load_config
from bench.matrix import expand
from bench.worker import measure
from bench.worker.cell import steps_needed
from bench.worker.measure import SWEEP_MIN_BYTES, Probe
from bench.worker.row_values import probe_values
from bench.worker.trainer import Trainer


def probes(rank, world_size):
    """Three cells' probes in one process (one launch): fp32, fp32 again (it reuses the first one's sweep
    points), then fp16 on the wire; each with the all-reduces it timed (message bytes)."""
    out = []
    real = measure.allreduce_seconds
    for comm in ("none", "none", "fp16"):
        config = load_config("cpu-smoke", ["matrix.scaling=strong",
            "matrix.world_size=2", "matrix.engine=bucketed", "matrix.grad_accum=1",
            f"matrix.comm_dtype={comm}", "matrix.bucket_cap_mb=25", "profile.enabled=false"])
        (cell,) = expand(config)
        trainer = Trainer(cell, config, torch.device("cpu"), rank, world_size, steps_needed(config))
        timed = []

        def counting(numel, dtype, device, iters, timed=timed):
            timed.append(numel * dtype.itemsize)
            return real(numel, dtype, device, iters)

        measure.allreduce_seconds = counting
        out.append((measure.allreduce_probe(trainer, iters=2), timed))
    # nccl-tests reports the mean over ranks (-a 1): rank 0's clock sees 1 s for 2 all-reduces, rank 1's 3 s
    measure.time = types.SimpleNamespace(perf_counter=iter([0.0, 1.0 + 2.0 * rank]).__next__)
    mean = real(4, torch.float32, torch.device("cpu"), 2)
    return out, mean


@pytest.mark.timeout(120)
def test_probe_sweeps_doubling_sizes_once_per_launch():
    ranks = run_distributed(probes, 2)
    (fp32, timed_fp32), (again, timed_again), (fp16, timed_fp16) = ranks[0][0]
    for probe, dtype, itemsize, timed in ((fp32, torch.float32, 4, timed_fp32),
                                          (fp16, torch.float16, 2, timed_fp16)):
        # mlp tiny: 26,122 fp32 parameters in one 25 MiB bucket → 26,122 elements of the wire's dtype
        assert probe.n_buckets == 1 and probe.dtype == dtype and probe.nbytes == 26_122 * itemsize
        expected = [SWEEP_MIN_BYTES * 2**k for k in range(10) if SWEEP_MIN_BYTES * 2**k < probe.nbytes]
        assert [size for size, _ in probe.sweep] == expected + [probe.nbytes]
        assert all(s > 0 for _, s in probe.sweep) and probe.sweep[-1][1] == probe.seconds
        assert timed == [probe.nbytes] + expected  # a new dtype: every sweep point timed
    # the second fp32 cell times only its largest bucket and reuses the sweep points
    assert timed_again == [again.nbytes] and again.sweep[:-1] == fp32.sweep[:-1]
    # the time is the mean over ranks: every rank reports the same number; (0.5 s + 1.5 s) / 2 = 1 s
    assert [r[0][0][0].seconds for r in ranks] == [fp32.seconds] * 2
    assert [r[1] for r in ranks] == [1.0, 1.0]


def test_probe_values_follow_nccl_tests():
    # 1e9 bytes in 0.5 s: algbw 2 GB/s; busbw at n = 4 is 2 · 2(4−1)/4 = 3 GB/s.
    probe = Probe(nbytes=10**9, seconds=0.5, n_buckets=3, dtype=torch.bfloat16,
                  sweep=[(4096, 2e-6), (10**9, 0.5)])
    row = probe_values(probe, world_size=4)
    assert row["allreduce_bytes"] == 10**9 and row["n_buckets"] == 3
    assert row["allreduce_algbw_gbps"] == pytest.approx(2.0)
    assert row["allreduce_busbw_gbps"] == pytest.approx(3.0)
    small, large = row["allreduce_sweep"]
    # 4096 B in 2 µs: 2.048 GB/s, busbw 3.072 GB/s
    assert small == {"size_bytes": 4096, "dtype": "bfloat16", "time_us": pytest.approx(2.0),
                     "algbw_gbps": pytest.approx(2.048), "busbw_gbps": pytest.approx(3.072)}
    assert large["time_us"] == pytest.approx(5e5) and large["busbw_gbps"] == pytest.approx(3.0)
    one = probe_values(Probe(nbytes=4096, seconds=None, n_buckets=1, dtype=torch.float32, sweep=[]), 1)
    assert one["allreduce_algbw_gbps"] is None and one["allreduce_busbw_gbps"] == 0.0
    assert one["allreduce_sweep"] == []
