"""Engine options as matrix axes (fsdp2, comm_hook, static_graph, gradient_as_bucket_view, compile): the
expansion, bad values, the parity gates' formula, and the runner end to end (gloo on CPU)."""

from __future__ import annotations

import csv
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.config import ConfigError, load_config
from bench.matrix import expand
from bench.workloads import model_label

REPO = Path(__file__).resolve().parent.parent
# Short windows: the runner's phases all run, each briefly.
FAST = ["matrix.scaling=strong", "matrix.grad_accum=1", "workload.model=mlp", "workload.model_size=tiny",
        "workload.global_batch=4", "run.warmup_steps=2", "run.timed_steps=3", "run.compute_only_steps=1",
        "run.phase_steps=1", "run.probe_iters=1", "profile.enabled=false", "run.cell_timeout_s=120",
        "run.launches=1"]


def ids(preset: str, *sets: str, cuda: bool = False) -> list[str]:
    return [c.cell_id for c in expand(load_config(preset, list(sets), cuda_available=cuda), gpu_count=8)]


def test_cell_ids_without_options_are_unchanged():
    """A cell with every engine option at its default keeps the id it had before options existed (the
    formula below is that id), in every preset on both devices; cpu-smoke's ids are pinned whole (sha256
    of the sorted ids on main before this change)."""
    for preset in sorted(p.stem for p in (REPO / "bench" / "configs").glob("*.toml")):
        for cuda in (False, True):
            for cell in expand(load_config(preset, cuda_available=cuda), gpu_count=8):
                if cell.option_tags():
                    continue
                bucket = "na" if cell.bucket_cap_mb is None else f"{cell.bucket_cap_mb:g}"
                old = (f"{cell.engine}-{model_label(cell.model)}.{cell.model_size}-ws{cell.world_size}"
                       f"-b{bucket}-{cell.precision}-c{cell.comm_dtype}-ga{cell.grad_accum}-{cell.scaling}"
                       f"-gb{cell.global_batch}")
                # the memory rule's split forwards (issue 43) say so; no cell had them before
                old += f"-mb{cell.micro_batch}" if cell.micro_splits > 1 else ""
                assert cell.cell_id == old
    smoke = "\n".join(sorted(ids("cpu-smoke"))).encode()
    assert hashlib.sha256(smoke).hexdigest()[:16] == "82e0d1dbcc2ddb5e"


def test_options_are_swept_only_for_the_engines_that_take_them():
    cells = ids("cpu-smoke", "matrix.engine=torch,naive,fsdp2", "matrix.world_size=2", "matrix.grad_accum=1",
                "matrix.scaling=strong", "matrix.reshard_after_forward=true,false",
                "matrix.comm_hook=none,powersgd,fp16", "matrix.powersgd_rank=1,4",
                "matrix.static_graph=false,true")
    assert len(cells) == len(set(cells))
    naive = [c for c in cells if c.startswith("naive-")]
    assert naive == ["naive-mlp.tiny-ws2-bna-fp32-cnone-ga1-strong-gb8"]  # one cell, its old id
    assert sorted(c.rsplit("-", 1)[1] for c in cells if c.startswith("fsdp2-")) == ["raf0", "raf1"]
    torch_cells = [c for c in cells if c.startswith("torch-")]
    # hooks none, fp16 (= comm_dtype fp16), powersgd at ranks 1 and 4; × static_graph false/true
    assert len(torch_cells) == 4 * 2
    assert "torch-mlp.tiny-ws2-b0.05-fp32-cfp16-ga1-strong-gb8" in torch_cells
    assert "torch-mlp.tiny-ws2-b0.05-fp32-cnone-ga1-strong-gb8-hpowersgd.r1-static" in torch_cells


def test_options_cells_keep_the_options_to_a_slice():
    """Cells that set an option (and fsdp2's) exist only where options_cells matches their base id; the
    cells without options are all still there."""
    sets = ["matrix.engine=torch,fsdp2", "matrix.comm_hook=none,powersgd", "matrix.world_size=2"]
    everywhere = ids("cpu-smoke", *sets)
    sliced = ids("cpu-smoke", *sets, "matrix.options_cells=*-ga1-strong-*")
    plain = [c for c in everywhere if "powersgd" not in c and not c.startswith("fsdp2")]
    assert plain == [c for c in sliced if "powersgd" not in c and not c.startswith("fsdp2")]
    assert sorted(set(sliced) - set(plain)) == [
        "fsdp2-mlp.tiny-ws2-bna-fp32-cnone-ga1-strong-gb8-raf1",
        "torch-mlp.tiny-ws2-b0.05-fp32-cnone-ga1-strong-gb8-hpowersgd.r4"]


def test_a_cast_hook_is_the_comm_dtype_cell():
    """comm_hook=fp16 and comm_dtype=fp16 name one thing: the same cell, not two."""
    by_hook = ids("cpu-smoke", "matrix.engine=torch", "matrix.comm_hook=fp16")
    by_dtype = ids("cpu-smoke", "matrix.engine=torch", "matrix.comm_dtype=fp16")
    assert by_hook == by_dtype


def test_powersgd_skips_where_nothing_is_compressed():
    config = load_config("cpu-smoke", ["matrix.engine=torch", "matrix.comm_hook=powersgd"])
    reasons = {c.world_size: c.skip_reason for c in expand(config)}
    assert "world_size=1" in reasons[1] and reasons[2] == ""


@pytest.mark.parametrize("sets, key", [
    (["matrix.comm_hook=gzip"], "matrix.comm_hook='gzip'"),
    (["matrix.comm_hook=powersgd", "matrix.powersgd_rank=0"], "matrix.powersgd_rank=0"),
    (["matrix.engine=torch", "matrix.reshard_after_forward=true"], "matrix.reshard_after_forward=[True]"),
    (["matrix.engine=naive", "matrix.comm_hook=powersgd"], "matrix.comm_hook=['powersgd']"),
    (["matrix.engine=torch", "matrix.powersgd_rank=2"], "matrix.powersgd_rank=[2]"),
    (["matrix.compile=tvm"], "matrix.compile='tvm'"),
    (["matrix.comm_hook=fp16", "matrix.comm_dtype=bf16"], "matrix.comm_hook='fp16'"),
])
def test_bad_values_name_the_key(sets, key):
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_config("cpu-smoke", sets)


def test_a_preset_narrowed_on_the_command_line_keeps_its_options_unswept():
    """default lists fsdp2's reshard_after_forward; --set matrix.engine=torch drops fsdp2, not an error."""
    config = load_config("default", ["matrix.engine=torch"], cuda_available=False)
    assert {c.engine for c in expand(config)} == {"torch"}


def test_bad_value_exits_2_before_anything_runs(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--config", "cpu-smoke", "--out",
                           str(tmp_path / "run"), "--set", "matrix.engine=torch",
                           "--set", "matrix.reshard_after_forward=false"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert proc.returncode == 2 and "matrix.reshard_after_forward" in proc.stderr
    assert not (tmp_path / "run").exists()


def run(out: Path, *sets: str, env: dict | None = None) -> list[dict]:
    args = [a for s in (*FAST, *sets) for a in ("--set", s)]
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--config", "cpu-smoke", *args, "--out",
                           str(out)], capture_output=True, text=True, cwd=REPO, timeout=400,
                          env=os.environ | {"OMP_NUM_THREADS": "1"} | (env or {}))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    with open(out / "results.csv", newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_fsdp2_powersgd_static_graph_end_to_end(tmp_path):
    """world sizes 1 and 2: fsdp2 (both reshard settings) passes its gate against DDP, PowerSGD carries
    its loss distance, static_graph and gradient_as_bucket_view cells run; every row has peak memory and
    the per-rank state its engine should need."""
    rows = run(tmp_path / "r", "matrix.world_size=1,2", "matrix.engine=torch,fsdp2",
               "matrix.reshard_after_forward=true,false", "matrix.comm_hook=none,powersgd",
               "matrix.static_graph=false,true", "matrix.gradient_as_bucket_view=true")
    by_id = {r["cell_id"]: r for r in rows}
    ran = [r for r in rows if r["status"] != "skipped"]
    assert all(r["status"] == "ok" for r in ran), [(r["cell_id"], r["error"]) for r in ran]
    assert len(ran) == 4 + 6  # ws1: torch × static 2, fsdp2 × 2; ws2: + powersgd × static 2
    for ws in (1, 2):
        for raf in (0, 1):
            row = by_id[f"fsdp2-mlp.tiny-ws{ws}-bna-fp32-cnone-ga1-strong-gb4-raf{raf}"]
            assert row["parity_gate"] == "passed"
            assert float(row["parity_grad_error"]) <= float(row["parity_grad_bound"])  # the run's own
            torch_row = by_id[f"torch-mlp.tiny-ws{ws}-b0.05-fp32-cnone-ga1-strong-gb4-gbv"]
            assert int(row["param_bytes_per_rank"]) * ws >= int(torch_row["param_bytes_per_rank"])
            assert int(row["optimizer_state_bytes_per_rank"]) == 2 * int(row["param_bytes_per_rank"])
    psgd = by_id["torch-mlp.tiny-ws2-b0.05-fp32-cnone-ga1-strong-gb4-hpowersgd.r4-gbv"]
    assert psgd["lossy"] == "true" and 0 < float(psgd["parity_grad_error"]) and not psgd["parity_gate"]
    static = next(r for r in ran if r["engine"] == "torch" and r["world_size"] == "2"
                  and r["static_graph"] == "true" and r["comm_hook"] == "none")  # an option: gated too
    assert static["parity_gate"] == "passed" and float(static["parity_grad_error"]) < 1e-4
    assert psgd["comm_hook"] == "powersgd" and psgd["powersgd_rank"] == "4"
    assert all(float(r["peak_mem_mb"]) > 0 for r in ran)


@pytest.mark.slow
def test_parity_mutant_and_compile_refusal(tmp_path):
    """fsdp2 that never reduces its gradients fails the gate (`diverged`, its distance recorded); a
    compiled DDP cell whose first bucket DDPOptimizer refuses is `skipped` with torch's reason."""
    rows = run(tmp_path / "m", "matrix.world_size=2", "matrix.engine=torch,fsdp2nosync",
               "matrix.bucket_cap_mb=0.1", "matrix.compile=inductor",
               env={"DDPBENCH_ENGINE_MODULES": "tests.fsdp2_mutant"})
    by_engine = {r["engine"]: r for r in rows}
    mutant = by_engine["fsdp2nosync"]
    assert mutant["status"] == "diverged" and "torch DDP" in mutant["error"]
    assert mutant["parity_gate"] == "diverged"
    assert float(mutant["parity_grad_error"]) > float(mutant["parity_grad_bound"]) > 0
    refused = by_engine["torch"]
    assert refused["status"] == "skipped" and "First bucket should be smaller" in refused["error"]


def test_analyze_classifies_fsdp_collectives_by_hand(tmp_path):
    """CPU: a gloo all-gather [100,130] and reduce-scatter [200,250] on gloo's threads → 30 and 50 µs; a
    gloo trace whose reduce-scatter ran as a `gloo:all_reduce` under `c10d::_reduce_scatter_base_` leaves
    reduce_scatter_ms empty (it is in allreduce_ms). GPU: NCCL AllGather [10,30] and ReduceScatter [40,45]
    kernels → 20 and 5 µs."""
    from tests.analyze_fixtures import CPU_META, GPU_META, kernel, runtime, write_trace, x
    from tests.test_analyze import rows_by_step

    c = lambda name, ts, dur, cat="cpu_op", tid=10: x(name, cat, ts, dur, pid=10, tid=tid)
    step = [c("ProfilerStep#1", 0, 1000, "user_annotation"), c("aten::mm", 10, 50)]
    named = step + [c("gloo:all_gather", 100, 30, "user_annotation", tid=11),
                    c("gloo:reduce_scatter", 200, 50, "user_annotation", tid=12)]
    s = rows_by_step(write_trace(tmp_path / "rank0.json", named, CPU_META))[0]["1"]
    assert (s["allgather_ms"], s["reduce_scatter_ms"], s["allreduce_ms"]) == (
        pytest.approx(30e-3), pytest.approx(50e-3), 0)
    hidden = step + [c("c10d::_reduce_scatter_base_", 190, 5),
                     c("gloo:all_reduce", 200, 50, "user_annotation", tid=12)]
    s = rows_by_step(write_trace(tmp_path / "rank1.json", hidden, CPU_META))[0]["1"]
    assert s["reduce_scatter_ms"] is None and s["allreduce_ms"] == pytest.approx(50e-3)
    gpu = [x("ProfilerStep#1", "user_annotation", 0, 100), runtime(5, 1), runtime(6, 2),
           kernel("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 10, 20, 1, 1, 1),
           kernel("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)", 40, 5,
                  2, 1, 1)]
    s = rows_by_step(write_trace(tmp_path / "rank3.json", gpu, GPU_META))[0]["1"]
    assert (s["allgather_ms"], s["reduce_scatter_ms"]) == (pytest.approx(20e-3), pytest.approx(5e-3))


def test_memory_frontier_by_hand():
    """Per engine and world size, a cell stays on the frontier unless another beats it on both axes:
    (100 MiB, 10/s) and (50, 5) both stay; (120, 8) is beaten by (100, 10); fsdp2's lone cell stays."""
    import pandas as pd

    from bench.report.memory import frontier

    table = pd.DataFrame({"engine": ["torch", "torch", "torch", "fsdp2"], "world_size": [2, 2, 2, 2],
                          "peak_mem_mb": [100.0, 50.0, 120.0, 500.0], "samples_per_s": [10.0, 5.0, 8.0, 1.0]})
    assert list(frontier(table)) == [True, True, False, True]
