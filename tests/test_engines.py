"""The engine registry: every engine's facts from its own module, a plug-in engine through the whole run,
and the stages after the run (report, projection) without torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_runner import REPO, read_csv, run_bench

from bench import engines

TESTS = os.path.dirname(__file__)


def test_built_in_engines_and_their_facts():
    assert engines.names() == ("torch", "naive", "bucketed", "overlap", "fsdp2")
    assert engines.default_sweep() == ("torch", "naive", "bucketed", "overlap")  # fsdp2: when named
    assert engines.reference().name == "torch"
    assert [e for e in engines.names() if not engines.get(e).has_buckets] == ["naive", "fsdp2"]
    assert [e for e in engines.names() if engines.get(e).overlaps_backward] == ["torch", "overlap", "fsdp2"]
    assert {e: engines.get(e).collectives for e in engines.names()} == {
        "torch": ("all_reduce",), "naive": ("all_reduce",), "bucketed": ("all_reduce",),
        "overlap": ("all_reduce",), "fsdp2": ("all_gather", "reduce_scatter")}
    torch_ddp = engines.get("torch")
    assert torch_ddp.skip_reason("bf16", "cpu") and not torch_ddp.skip_reason("bf16", "cuda")
    with pytest.raises(KeyError, match="'fsdp9' is not registered; registered: torch, naive"):
        engines.get("fsdp9")


def test_bench_imports_no_torch_to_read_engine_facts():
    code = ("import sys; from bench import engines; "
            "[(engines.get(e).has_buckets, engines.get(e).skip_reason('bf16', 'cpu')) "
            " for e in engines.names()]; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_plug_in_engine_runs_end_to_end_and_the_later_stages_import_no_torch(tmp_path, monkeypatch):
    # One module and one variable: the launcher and every rank read the same registry. Without buckets,
    # its cells collapse the bucket axis (`bna`) and join the group at torch's default bucket; it is
    # compared with torch side by side.
    monkeypatch.setenv(engines.PLUGIN_VARIABLE, "engine_plugin")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [TESTS, os.environ.get("PYTHONPATH")])))
    out = tmp_path / "run"
    proc = run_bench(out, "matrix.engine=torch,plainsync", "matrix.world_size=2", "matrix.grad_accum=1",
                     "matrix.scaling=strong", "profile.enabled=false", timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = read_csv(out)
    mine = [r for r in rows if r["engine"] == "plainsync"]
    assert mine and all(r["status"] == "ok" and "-bna-" in r["cell_id"] for r in mine)
    assert all(r["speed_vs_torch"] and r["interleaved"] == "true" for r in mine)
    # The report and the projection read the recorded facts and layouts: no torch in their processes.
    for command in (["report", str(out)], ["project", str(out)]):
        code = ("import sys; from bench.__main__ import main; rc = main(sys.argv[1:]); "
                "assert 'torch' not in sys.modules, 'torch imported'; sys.exit(rc)")
        proc = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True,
                              cwd=REPO, timeout=240)
        assert proc.returncode == 0, (command, proc.stderr[-3000:])


def test_after_a_run_analyze_project_and_report_are_called_as_functions(tmp_path, capsys):
    # bench run --report's last stage on a run folder this suite wrote (tests/data/traces/README.md)
    import shutil
    from pathlib import Path

    from bench.run.pipeline import after_run

    run = tmp_path / "run"
    shutil.copytree(Path(TESTS) / "data" / "traces" / "ddpbench-cpu-run", run)
    assert after_run(run) == 0
    out = capsys.readouterr().out
    assert (run / "trace_summary.csv").is_file() and (run / "projection" / "projection.csv").is_file()
    assert "report: " in out and Path(out.split("report: ")[-1].split()[0]).is_file()
    # advise runs between project and report, and the report leads with its answer
    answer = (run / "advice" / "advice.md").read_text().splitlines()[2]
    assert (run / "advice" / "advice.csv").is_file() and out.index(answer) < out.index("report: ")
    index = Path(out.split("report: ")[-1].split()[0])
    summary = (index.parent / "summary.md").read_text()
    assert summary.index("## The answer") < summary.index("## Findings") and answer in summary


def test_the_trainer_asks_the_engine_for_no_sync(tmp_path, monkeypatch):
    # accumulation's micro-steps and the compute-only window go through Engine.no_sync, not a method the
    # trainer assumes the wrapped model has: an engine with another way to skip communication plugs in
    import torch
    import torch.distributed as dist

    from bench.config import load_config
    from bench.engines.ddp_core_engines import DdpCore
    from bench.matrix import expand
    from bench.worker.trainer import Trainer

    calls = []

    class Recording(DdpCore):
        def no_sync(self, model):
            calls.append(type(model).__name__)
            return model.no_sync()

    monkeypatch.setitem(engines.REGISTRY, "overlap", Recording("overlap", "recording"))
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        config = load_config("cpu-smoke", ["matrix.scaling=strong", "matrix.engine=overlap",
                                           "matrix.world_size=1", "matrix.grad_accum=3"])
        (cell,) = expand(config)
        trainer = Trainer(cell, config, torch.device("cpu"), 0, 1, 2)
        trainer.step(), trainer.step()
        assert calls == ["DistributedDataParallel"] * 4  # two no_sync micro-steps of three, twice
    finally:
        dist.destroy_process_group()


def test_a_plug_in_that_cannot_be_imported_is_a_config_error_naming_the_variable(tmp_path):
    env = os.environ | {engines.PLUGIN_VARIABLE: "no_such_engine_module"}
    out = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "bench", "run", "--config", "cpu-smoke", "--out", str(out)],
                          capture_output=True, text=True, cwd=REPO, env=env, timeout=120)
    assert proc.returncode == 2 and not out.exists()
    assert "DDPBENCH_ENGINE_MODULES='no_such_engine_module'" in proc.stderr
    assert "No module named" in proc.stderr
