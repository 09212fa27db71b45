"""bench.worker.groups: which cells of a launch run side by side."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from dist_utils import run_distributed

from bench.config import load_config
from bench.matrix import expand
from bench.worker import groups
from bench.worker.cell import run_group
from bench.worker.context import Launch
from bench.worker.groups import (
    NCCL_RESERVE_BYTES,
    RESIDENT_BYTES_PER_PARAM,
    SIDE_BY_SIDE_SHARE,
    engine_groups,
    plan_groups,
    side_by_side_need_bytes,
)
from bench.workloads import get_workload


def _ids(groups):
    return [[c.cell_id.split("-")[0] + ":" + str(c.bucket_cap_mb) for c in g] for g in groups]


def test_cells_differing_only_in_engine_form_a_group_and_naive_joins_the_default_bucket():
    config = load_config("cpu-smoke", ["matrix.scaling=strong",
                                       "matrix.world_size=2", "matrix.bucket_cap_mb=1,25",
                                       "matrix.grad_accum=1,2"])
    groups = engine_groups(expand(config))
    small, default = ["torch:1.0", "bucketed:1.0", "overlap:1.0"], ["torch:25.0", "bucketed:25.0",
                                                                    "overlap:25.0", "naive:None"]
    assert _ids(groups) == [small, small, default, default]  # in the order their first cell was expanded
    assert all(len({(c.grad_accum, c.world_size) for c in g}) == 1 for g in groups)


def test_naive_without_a_default_bucket_group_joins_the_first_one():
    config = load_config("cpu-smoke", ["matrix.scaling=strong",
                                       "matrix.world_size=2", "matrix.bucket_cap_mb=1,4",
                                       "matrix.grad_accum=1"])
    first = _ids(engine_groups(expand(config)))[0]
    assert first == ["torch:1.0", "bucketed:1.0", "overlap:1.0", "naive:None"]


def test_interleave_off_runs_one_cell_at_a_time():
    config = load_config("cpu-smoke", ["matrix.scaling=strong",
                                       "matrix.world_size=2", "run.interleave=false"])
    cells = expand(config)
    assert plan_groups(cells, config, torch.device("cpu")) == [[c] for c in cells]


def test_models_that_do_not_fit_side_by_side_run_alone(monkeypatch):
    config = load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.world_size=2", "matrix.grad_accum=1"])
    cells = expand(config)
    assert len(plan_groups(cells, config, torch.device("cpu"))) == 1  # a tiny MLP fits
    monkeypatch.setattr(groups, "free_memory_bytes", lambda device: 1000)
    alone = plan_groups(cells, config, torch.device("cpu"))
    assert all(len(g) == 1 for g in alone) and sorted(g[0].cell_id for g in alone) == sorted(
        c.cell_id for c in cells)


def test_a_group_too_large_is_cut_into_chunks_that_keep_their_torch_twin():
    """Room for 2 trainers: torch, bucketed, overlap and naive at one configuration become [torch, bucketed],
    [torch, overlap], [torch, naive] (torch measured in the first, a companion in the others), not four
    cells alone with no speed_vs_torch. Every cell but torch is gated: the group counts one reference for
    its one configuration (any bucket size), so it fits whole at room 5, not 4; at room 3, torch, naive and
    fsdp2 go [torch, naive], [torch, fsdp2] (+ the reference)."""
    config = load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.world_size=2", "matrix.grad_accum=1"])
    (group,) = engine_groups(expand(config))
    assert _ids(groups.paired_chunks(group, 2)) == [["torch:0.05", "bucketed:0.05"],
                                                    ["torch:0.05", "overlap:0.05"],
                                                    ["torch:0.05", "naive:None"]]
    assert groups.paired_chunks(group, 5) == [group] and len(groups.paired_chunks(group, 4)) > 1
    assert _ids(groups.paired_chunks(group, 1)) == [
        [x] for x in _ids([group])[0]]
    peers = load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.world_size=2", "matrix.grad_accum=1",
                                      "matrix.engine=torch,naive,fsdp2", "matrix.options_cells=*",
                                      "matrix.bucket_cap_mb=25"])
    (group,) = engine_groups(expand(peers))
    assert groups.gate_trainers(group) == 1  # the reference; torch DDP at this precision is in the group
    assert _ids(groups.paired_chunks(group, 3)) == [["torch:25.0", "naive:None"],
                                                    ["torch:25.0", "fsdp2:None"]]


def test_every_cell_of_a_cut_group_is_paired_with_torch_and_reported_once(tmp_path, one_rank_group,
                                                                         monkeypatch):
    """The worker's loop over planned groups (worker.main): the torch twin runs in every chunk, its row
    is reported once, and every other cell gets speed_vs_torch."""
    import json

    from bench.worker.events import Events
    from bench.worker.launch_groups import run_and_emit

    config = load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.world_size=1", "matrix.grad_accum=1",
                                       "profile.enabled=false", "run.timed_steps=3", "run.phase_steps=1",
                                       "run.compute_only_steps=1", "run.probe_iters=1"])
    monkeypatch.setattr(groups, "capacity", lambda *args: 2)
    launch, seen = Launch(config, torch.device("cpu"), events=Events(tmp_path / "events.jsonl")), set()
    planned = plan_groups(expand(config), config, torch.device("cpu"))
    assert len(planned) == 3
    for group in planned:
        companions = frozenset(c.cell_id for c in group if c.cell_id in seen)
        seen |= {c.cell_id for c in group}
        run_and_emit(group, launch, companions)
    finished = [json.loads(line) for line in launch.events.path.read_text().splitlines()
                if json.loads(line)["event"] == "finish"]
    assert sorted(e["cell_id"] for e in finished) == sorted(c.cell_id for c in expand(config))
    for e in finished:
        assert e["status"] == "ok", e
        assert (e["row"]["speed_vs_torch"] is None) == e["cell_id"].startswith("torch-"), e["cell_id"]


def _straddle_config():
    return load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.world_size=2", "matrix.grad_accum=1",
                                     "profile.enabled=false", "run.timed_steps=2", "run.phase_steps=1",
                                     "run.compute_only_steps=1", "run.probe_iters=1"])


def plan_and_run_with_own_free_memory(rank, world_size, free_per_rank):
    """One rank that sees `free_per_rank[rank]` bytes free: plans the launch's groups, then runs the
    first one. Returns the planned cell ids and the statuses of the group it ran."""
    groups.free_memory_bytes = lambda device: free_per_rank[rank]
    config = _straddle_config()
    planned = plan_groups(expand(config), config, torch.device("cpu"))
    ids = [[c.cell_id for c in g] for g in planned]
    seen = [None] * world_size
    dist.all_gather_object(seen, ids)  # a plan that differs fails here, before it could hang a collective
    if seen[0] != seen[1]:
        return ids, None
    statuses = [status for status, _, _ in run_group(planned[0], Launch(config, torch.device("cpu"), rank,
                                                                   world_size))]
    return ids, statuses


@pytest.mark.timeout(180)
def test_ranks_plan_the_same_groups_from_the_smallest_free_memory():
    # Rank 0 has room for the four engines side by side, rank 1 only for three: each deciding alone, rank 0
    # would build four trainers while rank 1 builds three, and their collectives would pair up wrongly.
    config = _straddle_config()
    cells = expand(config)
    three = next(free for free in range(10**6, 10**9, 10**4)
                 if groups.capacity(cells, config, free, "cpu") == 3)
    (ids0, run0), (ids1, run1) = run_distributed(plan_and_run_with_own_free_memory, 2, [three * 10, three],
                                                 timeout_s=150)
    # the smaller free memory decides: room for 3, so chunks of two cells and the gate's reference, torch
    # in each
    assert ids0 == ids1 and [len(g) for g in ids0] == [2, 2, 2], (ids0, ids1)
    assert all(g[0].startswith("torch-") for g in ids0)
    assert run0 == run1 == ["ok"] * 2  # the first chunk: torch and one gated cell


def test_a_model_the_probe_cannot_run_falls_back_to_the_resident_share(monkeypatch):
    # the older rule: n trainers' resident state (20 B a parameter) and NCCL's buffers on CUDA within half
    # the free memory
    assert side_by_side_need_bytes(4, 1000, "cpu") == 4000 * RESIDENT_BYTES_PER_PARAM
    assert side_by_side_need_bytes(4, 1000, "cuda") == 4000 * RESIDENT_BYTES_PER_PARAM + NCCL_RESERVE_BYTES
    config = load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.world_size=2", "matrix.grad_accum=1"])
    group = expand(config)
    monkeypatch.setattr(groups.memory, "activation_bytes_per_sample", lambda *args: None)
    n_params = sum(p.numel() for p in get_workload("mlp", "tiny").build_model().parameters())
    free = int(side_by_side_need_bytes(len(group), n_params, "cpu") / SIDE_BY_SIDE_SHARE)
    assert groups.capacity(group, config, free, "cpu") == len(group)
    assert groups.capacity(group, config, free, "cuda") < len(group)  # NCCL's buffers do not fit as well
    assert groups.capacity(group, config, free - 1, "cpu") == len(group) - 1
