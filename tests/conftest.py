"""Which tests `make test-fast` runs (docs/development.md): every unit test and one short end-to-end run.

A module whose tests start ranks or processes for each case (gloo parity, the worker's rounds, the probe)
or check against a heavy second witness (HolisticTraceAnalysis on real traces) is `integration`; `slow`
tests are whole sweeps through torchrun, SLURM and two agents (marked where they are written). `make test`
runs everything; `make test-fast` runs neither, plus EDIT_LOOP_E2E, the one sweep it keeps.
"""

from __future__ import annotations

import pytest

INTEGRATION = {
    "test_worker.py", "test_ddp_parity.py", "test_ddp_features.py", "test_ddp_lifetime.py", "test_sync.py",
    "test_probe.py", "test_groups.py", "test_analyze_real.py", "test_trace_compare.py",
}
# a sweep (two engines, world sizes 1 and 2) through torchrun, then analyze, project and report: every stage
EDIT_LOOP_E2E = ("tests/test_engines.py::"
                 "test_a_plug_in_engine_runs_end_to_end_and_the_later_stages_import_no_torch")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.path.name in INTEGRATION:
            item.add_marker(pytest.mark.integration)
        if item.nodeid == EDIT_LOOP_E2E:
            item.add_marker(pytest.mark.edit_loop)
