"""scripts/gpu_check.py (`make gpu-check`): without CUDA it refuses, exit 2, creating nothing; its claims
are computed from a run folder's rows by hand-checkable rules (here on rows written as results.csv holds
them), so the real run on a lent GPU spends its time measuring, not finding the script's bugs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import gpu_check  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_without_cuda_it_exits_2_and_writes_nothing(tmp_path):
    out = tmp_path / "evidence"
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "gpu-check: needs a CUDA device" in proc.stderr
    assert not out.exists() and not (REPO / "gpu-check").exists()


def row(cell_id: str, engine: str, ws: int, **values) -> dict:
    base = {"cell_id": cell_id, "engine": engine, "world_size": str(ws), "status": "ok", "precision": "bf16",
            "compile": "", "parity_gate": "", "stopped_by": "target", "step_time_half_width_pct": "1.5",
            "n_timed_steps": "20", "exposed_comm_ms": "", "step_time_ms_p50": "100"}
    return base | {k: str(v) for k, v in values.items()}


def test_claims_from_a_sweeps_rows(tmp_path):
    """fsdp2 at one rank whose exposed-communication interval holds 0 passes the window claim, one whose
    interval lies above 0 (an optimizer step left out of the compute-only window) fails it; a diverged
    cell fails its parity claim and the sweep's; a budget stop fails the precision claim; 5.0 min of wall
    time is inside an estimate of 4-5 min (±25 %), 7.0 min is not."""
    rows = [row("torch-a", "torch", 1),
            row("fsdp2-a", "fsdp2", 1, parity_gate="passed", parity_grad_error=0.012,
                parity_grad_bound=0.03, parity_tensor="layers.3.norm.weight", parity_tensor_error=0.02,
                parity_tensor_bound=0.06, parity_ddp_error=0.0075, exposed_comm_ms=0.2,
                exposed_comm_ms_ci95_low=-0.5, exposed_comm_ms_ci95_high=0.9),
            row("fsdp2-b", "fsdp2", 1, status="diverged", parity_gate="diverged", parity_grad_error=1.0,
                parity_grad_bound=0.03, parity_tensor_error=1.0, exposed_comm_ms=3.0,
                exposed_comm_ms_ci95_low=2.1, exposed_comm_ms_ci95_high=3.9, stopped_by="budget")]
    claims = {c.name: c for c in gpu_check.sweep_claims(rows, 0, 300.0, (240.0, 300.0), "sweep")}
    assert claims["sweep: every cell ran"].result == "FAIL" and "fsdp2-b: diverged" in claims[
        "sweep: every cell ran"].figure
    # the bounds the gate measured in the run (parity_*_bound), beside the errors
    figure = claims["parity: fsdp2-a"].figure
    assert claims["parity: fsdp2-a"].result == "PASS" and "gradient error 0.012 (≤ 0.03)" in figure
    assert "worst tensor layers.3.norm.weight 0.02 (≤ 0.06)" in figure and "torch DDP's own 0.0075" in figure
    assert "worst tensor 1 (not judged)" in claims["parity: fsdp2-b"].figure
    assert claims["parity: fsdp2-b"].result == "FAIL"
    window = [claims[f"fsdp2 window: fsdp2-{x}"].result for x in "ab"]
    assert window == ["PASS", "FAIL"]
    assert claims["sweep: adaptive rounds"].result == "FAIL"
    assert claims["sweep: wall time vs --dry-run"].result == "PASS"
    late = {c.name: c for c in gpu_check.sweep_claims(rows[:2], 0, 420.0, (240.0, 300.0), "sweep")}
    assert late["sweep: wall time vs --dry-run"].result == "FAIL"
    assert late["sweep: every cell ran"].result == "PASS"
    assert gpu_check.network_claims(rows, 1)[0].result == "SKIP"  # one GPU: no link to measure
    gpu_check.write_summary(tmp_path, list(claims.values()), ["- machine: test"])
    text = (tmp_path / "summary.md").read_text()
    assert "**3 PASS, 4 FAIL, 0 SKIP**" in text and "| parity: fsdp2-b | FAIL |" in text
    assert (tmp_path / "claims.csv").read_text().startswith("claim,result,figure,proves")


def test_pytest_claim_reads_the_junit_xml(tmp_path):
    xml = tmp_path / "pytest.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="t" name="a" time="1.0"/>'
                   '<testcase classname="t" name="b" time="2.0"><skipped message="needs 2 GPUs"/></testcase>'
                   '</testsuite></testsuites>')
    (claim,) = gpu_check.pytest_claims(xml, tmp_path / "pytest.csv", 0, 3.0)
    assert claim.result == "PASS" and claim.figure.startswith("1 passed, 0 failed, 0 errors, 1 skipped")
    (stopped,) = gpu_check.pytest_claims(xml, tmp_path / "pytest.csv", None, 600.0)
    assert stopped.result == "FAIL" and "stopped at its time limit" in stopped.figure


def test_the_gpu_path_end_to_end_with_stand_in_stages(tmp_path, monkeypatch, capsys):
    """main() as on a 1-GPU machine, each stage a stand-in that writes what the real one would (a junit
    XML, a run folder's results.csv, launch_stats.csv): the estimate is printed first, every stage gets a
    limit inside the 9-minute budget, and summary.md, claims.csv and estimate.json come out."""
    monkeypatch.setattr(gpu_check, "cuda_or_reason", lambda: (1, None))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(torch.cuda.nccl, "version", lambda: (2, 21, 5))
    limits = []

    def stage(cmd, limit_s, log):
        limits.append(limit_s)
        out = tmp_path / "evidence"
        if "pytest" in cmd:
            (out / "pytest.xml").write_text('<testsuite><testcase classname="t" name="a"/></testsuite>')
        elif "analyze" in cmd:
            (out / "sweep" / "launch_stats.csv").write_text(
                "cell_id,trace_file,step,launches,launch_delay_us_p50,short_kernels_pct,host_us_per_launch,"
                "gpu_busy_pct,host_wait_pct,launch_bound\nc1,f,1,10,1,0,5,88.5,0,False\n")
        else:
            folder = Path(cmd[cmd.index("--out") + 1])
            folder.mkdir()
            fields = "cell_id,engine,world_size,status,precision,compile,parity_gate,stopped_by"
            (folder / "results.csv").write_text(f"{fields}\nc1,torch,1,ok,bf16,,,target\n")
        return 0, 102.0  # inside the sweep's estimate (2.2-2.4 min with its parity gates, ±25 %)

    monkeypatch.setattr(gpu_check, "run_stage", stage)
    code = gpu_check.main(["--out", str(tmp_path / "evidence")])
    summary = (tmp_path / "evidence" / "summary.md").read_text()
    assert code == 0, summary
    printed = capsys.readouterr().out
    assert printed.startswith("gpu-check on 1 × NVIDIA H100 80GB HBM3: estimated ")
    # each stage's limit leaves the later stages their lowest estimates within the budget (the stand-ins
    # return at once, so the later ones may take what the earlier left)
    assert len(limits) == 4 and max(limits) <= gpu_check.BUDGET_1GPU_S
    assert limits[0] < 0.7 * gpu_check.BUDGET_1GPU_S
    assert "complete (4 of 4 stages)" in summary and "| gpu busy: c1 | PASS | GPU busy 88.5 %" in summary
    assert "0 FAIL" in summary and (tmp_path / "evidence" / "estimate.json").is_file()


def test_the_dry_run_plans_without_cuda_and_runs_nothing(tmp_path, capsys):
    # Issue 45: `--dry-run` needed a CUDA device, so a laptop or a login node could not see the plan.
    if gpu_check.cuda_or_reason()[0]:
        pytest.skip("a CUDA machine plans for its own GPUs")
    out = tmp_path / "evidence"
    assert gpu_check.main(["--dry-run", "--gpus", "8", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert said.startswith("gpu-check on 8 × GPU (planned") and "estimated" in said and not out.exists()
    assert gpu_check.main(["--out", str(out)]) == gpu_check.EXIT_NO_CUDA and not out.exists()


def test_the_packing_claim():
    """On 8 GPUs world size 1's groups ran packed, each on its own GPU: PASS; run one after another (no
    slot recorded, or every cell on the same GPUs): FAIL; on one GPU: SKIP."""
    packed = [row("torch-a", "torch", 1, packed_launches="8", slot_gpus="0", step_time_ms_p50="10.0"),
              row("torch-b", "torch", 1, packed_launches="8", slot_gpus="1", step_time_ms_p50="10.1"),
              row("torch-8", "torch", 8, packed_launches="1", slot_gpus="")]
    (claim,) = gpu_check.packing_claims(packed, 8)
    assert claim.result == "PASS" and "GPUs ['0', '1']" in claim.figure and "torch-a: 10.0 ms on GPU 0" in (
        claim.figure)
    alone = [row("torch-a", "torch", 1, packed_launches="1", slot_gpus=""),
             row("torch-b", "torch", 1, packed_launches="1", slot_gpus="")]
    assert gpu_check.packing_claims(alone, 8)[0].result == "FAIL"
    assert gpu_check.packing_claims(packed, 1)[0].result == "SKIP"
