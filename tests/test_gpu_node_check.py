"""A GPU node whose torch cannot use its GPUs is refused at `bench run`, not silently benchmarked as a CPU.

A fake nvidia-smi (tests/nvidia_fixtures.py, real output formats) stands in for the driver on CPU machines;
torch.cuda.is_available is forced False, as a CPU-only wheel or a wheel newer than the driver makes it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # nvidia_fixtures, beside this file

from nvidia_fixtures import BANNER, fake_smi, put_on_path  # noqa: E402

from bench import nvidia  # noqa: E402
from bench.__main__ import main as bench_main  # noqa: E402


@pytest.fixture
def no_driver(tmp_path, monkeypatch):
    """No nvidia-smi on PATH and an empty /proc/driver/nvidia/gpus, even on a real GPU node."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    (tmp_path / "gpus").mkdir()
    monkeypatch.setattr(nvidia, "PROC_GPUS", tmp_path / "gpus")
    return tmp_path


def test_cpu_only_build_is_named_with_the_driver(tmp_path, monkeypatch):
    put_on_path(monkeypatch, fake_smi(tmp_path / "bin"))
    reason = nvidia.unusable_gpus("2.13.0+cpu", None, environ={})
    assert "1 GPU(s) (GPU 0: NVIDIA H100 80GB HBM3)" in reason
    assert "torch 2.13.0+cpu is a CPU-only build" in reason
    assert "driver 580.159.04, supporting CUDA up to 13.0" in reason


def test_wheel_newer_than_the_driver(tmp_path, monkeypatch):
    old_driver = BANNER.replace("580.159.04", "535.54.03").replace("CUDA Version: 13.0", "CUDA Version: 12.2")
    put_on_path(monkeypatch, fake_smi(tmp_path / "bin", banner=old_driver))
    reason = nvidia.unusable_gpus("2.11.0+cu130", "13.0", environ={})
    assert "built for CUDA 13.0 (newer than the driver supports)" in reason
    assert "driver 535.54.03, supporting CUDA up to 12.2" in reason


@pytest.mark.parametrize("value", ["", "none", "-1"])
def test_empty_cuda_visible_devices_is_named(tmp_path, monkeypatch, value):
    put_on_path(monkeypatch, fake_smi(tmp_path / "bin"))
    reason = nvidia.unusable_gpus("2.11.0+cu130", "13.0", environ={"CUDA_VISIBLE_DEVICES": value})
    assert f"CUDA_VISIBLE_DEVICES={value!r} hides them" in reason
    assert "newer than" not in reason


def test_proc_driver_is_read_when_nvidia_smi_is_absent(no_driver):
    assert nvidia.unusable_gpus("2.13.0+cpu", None, environ={}) is None  # no driver: a CPU machine
    (no_driver / "gpus" / "0000:00:06.0").mkdir()
    reason = nvidia.unusable_gpus("2.13.0+cpu", None, environ={})
    assert "1 GPU(s) (0000:00:06.0)" in reason and "driver version unknown" in reason


def test_bench_run_auto_refuses_before_creating_anything(tmp_path, monkeypatch, capsys):
    put_on_path(monkeypatch, fake_smi(tmp_path / "bin"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "run"
    rc = bench_main(["run", "--config", "default", "--out", str(out), "--plan-only"])  # broken: runs nothing
    err = capsys.readouterr().err
    assert rc == 2 and not out.exists()
    assert "run.device='auto'" in err and "driver 580.159.04, supporting CUDA up to 13.0" in err
    assert ("CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}") in err
    assert "--set run.device=cpu" in err and "Traceback" not in err
    # the way out it names works: the CPU on purpose is not refused
    assert bench_main(["run", "--config", "default", "--set", "run.device=cpu", "--dry-run"]) == 0


def test_bench_run_explicit_cuda_says_why(tmp_path, monkeypatch, capsys):
    put_on_path(monkeypatch, fake_smi(tmp_path / "bin"))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rc = bench_main(["run", "--config", "gpu-node", "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and "run.device='cuda'" in err and "580.159.04" in err


def test_auto_on_a_cpu_machine_still_runs_on_the_cpu(no_driver, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_main(["run", "--config", "default", "--dry-run"]) == 0
