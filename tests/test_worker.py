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
from bench.worker.cell import compute_only_rounds, run_group, steps_needed
from bench.worker.profiling import profile_cell
from bench.worker.trainer import Trainer


@pytest.fixture
def one_rank_group(tmp_path):
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_run_group_measures_a_cell(tmp_path, one_rank_group, precision):
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.engine=torch", "matrix.grad_accum=2",
                                       f"matrix.precision={precision}", "run.timed_steps=3", "run.repeats=2"])
    (cell,) = expand(config)
    ((status, error, row),) = run_group([cell], config, torch.device("cpu"), 0, 1)
    assert (status, error) == ("ok", None) and "status" not in row
    assert set(row) - set(RESULT_COLUMNS) == {"step_times_ms", "steps_wall_s"}
    assert row["n_timed_steps"] == len(row["step_times_ms"]) == 6  # timed_steps × repeats
    assert row["step_time_ms_p50"] > 0 and row["compute_only_ms_p50"] > 0
    assert row["step_time_ms_ci95_low"] <= row["step_time_ms_p50"] <= row["step_time_ms_ci95_high"]
    assert row["samples_per_s"] == pytest.approx(cell.global_batch / row["step_time_ms_p50"] * 1e3)
    assert row["allreduce_bytes"] > 0 and row["allreduce_busbw_gbps"] == 0.0  # one rank: no bus traffic
    assert row["forward_ms_p50"] > 0 and row["optimizer_ms_p50"] > 0 and row["sync_wait_ms_p50"] is None
    assert row["final_loss"] == row["final_loss"]  # finite, not NaN
    assert row["interleaved"] is False and row["speed_vs_torch"] is None and row["rank_skew_ms_p50"] is None
    assert row["peak_mem_mb"] > 0 and "trace_dir" not in row  # traces come from the profiled pass, later
    assert row["n_params"] == sum(p.numel() for p in torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.Linear(128, 128), torch.nn.Linear(128, 10)).parameters())


def test_engines_of_a_group_run_side_by_side_and_compare_to_torch(tmp_path, one_rank_group):
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.engine=torch,naive,overlap",
                                       "matrix.grad_accum=1", "matrix.bucket_cap_mb=25",
                                       "run.timed_steps=6", "profile.enabled=false"])
    cells = expand(config)
    outcomes = run_group(cells, config, torch.device("cpu"), 0, 1)
    rows = {cell.engine: row for cell, (_, _, row) in zip(cells, outcomes, strict=True)}
    assert all(status == "ok" for status, _, _ in outcomes)
    assert all(row["interleaved"] is True and row["n_timed_steps"] == 6 for row in rows.values())
    assert rows["torch"]["speed_vs_torch"] is None and rows["torch"]["verdict_vs_torch"] is None
    for engine in ("naive", "overlap"):
        row = rows[engine]
        assert row["speed_vs_torch_ci95_low"] <= row["speed_vs_torch"] <= row["speed_vs_torch_ci95_high"]
        assert row["verdict_vs_torch"] in ("faster", "slower", "within noise")
    # every engine trained on the same batches from the same start: the same loss
    assert rows["naive"]["final_loss"] == pytest.approx(rows["torch"]["final_loss"], rel=1e-5)


def test_profiled_pass_of_a_fresh_trainer_writes_labelled_traces(tmp_path, one_rank_group):
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.engine=overlap", "matrix.grad_accum=1"])
    (cell,) = expand(config)
    rel = profile_cell(cell, config, torch.device("cpu"), 0, 1, tmp_path)
    (trace,) = (tmp_path / rel).glob("rank0.*.pt.trace.json.gz")
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
    (samples,) = compute_only_rounds([trainer], timed, 3)
    assert len(samples) == 3 and min(samples) > 0
    replayed = trainer.schedule[first_compute_only:first_compute_only + 3]
    expected = [timed[i % len(timed)] for i in range(3)]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(replayed, expected, strict=True))
    assert trainer.cursor == first_compute_only + 3


def _torch_trainers(n: int):
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.engine=torch", "matrix.grad_accum=1",
                                       "workload.model_size=small", "profile.enabled=false"])
    (cell,) = expand(config)
    return [Trainer(cell, config, torch.device("cpu"), 0, 1, 80) for _ in range(n)]


def _ratio_and_verdict(steps, rounds=30):
    from bench import metrics, stats
    from bench.worker.measure import timed_rounds

    torch_ranks, other_ranks = timed_rounds(steps, rounds, torch.device("cpu"))
    ratio, low, high = stats.paired_ratio(metrics.step_times_over_ranks(torch_ranks),
                                          metrics.step_times_over_ranks(other_ranks))
    return ratio, low, high, stats.verdict(low, high)


def test_a_a_two_identical_engines_side_by_side_are_within_noise(one_rank_group):
    a, b = _torch_trainers(2)
    for _ in range(3):
        a.step(), b.step()
    ratio, low, high, verdict = _ratio_and_verdict([a.step, b.step])
    assert verdict == "within noise", (ratio, low, high)


def test_an_engine_20_percent_slower_is_found_slower(one_rank_group):
    import statistics
    import time

    a, b = _torch_trainers(2)
    for _ in range(3):
        a.step(), b.step()
    per_step = []
    for _ in range(5):
        t0 = time.perf_counter()
        a.step()
        per_step.append(time.perf_counter() - t0)
    extra = 0.2 * statistics.median(per_step)

    def slow_step():
        b.step()
        time.sleep(extra)  # 20 % of a step on top of the same work

    ratio, low, high, verdict = _ratio_and_verdict([a.step, slow_step])
    assert verdict == "slower" and 0.7 < ratio < 0.95, (ratio, low, high)
