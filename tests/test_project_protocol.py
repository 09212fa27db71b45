"""The projection on what the user measured (bench/project/protocol.py; the lab's protocols.py): the fixed
cost of a micro-step from two batches, the reach and its band, the protocol a run's anchor makes, and the
validator's --protocol line on the corpora the stored bands were fitted on."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from bench.config import load_config
from bench.matrix import expand
from bench.project import protocol
from bench.project.buckets import uniform_buckets
from bench.project.configuration import Configuration
from bench.project.fixed_costs import fixed_cost_needed, with_fixed_costs
from bench.project.network import preset_network
from bench.project.physics import OFF, Physics
from bench.project.project import project
from bench.project.simulate import Compute
from projection_lab import protocols
from projection_lab.published import LAST_LINE, read_corpus

ROOT = Path(__file__).resolve().parent.parent
MiB = 1 << 20
TRAINING = (ROOT / "tests" / "data" / "published_scaling" / "train.csv",
            ROOT / "tests" / "data" / "published_multinode" / "train.csv")


# ---- the fixed cost ----------------------------------------------------------------------------------------

def test_fixed_cost_is_the_intercept_of_two_batches():
    # 50 ms at batch 32, 90 ms at 64: 1.25 ms per sample, so 10 ms that no batch removes; at batch 16 the
    # micro-step is 10 + 80 · 16/64 = 30 ms, where "compute ∝ batch" says 90 · 16/64 = 22.5
    assert protocol.fixed_cost_ms(32, 50.0, 64, 90.0) == pytest.approx(10.0)
    assert protocol.fixed_cost_ms(64, 90.0, 32, 50.0) == pytest.approx(10.0)   # either order
    assert protocol.micro_at(90.0, 64, 16, 10.0) == pytest.approx(30.0)
    assert protocol.micro_at(90.0, 64, 16) == pytest.approx(22.5)
    assert protocol.micro_at(90.0, 64, 128, 10.0) == pytest.approx(170.0)     # and growing the batch


def test_fixed_cost_is_held_between_zero_and_the_smaller_time():
    # 30 ms at 32 and 70 at 64: the line's intercept is −10 ms, no cost at all (noise or a superlinear step)
    assert protocol.fixed_cost_ms(32, 30.0, 64, 70.0) == 0.0
    # a step that shrinks as the batch grows would put F above the measured time: held just below it
    assert protocol.fixed_cost_ms(32, 50.0, 64, 40.0) == pytest.approx(0.999 * 40.0)
    with pytest.raises(ValueError, match="two per-GPU batches"):
        protocol.fixed_cost_ms(32, 50.0, 32, 60.0)


def test_compute_at_a_smaller_batch_keeps_its_fixed_part():
    # forward 30 + backward 60 = 90 ms per micro-step at 64 of which 10 fixed: at 16, 30 ms in the same
    # 1 : 2 split (10 + 20); the optimizer's 5 ms is per parameter and stays
    half = Compute(30.0, 60.0, 5.0, 1, 64, fixed_ms=10.0).at_batch(16)
    assert (half.forward_ms, half.backward_ms, half.optimizer_ms) == pytest.approx((10.0, 20.0, 5.0))
    two = Compute(60.0, 120.0, 5.0, 2, 64, fixed_ms=10.0).at_batch(16)   # two micro-steps of 90
    assert two.forward_ms + two.backward_ms == pytest.approx(60.0)


# ---- reach and bands ---------------------------------------------------------------------------------------

def test_reach_classes():
    node = [protocol.band_of(protocol.NODE, r) for r in (2, 4, 5, 16, 17, 128)]
    assert node == ["node ×2–4", "node ×2–4", "node ×5–16", "node ×5–16", "node ×17+", "node ×17+"]
    two = [protocol.band_of(protocol.TWO_GPUS, r) for r in (2, 3, 4, 8)]
    assert two == ["two-gpus ×2", "two-gpus ×3–4", "two-gpus ×3–4", "two-gpus ×5–8"]
    with pytest.raises(ValueError, match="protocol='three-gpus'"):
        protocol.band_of("three-gpus", 2)


def test_a_band_widens_with_the_reach_and_never_passes_100():
    # power 1: s = log2(reach), 1 at ×2 and 4 at ×16. Band [−0.1, +0.05]·s, median −0.02·s
    band = protocol.ProtocolBand("node", 50, 5, -0.02, -0.1, 0.05, 0.9, 1.0)
    assert protocol.reach_scale(2, 1.0) == 1.0 and protocol.reach_scale(16, 1.0) == 4.0
    assert protocol.reach_scale(16, 0.5) == 2.0 and protocol.reach_scale(1.5, 1.0) == 1.0
    assert protocol.reach_scale(64, 0.0) == 1.0
    assert band.predicted(0.95, 2) == pytest.approx(0.95 * math.exp(-0.02))
    assert band.predicted(0.95, 16) == pytest.approx(0.95 * math.exp(-0.08))
    assert band.bounds(95.0, 2) == pytest.approx((95 * math.exp(-0.1), 95 * math.exp(0.05)))
    assert band.bounds(95.0, 16) == pytest.approx((95 * math.exp(-0.4), 100.0))
    assert band.contains(0.70, 0.95, 16) and not band.contains(0.70, 0.95, 2)
    assert protocol.capped(1.03) == 1.0


def test_the_note_says_how_far_below_the_model_a_band_reaches(tmp_path):
    # low ln(0.9) at power 1: 10 % below the model at ×2 (s = 1), 1 − 0.9^4 = 34 % at ×16 (s = 4)
    path = tmp_path / "bands.csv"
    band = protocol.ProtocolBand("node", 40, 5, -0.01, math.log(0.9), 0.02, 0.9, 1.0)
    protocols.write_bands({"node": band}, path)
    (line,) = protocol.notes(["node", "nan", "two-gpus"], path)
    assert line.startswith("protocol node (a whole node measured, projected across nodes)")
    assert "down to 10 % at ×2, 34 % at ×16 below the model" in line and "40 published rows of 5" in line


def test_two_gpus_carries_the_anchors_miss():
    # the model says 98 % at 2 GPUs and 90 % at 8; 2 GPUs measured 93 %: 8 GPUs 90 · 93/98 = 85.4 %
    assert protocol.anchored_eff(0.90, 0.98, 0.93) == pytest.approx(0.90 * 0.93 / 0.98)
    assert protocol.anchored_eff(0.99, 0.95, 1.00) == 1.0   # never past linear


def test_stored_bands_are_what_the_lab_fits_today():
    """bench/project/protocol_bands.csv is what `validate_projection.py --protocol node --fit-interval`
    writes from the in-project corpora."""
    stored = protocol.read_bands()
    for name in protocol.PROTOCOLS:
        judged = [j for path in TRAINING for j in protocols.PROTOCOLS[name](read_corpus(path), Physics())[0]
                  if not j.held_out]
        fitted = protocols.fit_band(judged, name)
        mine = stored[name]
        assert (mine.rows, mine.sources, mine.level, mine.power) == (
            fitted.rows, fitted.sources, fitted.level, fitted.power)
        assert (mine.shift, mine.low, mine.high) == pytest.approx((fitted.shift, fitted.low, fitted.high),
                                                                  abs=1e-6)


# ---- the lab: rows judged under a protocol ----------------------------------------------------------------

def _row(gpus: int, per_gpu: float, batch: int = 32, nodes: int | None = None, notes: str = "") -> dict:
    # one parameter: the model's communication is negligible, so only the published rates move a row
    return dict(source_id="S", model="M", params=1, framework="PyTorch DDP", hardware="A100-SXM4-80GB",
                interconnect="NVSwitch; 8x 200 Gb/s HDR per node", precision="amp_fp16",
                per_gpu_batch=batch, grad_accum=1, gpus=gpus, nodes=nodes or max(1, gpus // 8),
                throughput=per_gpu * gpus, throughput_unit="sequences/s", notes=notes)


def test_node_protocol_predicts_every_multi_node_row_from_the_largest_one_node_row():
    corpus = pd.DataFrame([_row(1, 40.0), _row(8, 36.0), _row(16, 34.2), _row(64, 30.6)])
    judged, skipped, askable = protocols.node(corpus, OFF)
    assert not skipped and askable == 2
    by = {int(j.prediction.row["gpus"]): j for j in judged}
    assert set(by) == {16, 64}
    assert all(int(j.prediction.base["gpus"]) == 8 for j in judged)
    assert (by[16].reach, by[16].band) == (2.0, "node ×2–4")
    assert (by[64].reach, by[64].band) == (8.0, "node ×5–16")
    # published per-GPU rates over the node's 36/s: 95 % and 85 %; the model ~100 %
    assert by[16].published_eff == pytest.approx(0.95) and by[64].published_eff == pytest.approx(0.85)
    assert by[64].model_eff == pytest.approx(1.0, abs=1e-3)


def test_strong_scaling_takes_its_fixed_cost_from_two_one_node_batches():
    # one node at batch 64 (8 GPUs, 100/s per GPU: 640 ms) and at 32 (4 GPUs, 64/s per GPU: 500 ms): the
    # line through them costs 360 ms at any batch. Two nodes at batch 16 (global batch fixed) then step
    # in 360 + 280 · 16/64 = 430 ms: 37.2/s per GPU, 37 % of the node's rate, not the 100 % that
    # "compute ∝ batch" says
    strong = "STRONG SCALING"
    rows = [_row(8, 100.0, 64, notes=strong), _row(4, 64.0, 32, notes=strong),
            _row(16, 40.0, 16, nodes=2, notes=strong)]
    judged, _, _ = protocols.node(pd.DataFrame(rows), OFF)
    (two,) = judged
    assert "fixed cost 360.0 ms from batches 64 and 32" in two.fixed_cost
    assert two.model_eff == pytest.approx(16 / 430 * 1e3 / 100, rel=1e-3)
    # MLPerf's way, no accumulation stated while the batch shrinks: none (grad_accum 1), the same rows
    unstated = [dict(r, grad_accum=None) for r in rows]
    assert protocols.node(pd.DataFrame(unstated), OFF)[0][0].model_eff == pytest.approx(two.model_eff)
    plain, _, _ = protocols.node(pd.DataFrame([rows[0], rows[2]]), OFF)
    assert plain[0].model_eff == pytest.approx(1.0, abs=1e-3)
    assert "assumed 0" in plain[0].fixed_cost


@pytest.mark.parametrize("unit,value", [("ms/step", 500.0), ("s/iter", 0.5), ("sec per step", 0.5),
                                        ("it/s", 2.0), ("updates/s", 2.0)])
def test_a_table_of_step_times_or_rates_is_a_per_gpu_rate(unit, value):
    # 16 samples per micro-step × 2 micro-steps per step on every GPU, a step every 500 ms: 64/s per GPU
    from projection_lab.published import per_gpu, units_per_sample

    row = pd.Series(dict(throughput=value, throughput_unit=unit, per_gpu_batch=16, grad_accum=2, gpus=8,
                         notes=""))
    assert per_gpu(row, units_per_sample("M", unit)[0]) == pytest.approx(64.0)


def test_strong_scaling_bases_on_the_nodes_smallest_batch():
    # two batches on the whole node: the base is the smaller (nearer the multi-node rows' 16), F from both:
    # 640 ms at 64, 500 ms at 32 → F 360 ms; at 16: 360 + 140 · 16/32 = 430 ms, as from the larger base
    strong = "STRONG SCALING"
    rows = [_row(8, 100.0, 64, notes=strong), _row(8, 64.0, 32, notes=strong),
            _row(16, 40.0, 16, nodes=2, notes=strong)]
    (two,) = protocols.node(pd.DataFrame(rows), OFF)[0]
    assert int(two.prediction.base["per_gpu_batch"]) == 32
    assert "fixed cost 360.0 ms from batches 32 and 64" in two.fixed_cost
    assert two.model_eff == pytest.approx(16 / 430 * 1e3 / 64, rel=1e-3)


def test_two_gpus_protocol_anchors_at_two_and_predicts_the_node():
    corpus = pd.DataFrame([_row(1, 40.0), _row(2, 38.0), _row(4, 36.0), _row(8, 34.0)])
    judged, skipped, askable = protocols.two_gpus(corpus, OFF)
    assert not skipped and askable == 2
    by = {int(j.prediction.row["gpus"]): j for j in judged}
    assert (by[4].band, by[8].band) == ("two-gpus ×2", "two-gpus ×3–4")
    assert by[8].model_eff == pytest.approx(0.95, abs=1e-3)   # the 2-GPU miss, 38/40, carried to 8


# ---- bench project: the protocol a run's measurement makes ------------------------------------------------

def _configuration(steps: dict[int, float], scaling: str = "weak", per_rank: int = 64) -> Configuration:
    cells = [pd.Series({"cell_id": f"c{n}", "engine": "torch", "model": "mlp", "model_size": "tiny",
                        "bucket_cap_mb": 25.0, "precision": "fp32", "comm_dtype": "none", "grad_accum": 1,
                        "scaling": scaling, "per_rank_batch": per_rank, "world_size": n,
                        "step_time_ms_p50": ms}) for n, ms in steps.items()]
    return Configuration(cells[0], pd.DataFrame(cells), Compute(40.0, 80.0, 3.0, 1, per_rank),
                         uniform_buckets("torch", [25 * MiB] * 4, "test"))


def test_a_run_that_measured_a_node_prints_the_node_band():
    net = preset_network("h100-nvlink")
    config = _configuration({1: 123.0, 2: 126.0, 8: 135.0})
    rows = {r["world_size"]: r for r in project(config, "h100", lambda n, d: (net, "h100"), [4, 8, 32, 256],
                                                "auto", physics=OFF, anchored=True)}
    band = protocol.read_bands()[protocol.NODE]
    assert rows[32]["protocol"] == protocol.NODE and rows[32]["interval_regime"].startswith("node ×2–4")
    assert rows[256]["interval_regime"].startswith("node ×17+")
    # within the node: anchored at 2 (the largest measured size below) from a 1-GPU base, the two-gpus band
    assert rows[4]["interval_regime"].startswith("two-gpus ×2")
    assert rows[8]["interval_regime"].startswith("two-gpus ×3–4")
    # the node protocol calibrates the compute to the measured node (as the lab calibrates a published node
    # row): the factor c whose modelled 8-rank step is the measured 135 ms, found here by a plain search
    def step_at(c: float, n: int) -> float:
        scaled = Configuration(config.base, config.rows, Compute(40.0 * c, 80.0 * c, 3.0 * c, 1, 64),
                               config.buckets)
        return project(scaled, "h100", lambda k, d: (net, "h100"), [n], "auto", physics=OFF)[0][
            "predicted_step_ms"]

    lo, hi = 0.5, 2.0
    for _ in range(60):
        lo, hi = ((lo + hi) / 2, hi) if step_at((lo + hi) / 2, 8) < 135.0 else (lo, (lo + hi) / 2)
    model_eff = 123.0 / step_at(lo, 32)   # T1 is the measured compute, 40 + 80 + 3
    assert rows[32]["efficiency_pct"] == pytest.approx(100 * band.predicted(model_eff, 4), rel=1e-6)
    low, high = band.bounds(100 * model_eff, 4)
    assert (rows[32]["efficiency_pct_low"], rows[32]["efficiency_pct_high"]) == pytest.approx((low, high),
                                                                                              rel=1e-6)


def test_a_second_batch_at_the_base_gives_the_fixed_cost_and_its_absence_is_said():
    small = _configuration({1: 60.0}, per_rank=32)
    small = Configuration(small.base.copy(), small.rows,
                          Compute(20.0, 30.0, 3.0, 1, 32), small.buckets)   # 50 ms of fwd + bwd at 32
    big = _configuration({1: 93.0}, per_rank=64)                          # 40 + 80 = 120 at 64
    big.base["cell_id"] = "big"
    fitted = with_fixed_costs([small, big])
    # (32, 50) and (64, 120): 70 ms per 32 samples, F = 50 − 70 = −20 → 0; (32, 50) and (64, 90) gives 10
    assert fitted[0].compute.fixed_ms == 0.0 and "per-rank batches 32" in fitted[0].fixed_source
    big90 = Configuration(big.base, big.rows, Compute(30.0, 60.0, 3.0, 1, 64), big.buckets)
    assert with_fixed_costs([small, big90])[1].compute.fixed_ms == pytest.approx(10.0)
    alone = _configuration({1: 123.0}, scaling="strong", per_rank=64)
    net = preset_network("h100-nvlink")
    table = pd.DataFrame(project(alone, "h100", lambda n, d: (net, "h100"), [1, 8], "auto", physics=OFF))
    assert "no second batch was measured" in fixed_cost_needed(alone, table)


def test_fixed_cost_batch_measures_the_smallest_world_size_again_at_a_second_batch():
    plain = expand(load_config("cpu-smoke", cuda_available=False))
    more = expand(load_config("cpu-smoke", ["workload.fixed_cost_batch=4"], cuda_available=False))
    added = [c for c in more if c.cell_id not in {p.cell_id for p in plain}]
    smallest = min(c.world_size for c in plain)
    # one per configuration of the smallest world size: its strong and weak cells meet at the new batch
    base = {(c.engine, c.bucket_cap_mb, c.precision, c.comm_dtype, c.grad_accum, c.engine_options)
            for c in plain if c.world_size == smallest and not c.skip_reason}
    assert len(added) == len(base) > 0
    assert all((c.world_size, c.scaling, c.per_rank_batch) == (smallest, "weak", 4) for c in added)
    assert all(c.global_batch == 4 * c.world_size * c.grad_accum for c in added)


# ---- the validator -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,corpus", [("node", "published_multinode"), ("two-gpus", "published_scaling")])
def test_validator_protocol_ends_in_the_agreed_line(name, corpus):
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "validate_projection.py"), "--corpus",
                          str(ROOT / "tests" / "data" / corpus / "train.csv"), "--protocol", name],
                         capture_output=True, text=True, check=True, cwd=ROOT,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    lines = out.stdout.strip().splitlines()
    assert LAST_LINE.match(lines[-1]), lines[-1]
    assert re.search(rf"protocol {name}: predicted (\d+) of \1 askable rows", out.stdout)
    rows = int(LAST_LINE.match(lines[-1]).group(1))
    assert rows >= (90 if name == "node" else 450)
