"""The pure scheduler (bench/run/schedule.py) alone, by hand-worked cases: no processes, no files. The local
runner (tests/test_packing.py, tests/test_launches.py), the estimate and the sbatch script
(tests/test_slurm.py) are tested where they use it."""

from __future__ import annotations

import pytest

from bench.config import ConfigError, load_config
from bench.matrix import expand
from bench.run import schedule
from bench.run.packing import Slot
from bench.run.schedule import (
    job_schedule,
    lanes,
    launch_cells,
    launch_order,
    launch_steps,
    packed_seconds,
    slot_count,
    spread,
)


def test_the_units_go_longest_first_to_the_least_loaded_slot():
    # LPT by hand: 5 → A, 4 → B, 3 → B (4 < 5), 3 → A (7 > 5), 3 → A or B at 8 and 7 → B: A 5+3 = 8,
    # B 4+3+3 = 10. The best split is 9 (5+4 | 3+3+3): LPT stays within 4/3 of it, not at it.
    seconds = [5.0, 4.0, 3.0, 3.0, 3.0]
    assert spread(list(range(5)), seconds.__getitem__, 2) == [[0, 3], [1, 2, 4]]
    assert packed_seconds(seconds, 2) == 10.0 and packed_seconds(seconds, 1) == 18.0
    assert spread([0], seconds.__getitem__, 3) == [[0], [], []]  # more slots than units: some stay empty
    # equal times: the first unit first, onto the first of the emptiest slots
    assert spread(["a", "b", "c"], lambda u: 1.0, 2) == [["a", "c"], ["b"]]
    assert packed_seconds([], 4) == 0.0


def test_a_slot_takes_whole_groups_or_whole_recipes():
    config = load_config("cpu-smoke", ["matrix.world_size=1", "matrix.scaling=strong",
                                       "matrix.grad_accum=1,2", "matrix.engine=torch,overlap"])
    cells = expand(config)
    shares = schedule.shares(cells, False, lambda c: 1.0, 4)  # 2 groups (ga1, ga2) for 4 slots: 2 shares
    assert len(shares) == 2 and sorted(len(s) for s in shares) == [2, 2]
    for share in shares:  # each a group: torch and overlap of one accumulation, stepped side by side
        assert {c.engine for c in share} == {"torch", "overlap"} and len({c.grad_accum for c in share}) == 1
    # a race: whole recipes (global batch at a world size): ga1 (gb8) and ga2 (gb16) are two recipes
    by_recipe = schedule.shares(cells, True, lambda c: 1.0, 4)
    assert sorted(sorted(c.global_batch for c in s) for s in by_recipe) == [[8, 8], [16, 16]]
    # one slot: every cell, in the cells' order
    assert schedule.shares(cells, False, lambda c: 1.0, 1) == [cells]


def test_how_many_launches_run_at_once():
    assert slot_count("auto", "cuda", 1, 8, 64, 0) == 8 and slot_count("auto", "cuda", 3, 8, 64, 0) == 2
    assert slot_count("auto", "cuda", 16, 8, 64, 0) == 1  # above the node: alone (it spans nodes)
    assert slot_count("auto", "cpu", 1, 0, 8, 1) == 1     # CPU ranks share the memory bandwidth: `on` only
    assert slot_count("on", "cpu", 2, 0, 8, 2) == 2 and slot_count("on", "cpu", 1, 0, 8, 0) == 8
    assert slot_count("off", "cuda", 1, 8, 64, 0) == 1


def test_the_shares_rotate_over_the_slots_by_the_repeat():
    # 4 slots, 2 shares: repeat 0 on slots 0, 1; repeat 1 on 1, 2; repeat 3 on 3, 0; each `of` 2 (the
    # launches that run at once), whatever the slots' own count
    slots = [Slot(i, 4, (str(i),), (i,)) for i in range(4)]
    a, b = ["a"], ["b"]
    assert [(s.index, s.of, share) for s, share in lanes(slots, [a, b], 0)] == [(0, 2, a), (1, 2, b)]
    assert [s.index for s, _ in lanes(slots, [a, b], 1)] == [1, 2]
    assert [(s.index, s.gpus) for s, _ in lanes(slots, [a, b], 3)] == [(3, ("3",)), (0, ("0",))]


def test_the_launch_order_is_seeded_and_a_race_runs_in_order():
    assert launch_order([1, 2], 1, 7) == [(1, 0), (2, 0)]  # one launch each: world sizes in order
    # run.launches 2, seed 7: random.Random(7).shuffle of [(1, 0), (1, 1), (2, 0), (2, 1)]
    assert launch_order([1, 2], 2, 7) == [(2, 1), (1, 1), (1, 0), (2, 0)]
    assert launch_order([1, 2], 2, 7) == launch_order([1, 2], 2, 7)
    # a race that carries eliminations over: smallest world size first, its launches in a row
    assert launch_order([1, 2], 3, 7, in_order=True) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 1), (2, 2)]


def test_a_launch_shuffles_its_cells_with_the_seed_the_world_size_and_the_repeat():
    cells = list("abcdef")
    assert launch_cells(cells, 7, 2, 1, 1) == cells  # one launch: the cells' own order
    # random.Random("7-2-1").shuffle
    assert launch_cells(cells, 7, 2, 1, 2) == ["d", "c", "a", "e", "f", "b"]
    assert launch_cells(cells, 7, 2, 0, 2) != launch_cells(cells, 7, 2, 1, 2)
    assert cells == list("abcdef")  # the caller's list is left as it was


def test_a_jobs_steps_one_node_or_spanning_nodes():
    # 8 ranks a node, 2 nodes: 1, 2, 4, 8 on one node; 16 = 2 nodes × 8
    assert launch_steps([16, 1, 8, 2, 4, 8], 2, 8) == [(1, 1, 1), (2, 1, 2), (4, 1, 4), (8, 1, 8),
                                                       (16, 2, 8)]
    with pytest.raises(ConfigError, match="matrix.world_size=12: not a multiple of 8"):
        launch_steps([12], 2, 8)
    with pytest.raises(ConfigError, match=r"matrix.world_size=32: above the 16 ranks of --nodes=2"):
        launch_steps([32], 2, 8)


def test_one_node_steps_in_lanes_on_the_nodes_then_the_spanning_steps():
    # LPT over 2 lanes by the world sizes' seconds: 8 (80) → lane 0; 4 (40) → lane 1; 2 (20) → lane 1 (40 <
    # 80); 1 (10) → lane 1 (60 < 80): lanes [8] and [1, 2, 4] (smallest first); 16 after both, on 2 nodes.
    # The job: its longest lane (80 = 80 vs 70) then the spanning step (100): 180 s
    seconds = {1: 10.0, 2: 20.0, 4: 40.0, 8: 80.0, 16: 100.0}
    job = job_schedule(launch_steps(list(seconds), 2, 8), 2, seconds)
    assert job.lanes == (((8, 1, 8),), ((1, 1, 1), (2, 1, 2), (4, 1, 4)))
    assert job.spanning == ((16, 2, 8),) and job.seconds(seconds) == 180.0 and job.nodes_used() == 2
    assert job.words() == ("world size 8 on node 0 | world sizes 1, 2, 4 on node 1 (at the same time); "
                           "then world size 16 on 2 nodes × 8")
    # more nodes than one-node steps: a lane each; one node: every one-node step in one lane
    assert len(job_schedule(launch_steps([1, 2], 4, 8), 4, seconds).lanes) == 2
    assert job_schedule(launch_steps([1, 2, 4], 1, 8), 1, seconds).seconds(seconds) == 70.0
    assert job_schedule([(16, 2, 8)], 2, seconds).lanes == ()


def test_a_packed_world_size_runs_its_launches_at_once_in_its_lane():
    seconds = {1: 10.0, 2: 20.0}
    job = job_schedule(launch_steps([1, 2], 1, 8), 1, seconds, packed={1: 8})
    assert job.at_once(1) == 8 and job.at_once(2) == 1 and job.packed == ((1, 8),)
    assert job.words() == "world sizes 1 (8 launches at once), 2 on node 0"
