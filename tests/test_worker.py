"""bench.worker's cell and trainer in-process, in a one-rank gloo group (FileStore: no ports)."""

from __future__ import annotations

import gzip
import json

import pytest
import torch
import torch.distributed as dist

from bench.config import load_config
from bench.matrix import expand
from bench.schema import RESULT_COLUMNS
from bench.worker.cell import compute_only_window, run_cell, steps_needed
from bench.worker.trainer import Trainer


@pytest.fixture
def one_rank_group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_cell_runner_measures_a_cell(tmp_path, one_rank_group, precision):
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.engine=torch", "matrix.grad_accum=2",
                                       f"matrix.precision={precision}", "run.timed_steps=3", "run.repeats=2"])
    (cell,) = expand(config)
    status, error, row = run_cell(cell, config, torch.device("cpu"), 0, 1, tmp_path)
    assert (status, error) == ("ok", None) and "status" not in row
    assert set(row) - set(RESULT_COLUMNS) == {"step_times_ms", "steps_wall_s"}
    assert row["n_timed_steps"] == len(row["step_times_ms"]) == 6  # timed_steps × repeats
    assert row["step_time_ms_p50"] > 0 and row["compute_only_ms_p50"] > 0
    assert row["samples_per_s"] == pytest.approx(cell.global_batch / row["step_time_ms_p50"] * 1e3)
    assert row["allreduce_bytes"] > 0 and row["allreduce_busbw_gbps"] == 0.0  # one rank: no bus traffic
    assert row["forward_ms_p50"] > 0 and row["optimizer_ms_p50"] > 0 and row["sync_wait_ms_p50"] is None
    assert row["final_loss"] == row["final_loss"]  # finite, not NaN
    assert row["n_params"] == sum(p.numel() for p in torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.Linear(128, 128), torch.nn.Linear(128, 10)).parameters())
    (trace,) = (tmp_path / row["trace_dir"]).glob("rank0.*.pt.trace.json.gz")
    events = json.loads(gzip.decompress(trace.read_bytes()))["traceEvents"]
    assert {"forward", "backward", "sync_grads", "opt_step"} <= {e.get("name") for e in events}


def test_index_schedule_covers_grad_accum_micro_batches(tmp_path, one_rank_group):
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.engine=torch", "matrix.grad_accum=3",
                                       "profile.enabled=false"])
    (cell,) = expand(config)
    trainer = Trainer(cell, config, torch.device("cpu"), 0, 1, steps_needed(config))
    step = trainer.schedule[0]
    assert len(step) == 3 and all(idx.shape == (cell.per_rank_batch,) for idx in step)
    assert len(set(torch.cat(step).tolist())) == 3 * cell.per_rank_batch  # distinct samples in a step


def test_compute_only_window_replays_the_timed_batches(tmp_path, one_rank_group):
    # Exposed communication = step − compute-only step: both must see the same batches (variable-length
    # data pads each batch to its own width, so other batches would cost other compute).
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.engine=torch", "matrix.grad_accum=1",
                                       "run.timed_steps=2", "run.compute_only_steps=3",
                                       "profile.enabled=false"])
    (cell,) = expand(config)
    trainer = Trainer(cell, config, torch.device("cpu"), 0, 1, steps_needed(config))
    for _ in range(3):
        trainer.step()
    timed = trainer.schedule[1:3]
    first_compute_only = trainer.cursor
    assert compute_only_window(trainer, timed, 3) > 0
    replayed = trainer.schedule[first_compute_only:first_compute_only + 3]
    expected = [timed[i % len(timed)] for i in range(3)]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(replayed, expected, strict=True))
    assert trainer.cursor == first_compute_only + 3
