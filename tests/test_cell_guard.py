"""One failing configuration never changes another's row (bench/worker/guard.py): an engine or a model that
fails leaves its side-by-side group alone, with its own cause, and the other cells keep their rows.

End to end through the launcher with failing plug-in engines beside torch DDP and naive at world sizes 1
and 2; in one process (gloo, world size 1) for user models that fail in the ranks; and the launcher's own
reading of a launch that died outside every cell."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist
from test_runner import REPO, read_csv, run_bench

from bench import engines
from bench.config import load_config
from bench.matrix import expand
from bench.run.launch_log import tail
from bench.worker.cell import run_group
from bench.worker.context import Launch
from bench.worker.groups import plan_groups
from bench.worker.guard import Guard, check_losses

TESTS = os.path.dirname(__file__)
MODELS = os.path.join(TESTS, "faulty_models.py")


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_plug_in_engines_end_to_end_and_a_failing_one_leaves_its_neighbours_rows_alone(tmp_path, monkeypatch):
    # One variable, three plug-in engines: the launcher and every rank read the same registry. plainsync
    # (tests/engine_plugin.py) has no buckets: its cells collapse the bucket axis (`bna`), join the group at
    # torch's default bucket and are compared with torch side by side. boom raises in `wrap`, boomlate after
    # its timed rounds (tests/faulty_plugins.py): each fails alone, at world sizes 1 and 2, and torch's,
    # naive's and plainsync's rows stay theirs.
    monkeypatch.setenv(engines.PLUGIN_VARIABLE, "engine_plugin,faulty_plugins")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    out = tmp_path / "run"
    names = ("torch", "boom", "naive", "boomlate", "plainsync")
    # profiled at world size 2: the failed cells are skipped, so naive's pass after them still runs
    proc = run_bench(out, f"matrix.engine={','.join(names)}", "matrix.grad_accum=1",
                     "matrix.scaling=strong", "profile.cells=boom*-ws2-*,naive-*-ws2-*",
                     "run.compute_only_steps=0", "run.phase_steps=1", "run.probe_iters=1", timeout=280)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = read_csv(out)
    by = {(r["engine"], r["world_size"]): r for r in rows}
    assert sorted(by) == sorted((e, ws) for e in names for ws in ("1", "2"))
    for ws in ("1", "2"):
        for healthy in ("torch", "naive", "plainsync"):
            row = by[(healthy, ws)]
            assert row["status"] == "ok" and row["error"] == "", row["error"]
            assert float(row["samples_per_s"]) > 0
        # paired with torch round by round, beside an engine that stepped through the timed rounds and
        # failed after them
        for paired in ("naive", "plainsync"):
            assert by[(paired, ws)]["speed_vs_torch"] and by[(paired, ws)]["interleaved"] == "true"
        assert "-bna-" in by[("plainsync", ws)]["cell_id"]
        boom, late = by[("boom", ws)], by[("boomlate", ws)]
        assert boom["status"] == "failed" and boom["error"].splitlines()[0] == "RuntimeError: boom-in-wrap"
        assert late["status"] == "failed"
        assert late["error"].splitlines()[0] == "RuntimeError: boom-late: no bucket layout"
        assert boom["samples_per_s"] == late["samples_per_s"] == ""
    # one launch per world size: no cell was relaunched to get there
    assert len(list((out / "logs").glob("launch-*.cmd"))) == 2
    assert by[("naive", "2")]["trace_dir"] and list((out / by[("naive", "2")]["trace_dir"]).glob("*.json*"))
    assert not by[("boom", "2")]["trace_dir"] and not (out / "traces" / by[("boom", "2")]["cell_id"]).exists()
    # The report and the projection read the recorded facts and layouts: no torch in their processes.
    for command in (["report", str(out)], ["project", str(out)]):
        code = ("import sys; from bench.__main__ import main; rc = main(sys.argv[1:]); "
                "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
        # run beside the run folder: the report's default --out (reports/<run>) is relative to where it runs
        path = os.pathsep.join([str(REPO), os.environ["PYTHONPATH"]])
        proc = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True,
                              cwd=out.parent, timeout=240, env={**os.environ, "PYTHONPATH": path})
        assert proc.returncode == 0, (command, proc.stderr[-3000:])


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def outcomes(model: str, engines_: str) -> dict[str, tuple[str, str, dict]]:
    """A launch's groups of the user model `model` at world size 1, on this process, as a rank runs them."""
    config = load_config("cpu-smoke", [f"workload.model={MODELS}:{model}", f"matrix.engine={engines_}",
                                       "matrix.world_size=1", "matrix.grad_accum=1", "matrix.scaling=strong",
                                       "run.timed_steps=6", "run.compute_only_steps=0", "run.phase_steps=1",
                                       "run.probe_iters=1"])
    cells, device, out = [c for c in expand(config) if not c.skip_reason], torch.device("cpu"), {}
    for group in plan_groups(cells, config, device):
        out |= {c.engine: o for c, o in zip(group, run_group(group, Launch(config, device)))}
    return out


def test_a_model_whose_build_raises_says_so_in_every_row(one_rank):
    # the side-by-side estimate builds the model on the meta device outside every cell: a raise there ended
    # the launch, and each row said torchrun's ChildFailedError
    got = outcomes("BuildRaises", "torch,naive")
    assert set(got) == {"torch", "naive"}
    for status, error, row in got.values():
        assert status == "failed" and row == {}
        assert error.splitlines()[0] == "ValueError: no such layer: build_model of the user's model"


def test_a_nan_loss_is_its_own_failure_without_throughput_even_at_world_size_1(one_rank):
    got = outcomes("NanLoss", "torch,naive")
    for status, error, row in got.values():
        assert status == "failed" and row == {}  # no step time, no samples/s
        assert error.startswith("loss is NaN at step 1 ")


def test_an_unused_parameter_fails_each_engine_with_its_own_error(one_rank):
    got = outcomes("UnusedParameter", "torch,naive")
    assert "Expected to have finished reduction" in got["torch"][1].splitlines()[0]
    assert "ddp_core" in got["naive"][1].splitlines()[0]
    assert "ddp_core" not in got["torch"][1] and "Expected to have finished" not in got["naive"][1]


def test_the_guard_keeps_a_failure_to_its_cell_and_names_the_step_of_a_nan(one_rank):
    class Cell:
        def __init__(self, cell_id):
            self.cell_id = cell_id

    guard = Guard()
    cells = [Cell("a"), Cell("b"), Cell("c")]

    def build(cell):
        if cell.cell_id == "b":
            raise torch.OutOfMemoryError("CUDA out of memory")
        return cell.cell_id.upper()

    kept, built = guard.each(cells, build, cell_of=lambda c: c)
    assert [c.cell_id for c in kept] == ["a", "c"] and built == {"a": "A", "c": "C"}
    assert guard.outcome("b")[0] == "oom" and guard.outcome("b")[1].startswith("OutOfMemoryError: CUDA")
    with guard.cell("b") as live:  # a failed cell runs nothing more
        assert not live
    check_losses([torch.tensor(1.0), torch.tensor(2.0)])
    with pytest.raises(Exception, match=r"^loss is inf at step 3 \(rank 0, 4 steps run\)"):
        check_losses([torch.tensor(1.0), torch.tensor(2.0), torch.tensor(float("inf")), torch.tensor(0.0)])


def test_a_launch_that_died_names_the_ranks_exception_not_torchruns(tmp_path):
    err = tmp_path / "launch-0.err"
    err.write_text("\n".join([
        "Traceback (most recent call last):", '  File "model.py", line 3, in build_model',
        "ValueError: no such layer", "E1126 18:00:00 torch/distributed/elastic/... failed (exitcode: 1)",
        "Traceback (most recent call last):", '  File "torch/distributed/run.py", line 9, in main',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
        "============================================================", "bench.worker FAILED",
        "Root Cause (first observed failure):", "[0]:", f"  time      : {time.ctime()}"]) + "\n")
    assert tail(err).splitlines()[0] == "ValueError: no such layer"


# ---- a failure on some ranks only (guard.Peers) -------------------------------------------------------

def test_peers_tell_a_deterministic_failure_from_a_one_rank_one(monkeypatch):
    """Two ranks' Peers on one store. Both post the same cell's failure: each returns (the guard goes on).
    Only rank 1 posts within the grace: it declares the failure its own (FailedAlone); rank 0, failing a
    moment later in the broken collective, hears it and leaves quietly (PeerFailed); rank 0's watch sees it
    too. An unreachable store counts only where asked to."""
    import threading

    from bench.worker.guard import FailedAlone, PeerFailed, Peers

    store = dist.HashStore()
    ranks = [Peers(store, "g0", r, 2, grace_s=0.3) for r in range(2)]
    done = []
    threads = [threading.Thread(target=lambda p=p: done.append(p.failed("a", "oom", "x"))) for p in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert done == [None, None]
    with pytest.raises(FailedAlone) as alone:
        ranks[1].failed("b", "oom", "CUDA out of memory")
    assert (alone.value.cell_id, alone.value.status, alone.value.error) == ("b", "oom",
                                                                            "CUDA out of memory")
    assert ranks[0].other_failed_alone() == {"rank": 1, "cell_id": "b"}
    assert ranks[1].other_failed_alone() is None  # its own
    with pytest.raises(PeerFailed):
        ranks[0].failed("b", "failed", "Connection closed by peer")

    class Gone:
        def check(self, keys):
            raise RuntimeError("connection refused")

    gone = Peers(Gone(), "g0", 0, 2)
    assert gone.other_failed_alone() is None and gone.other_failed_alone(unreachable={}) == {}


def _nan_on_one_rank(rank: int, world_size: int) -> tuple[str, str]:
    guard = Guard()
    # rank 1's loss went NaN at step 2; the gradient all-reduce carried it into rank 0's parameters, whose
    # loss is NaN a step later: the cell's cause is rank 1's, the earlier one, not the lowest rank's
    guard.fail("cell", "failed", f"loss is NaN at step {3 - rank} (rank {rank}, 4 steps run): ...")
    return guard.agree()["cell"]


def test_a_nan_on_one_rank_is_blamed_on_that_rank():
    from dist_utils import run_distributed

    causes = run_distributed(_nan_on_one_rank, 2, timeout_s=60)
    assert causes[0] == causes[1] and "at step 2 (rank 1" in causes[0][1]
