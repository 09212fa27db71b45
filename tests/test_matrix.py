"""bench.matrix: expansion, collapse of identical cells, skips with reasons, batch rules, cell ids."""

from __future__ import annotations

import re

import pytest

from bench.__main__ import main as bench_main
from bench.config import load_config
from bench.matrix import (
    by_launch,
    expand,
    per_rank_batch,
)


def cells_of(*overrides, **kw):
    """cpu-smoke's cells at strong scaling only (unless an override says otherwise)."""
    return expand(load_config("cpu-smoke", ["matrix.scaling=strong", *overrides]), **kw)


def test_cross_product_and_naive_bucket_collapse():
    cells = cells_of("matrix.bucket_cap_mb=1,25", "matrix.world_size=1,2", "matrix.grad_accum=1")
    by_engine = {}
    for c in cells:
        by_engine.setdefault(c.engine, []).append(c)
    assert len(by_engine["naive"]) == 2  # one per world size: bucket size means nothing to naive
    assert all(c.bucket_cap_mb is None and "-bna-" in c.cell_id for c in by_engine["naive"])
    assert len(by_engine["overlap"]) == 4 and len(cells) == 2 + 3 * 4
    assert [c.world_size for c in cells] == sorted(c.world_size for c in cells)  # grouped by world size
    assert set(by_launch(cells)) == {1, 2}


def test_comm_dtype_collapse_and_skip():
    cells = cells_of("matrix.comm_dtype=none,fp32,fp16", "matrix.engine=torch", "matrix.grad_accum=1")
    ids = [c.cell_id for c in cells]
    assert len(ids) == len(set(ids)) == 4  # fp32 == none; ws1 x {none, fp16}, ws2 x {none, fp16}
    skipped = [c for c in cells if c.skip_reason]
    assert [(c.world_size, c.comm_dtype) for c in skipped] == [(1, "fp16")]
    assert "nothing is communicated" in skipped[0].skip_reason
    assert 1 not in [c.world_size for c in by_launch(cells)[2]]


def test_torch_bf16_comm_hook_skipped_on_cpu():
    cells = cells_of("matrix.comm_dtype=bf16", "matrix.world_size=2", "matrix.grad_accum=1")
    reasons = {c.engine: c.skip_reason for c in cells}
    assert "bf16_compress_hook" in reasons["torch"]
    assert not reasons["naive"] and not reasons["overlap"]


def test_bf16_unsupported_gpu_and_world_size_above_gpus_are_skipped():
    config = load_config("default", ["matrix.world_size=1,2,4", "matrix.precision=fp32,bf16"],
                         cuda_available=True)
    cells = expand(config, bf16_supported=False, gpu_count=2)
    reasons = {c.cell_id: c.skip_reason for c in cells if c.skip_reason}
    assert any("bf16" in r for r in reasons.values())
    assert all("ws4" in i for i, r in reasons.items() if "GPUs present" in r)
    assert any("above the 2 GPUs" in r for r in reasons.values())


def test_strong_and_weak_batch_rules():
    cells = cells_of("matrix.engine=torch", "matrix.scaling=strong,weak", "matrix.grad_accum=1,2",
                     "workload.global_batch=8", "workload.per_rank_batch=3")
    for c in cells:
        if c.scaling == "strong":
            assert c.per_rank_batch == 8 // c.world_size
        else:
            assert c.per_rank_batch == 3
        assert c.global_batch == c.per_rank_batch * c.world_size * c.grad_accum
    assert per_rank_batch("strong", 4, 16, 99) == 4
    with pytest.raises(ValueError):
        per_rank_batch("strong", 3, 16, 1)


def test_cell_ids_stable_readable_safe():
    cells = cells_of("matrix.bucket_cap_mb=0.5,25")
    ids = [c.cell_id for c in cells]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", i) for i in ids)
    assert "overlap-mlp.tiny-ws2-b25-fp32-cnone-ga1-strong-gb8" in ids
    assert "bucketed-mlp.tiny-ws1-b0.5-fp32-cnone-ga2-strong-gb16" in ids
    assert ids == [c.cell_id for c in cells_of("matrix.bucket_cap_mb=0.5,25")]


def test_dry_run_prints_cells_and_estimate(tmp_path, capsys):
    out = tmp_path / "run"
    assert bench_main(["run", "--config", "cpu-smoke", "--dry-run", "--out", str(out),
                       "--set", "matrix.comm_dtype=none,fp16"]) == 0
    text = capsys.readouterr().out
    assert "run   torch-mlp.tiny-ws1-b0.05-fp32-cnone-ga1-strong-gb8" in text
    assert "skip  torch-mlp.tiny-ws1-b0.05-fp32-cfp16-ga1-strong-gb8" in text
    assert re.search(r"estimated wall time ~[\d.]+ min", text)
    assert "timed rounds per cell expected" not in text  # cpu-smoke: fixed rounds
    assert not out.exists()


def test_cells_keeps_only_the_cells_its_patterns_name():
    from bench.config import ConfigError

    every = [c.cell_id for c in expand(load_config("cpu-smoke"))]
    named = ["torch-mlp.tiny-ws2-b0.05-fp32-cnone-ga1-strong-gb8", "overlap-*-ws1-*-ga2-weak-*"]
    kept = [c.cell_id for c in expand(load_config("cpu-smoke", [f"matrix.cells={','.join(named)}"]))]
    assert kept == [c for c in every if c == named[0] or re.fullmatch(r"overlap-.*-ws1-.*-ga2-weak-.*", c)]
    assert len(kept) == 2
    with pytest.raises(ConfigError, match="matrix.cells="):
        load_config("cpu-smoke", ["matrix.cells= "])
