"""env.json records what changes GPU numbers: variables, warnings and the node's facts, each None with a
reason where its tool is missing. A fake nvidia-smi (real 1×H100 output, tests/nvidia_fixtures.py) and a
fake /sys/class/infiniband stand in for a GPU node on CPU machines."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))  # nvidia_fixtures, report_fixtures, beside this file

from nvidia_fixtures import NVLINK_8GPU, fake_smi, put_on_path  # noqa: E402

from bench import envinfo, nvidia  # noqa: E402
from bench.__main__ import main as bench_main  # noqa: E402

# The keys HEAD wrote on the real H100 node (/work/gpu-evidence/default-1xH100-partial/env.json, less the
# keys run_cli adds): other code reads them, so they stay.
HEAD_KEYS = {"torch", "torch_source", "cuda", "cudnn", "nccl", "gpus", "gpu_count", "driver", "topology",
             "cpu_model", "cpu_cores", "env_vars", "git_sha", "hostname", "command", "time", "python",
             "device", "backend"}
RECORDED = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "CUDA_VISIBLE_DEVICES": "0,1", "PYTORCH_CUDA_ALLOC_CONF":
            "expandable_segments:True", "CUBLAS_WORKSPACE_CONFIG": ":4096:8", "CUBLASLT_LOG_LEVEL": "0",
            "NVIDIA_TF32_OVERRIDE": "0", "SLURM_JOB_ID": "42", "UCX_TLS": "rc", "FI_PROVIDER": "efa",
            "NCCL_ALGO": "Ring", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "OMP_NUM_THREADS": "4",
            "GLOO_SOCKET_IFNAME": "lo"}


@pytest.fixture
def no_tools(tmp_path, monkeypatch):
    """No nvidia-smi, no /proc driver, no pynvml: a CPU machine, even on a GPU node."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(nvidia, "PROC_GPUS", tmp_path / "no-proc")
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    return tmp_path


def test_variables_that_change_gpu_numbers_are_recorded(monkeypatch):
    for k, v in RECORDED.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("DDPBENCH_UNRELATED", "x")
    info = envinfo.collect("cpu", "gloo", ["test"])
    assert {k: info["env_vars"][k] for k in RECORDED} == RECORDED
    assert "DDPBENCH_UNRELATED" not in info["env_vars"]
    assert HEAD_KEYS <= set(info)


def test_timing_warnings():
    both = envinfo.timing_warnings({"CUDA_LAUNCH_BLOCKING": "1", "NVIDIA_TF32_OVERRIDE": "0"})
    assert len(both) == 2 and both[0].startswith("CUDA_LAUNCH_BLOCKING=1")
    assert both[1].startswith("NVIDIA_TF32_OVERRIDE=0")
    assert envinfo.timing_warnings({"CUDA_LAUNCH_BLOCKING": "0", "NCCL_DEBUG": "INFO"}) == []


def test_bench_run_warns_on_stderr_and_in_env_json(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUDA_LAUNCH_BLOCKING", "1")
    out = tmp_path / "run"
    assert bench_main(["run", "--config", "cpu-smoke", "--out", str(out), "--plan-only"]) == 0
    assert "warning: CUDA_LAUNCH_BLOCKING=1: every kernel launch waits" in capsys.readouterr().err
    env = json.loads((out / "env.json").read_text())
    assert env["env_warnings"][0].startswith("CUDA_LAUNCH_BLOCKING=1")


def test_machine_facts_from_nvidia_smi_and_sysfs(tmp_path, monkeypatch):
    put_on_path(monkeypatch, fake_smi(tmp_path / "bin"))
    port = tmp_path / "ib" / "mlx5_0" / "ports" / "1"
    port.mkdir(parents=True)
    sysfs = {"rate": "400 Gb/sec (4X NDR)\n", "state": "4: ACTIVE\n", "link_layer": "InfiniBand\n"}
    for name, text in sysfs.items():
        (port / name).write_text(text)
    facts = envinfo.machine_facts(["NVIDIA H100 80GB HBM3"], ib_dir=tmp_path / "ib")
    assert facts["gpu_smi"] == [{"name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:00:06.0",
                                 "driver": "580.159.04", "sm_clock_max_mhz": 1980.0,
                                 "memory_clock_max_mhz": 2619.0, "power_limit_w": 700.0,
                                 "persistence_mode": "Enabled", "ecc_mode": "Enabled",
                                 "mig_mode": "Disabled"}]
    driver = (facts["driver"], facts["driver_cuda"], facts["driver_source"])
    assert driver == ("580.159.04", "13.0", "nvidia-smi")
    assert facts["nvlink"] == ""  # what a 1-GPU node printed: no link
    assert facts["pci_bus_ids"] == ["00000000:00:06.0"]
    assert facts["infiniband"] == [{"device": "mlx5_0", "port": "1", "rate": "400 Gb/sec (4X NDR)",
                                    "state": "4: ACTIVE", "link_layer": "InfiniBand"}]
    assert facts["mfu_peak"]["NVIDIA H100 80GB HBM3"]["peak"] == "H100 SXM"
    assert facts["unavailable"] == {}


def test_nvlink_and_not_supported_fields(tmp_path, monkeypatch):
    put_on_path(monkeypatch, fake_smi(tmp_path / "bin", nvlink=NVLINK_8GPU,
                                      fields={"ecc.mode.current": "[N/A]", "mig.mode.current": "Enabled"}))
    facts = envinfo.machine_facts(["NVIDIA H100 80GB HBM3 MIG 1g.10gb"], ib_dir=tmp_path / "none")
    assert "Link 1: 26.562 GB/s" in facts["nvlink"]
    assert facts["gpu_smi"][0]["ecc_mode"] is None and facts["gpu_smi"][0]["mig_mode"] == "Enabled"
    mig = facts["mfu_peak"]["NVIDIA H100 80GB HBM3 MIG 1g.10gb"]
    assert mig["peak"] is None and "MIG" in mig["reason"]
    assert "absent" in facts["unavailable"]["infiniband"]


def test_every_fact_is_none_with_a_reason_without_tools(no_tools):
    facts = envinfo.machine_facts([], ib_dir=no_tools / "no-ib")
    for key in ("gpu_smi", "driver", "driver_cuda", "nvlink", "infiniband", "pci_bus_ids"):
        assert facts[key] is None and facts["unavailable"][key], key
    assert "not on PATH" in facts["unavailable"]["gpu_smi"]
    assert "no CUDA device" in facts["unavailable"]["sm_count"]


def test_driver_from_pynvml_when_nvidia_smi_is_absent(no_tools, monkeypatch):
    fake = types.SimpleNamespace(nvmlInit=lambda: None, nvmlShutdown=lambda: None,
                                 nvmlSystemGetDriverVersion=lambda: "580.159.04",
                                 nvmlSystemGetCudaDriverVersion=lambda: 13000)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    facts = envinfo.machine_facts([], ib_dir=no_tools / "no-ib")
    assert (facts["driver"], facts["driver_cuda"], facts["driver_source"]) == ("580.159.04", "13.0", "pynvml")
    assert "driver" not in facts["unavailable"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_real_gpu_node_facts():
    """On 1 or 8 GPUs: SM counts from torch, nvidia-smi's rows for at least the GPUs torch sees."""
    info = envinfo.collect("cuda", "nccl", ["test"])
    assert all(g["sm_count"] > 0 for g in info["gpus"]) and len(info["gpus"]) == torch.cuda.device_count()
    assert info["driver"] and info["driver_cuda"]
    if info["gpu_smi"] is not None:  # nvidia-smi lists every GPU, CUDA_VISIBLE_DEVICES or not
        assert len(info["gpu_smi"]) >= info["gpu_count"] and len(info["pci_bus_ids"]) == len(info["gpu_smi"])
        assert all(g["sm_clock_max_mhz"] and g["power_limit_w"] for g in info["gpu_smi"])
        assert info["nvlink"] is not None
    assert set(info["mfu_peak"]) == {g["name"] for g in info["gpus"]}


def test_sm_count_per_gpu_from_torch(tmp_path, monkeypatch):
    """What the real H100 node's torch reported (132 SMs), through a faked torch.cuda on CPU machines."""
    put_on_path(monkeypatch, fake_smi(tmp_path / "bin"))
    props = types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=84_465_090_560, major=9, minor=0,
                                  multi_processor_count=132)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: props)
    info = envinfo.collect("cuda", "nccl", ["test"])
    assert info["gpus"] == [{"name": "NVIDIA H100 80GB HBM3", "memory_mb": 80552, "capability": "9.0",
                             "sm_count": 132}]
    assert "sm_count" not in info["unavailable"] and info["driver"] == "580.159.04"
