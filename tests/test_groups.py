"""bench.worker.groups: which cells of a launch run side by side."""

from __future__ import annotations

import torch

from bench.config import load_config
from bench.matrix import expand
from bench.worker.groups import engine_groups, plan_groups


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
    from bench.worker import groups

    config = load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.world_size=2", "matrix.grad_accum=1"])
    cells = expand(config)
    assert len(plan_groups(cells, config, torch.device("cpu"))) == 1  # a tiny MLP fits
    monkeypatch.setattr(groups, "free_memory_bytes", lambda device: 1000)
    alone = plan_groups(cells, config, torch.device("cpu"))
    assert all(len(g) == 1 for g in alone) and sorted(g[0].cell_id for g in alone) == sorted(
        c.cell_id for c in cells)
