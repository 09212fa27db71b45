"""Which tests `make test-fast` runs (docs/development.md): every unit test and one short end-to-end run.

A module whose tests start ranks or processes for each case (gloo parity, the worker's rounds, the probe)
or check against a heavy second witness (HolisticTraceAnalysis on real traces) is `integration`; `slow`
tests are whole sweeps through torchrun, SLURM and two agents (marked where they are written). `make test`
runs everything; `make test-fast` runs neither, plus EDIT_LOOP_E2E, the one sweep it keeps.

Also the one fixture several modules share: `one_rank_group`, a gloo group of one rank in this process.
"""

from __future__ import annotations

import fcntl
import sys
from pathlib import Path

import pytest

# the projection's calibration lab (benchmarks/projection_lab/) is not in the package users import: tests
# import it from beside its validator, as the validator does
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

INTEGRATION = {
    "test_worker.py", "test_ddp_parity.py", "test_ddp_features.py", "test_ddp_lifetime.py", "test_sync.py",
    "test_probe.py", "test_groups.py", "test_analyze_real.py", "test_trace_compare.py",
}
# a sweep through torchrun (every engine, world sizes 1 and 2, accumulation and compression): the result
# row's whole contract, from a real launch
EDIT_LOOP_E2E = "tests/test_runner.py::test_sweep_world_sizes_1_and_2"


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in INTEGRATION:
            item.add_marker(pytest.mark.integration)
        if item.nodeid == EDIT_LOOP_E2E:
            item.add_marker(pytest.mark.edit_loop)


# `make test` runs two pytest-xdist workers with --dist loadfile: a module's tests stay on one worker, so a
# module fixture (the one-host SLURM cluster: one slurmctld, slurmd and munged, as root) is started once.
# GPU tests live in several modules and each takes the node's GPUs (two at once would measure each other):
# they take turns through a lock in the directory every worker's temporary folders are made in.
@pytest.fixture(autouse=True)
def one_gpu_test_at_a_time(request, tmp_path_factory):
    if request.node.get_closest_marker("gpu") is None:
        yield
        return
    root = tmp_path_factory.getbasetemp()
    if hasattr(request.config, "workerinput"):
        root = root.parent   # a worker's basetemp is <the run's basetemp>/popen-gwN
    with open(root / "gpu-tests.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture
def one_rank_group(tmp_path):
    """A gloo process group of world size 1 in this process (meeting through a FileStore: no TCP port), torn
    down after the test."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


# Every advice/ folder a test leaves behind is checked by a second witness (tests/advice_check.py): no row of
# advice.csv and no sentence of advice.md says what its interval does not. A test's own tmp_path at its
# teardown (an error of that test); what module- or session-scoped fixtures wrote, once at the session's end.
_ADVICE_SEEN: set = set()


@pytest.fixture(autouse=True)
def advice_follows_its_intervals(request):
    yield
    tmp = request.node.funcargs.get("tmp_path") if hasattr(request.node, "funcargs") else None
    if tmp is not None:
        from advice_check import check_tree

        found = check_tree(tmp, _ADVICE_SEEN)
        assert not found, "advice contradicts its intervals:\n" + "\n".join(found)


def pytest_sessionfinish(session, exitstatus):
    if hasattr(session.config, "workerinput"):
        return  # an xdist worker: its status does not fail the run; the controller checks all workers' trees
    factory = getattr(session.config, "_tmp_path_factory", None)
    if factory is None or factory._basetemp is None:
        return
    from advice_check import check_tree

    found = check_tree(factory.getbasetemp(), _ADVICE_SEEN)
    if found:
        session.config.get_terminal_writer().line(
            "advice contradicts its intervals (tests/advice_check.py):\n" + "\n".join(found), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
