"""The node's facts in the report and in `bench compare`: SM count, clocks, power, ECC, MIG, NVLink, IB and
variables, from env.json (fixtures: the real 1×H100 node's nvidia-smi values, an A100 node's by contrast)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # report_fixtures, nvidia_fixtures, beside this file

from nvidia_fixtures import NVLINK_8GPU  # noqa: E402
from report_fixtures import A100_ENV, H100_ENV, scaling_rows, write_run  # noqa: E402

from bench.__main__ import main as bench_main  # noqa: E402
from bench.report import comparability  # noqa: E402
from bench.run_folder import load_run  # noqa: E402

H100_SMI = {"name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:00:06.0", "driver": "580.159.04",
            "sm_clock_max_mhz": 1980.0, "memory_clock_max_mhz": 2619.0, "power_limit_w": 700.0,
            "persistence_mode": "Enabled", "ecc_mode": "Enabled", "mig_mode": "Disabled"}
H100 = {**H100_ENV, "gpus": [{**g, "sm_count": 132} for g in H100_ENV["gpus"]], "driver_cuda": "13.0",
        "gpu_smi": [H100_SMI] * 4, "nvlink": NVLINK_8GPU, "pci_bus_ids": ["00000000:00:06.0"],
        "infiniband": [{"device": "mlx5_0", "port": "1", "rate": "400 Gb/sec (4X NDR)", "state": "4: ACTIVE",
                        "link_layer": "InfiniBand"}],
        "mfu_peak": {"NVIDIA H100 80GB HBM3": {"peak": "H100 SXM", "source": "datasheet"}},
        "env_vars": {"NCCL_DEBUG": "WARN", "NCCL_ALGO": "Ring", "CUDA_LAUNCH_BLOCKING": "1"},
        "unavailable": {}}
A100 = {**A100_ENV, "gpus": [{**g, "sm_count": 108} for g in A100_ENV["gpus"]], "driver_cuda": "12.4",
        "gpu_smi": [{**H100_SMI, "name": "NVIDIA A100-SXM4-80GB", "sm_clock_max_mhz": 1410.0,
                     "memory_clock_max_mhz": 1593.0, "power_limit_w": 400.0, "ecc_mode": "Disabled",
                     "mig_mode": "Enabled"}] * 4,
        "nvlink": "", "pci_bus_ids": ["00000000:00:06.0"], "infiniband": None,
        "mfu_peak": {"NVIDIA A100-SXM4-80GB": {"peak": "A100 SXM (40GB/80GB)", "source": "datasheet"}},
        "env_vars": {"NCCL_DEBUG": "WARN", "CUDA_DEVICE_MAX_CONNECTIONS": "1"},
        "unavailable": {"infiniband": "/sys/class/infiniband is absent (no InfiniBand/RoCE driver loaded)"}}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    return write_run(root / "h100", scaling_rows(), H100), write_run(root / "a100", scaling_rows(), A100)


def test_compare_lists_the_machine_facts_that_differ(runs):
    diff = comparability.env_differences([load_run(r) for r in runs])
    listed = comparability.difference_list(diff)
    for line in ("SM count: 132 vs 108", "SM clock max (MHz): 1980.0 vs 1410.0",
                 "memory clock max (MHz): 2619.0 vs 1593.0", "power limit (W): 700.0 vs 400.0",
                 "ECC mode: Enabled vs Disabled", "MIG mode: Disabled vs Enabled",
                 "driver's newest CUDA: 13.0 vs 12.4", "driver: 570.124.06 vs 550.54.15",
                 "cuda: 12.8 vs 12.4", "nccl: 2.27.3 vs 2.21.5",
                 "NVLink: 2 links on 1 GPU(s) at 26.562 GB/s vs none (nvidia-smi nvlink -s printed no link)",
                 "NCCL_ALGO: Ring vs unset", "CUDA_DEVICE_MAX_CONNECTIONS: unset vs 1",
                 "InfiniBand: mlx5_0/1 400 Gb/sec (4X NDR) 4: ACTIVE InfiniBand vs unset",
                 "topology: differs (see the table)"):
        assert line in listed, line
    text = "\n".join(listed)
    assert "hostname" not in text and "NCCL_DEBUG" not in text and "persistence" not in text
    assert "torch:" not in text  # same torch on both


def test_compare_page_shows_the_list(runs, tmp_path):
    out = tmp_path / "cmp"
    assert bench_main(["compare", *map(str, runs), "--out", str(out)]) == 0
    summary = (out / "summary.md").read_text()
    assert "Environment differences (machine facts" in summary and "- SM count: 132 vs 108" in summary


def test_run_page_shows_facts_warnings_and_missing_reasons(runs, tmp_path):
    assert bench_main(["report", str(runs[0]), "--out", str(tmp_path / "h")]) == 0
    page = (tmp_path / "h" / "report.md").read_text()
    assert "> CUDA_LAUNCH_BLOCKING=1: every kernel launch waits" in page  # a warning under Findings
    assert "| SM count | 132 |" in page and "| MFU peak | NVIDIA H100 80GB HBM3: H100 SXM |" in page
    assert bench_main(["report", str(runs[1]), "--out", str(tmp_path / "a")]) == 0
    page = (tmp_path / "a" / "report.md").read_text()
    assert "| InfiniBand | — (/sys/class/infiniband is absent" in page and "CUDA_LAUNCH_BLOCKING" not in page


def test_a_cpu_run_lists_no_gpu_facts(tmp_path):
    # a dozen "nvidia-smi is not on PATH" rows say nothing about a CPU run: they are left out there
    from report_fixtures import CPU_ENV, row, write_run

    env = CPU_ENV | {"unavailable": {"gpu_smi": "nvidia-smi is not on PATH"}}
    run = write_run(tmp_path / "cpu", [row("torch", 1, 10.0)], env=env)
    assert bench_main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "report.md").read_text()
    assert "| torch |" in page and "SM clock max" not in page and "nvidia-smi is not on PATH" not in page
