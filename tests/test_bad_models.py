"""Bad user models through the real CLI (a subprocess of `python -m bench run`): the launcher's pre-flight
(bench/workloads/preflight.py) refuses each with exit 2 and one line naming the spec and the cause, before
a run folder exists; what only the ranks can see (a forward raising on rank 1 only) fails its own cells
and leaves the others' rows."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_runner import FAST, REPO, assert_no_orphans, read_csv

MODELS = REPO / "tests" / "faulty_models.py"


def bench(tmp_path, spec: str, *overrides: str, extra: tuple[str, ...] = ()):
    sets = [a for o in (*FAST, f"workload.model={spec}", "matrix.engine=torch", *overrides)
            for a in ("--set", o)]
    cmd = [sys.executable, "-m", "bench", "run", "--config", "cpu-smoke", *sets,
           "--out", str(tmp_path / "run"), *extra]
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)


@pytest.mark.parametrize("name, cause", [
    ("BuildRaises", "BuildRaises.build_model() on the meta device (how the launcher sizes it without "
                    "allocating; a model must not read its own values while it is built) raised ValueError: "
                    "no such layer: build_model of the user's model"),
    ("ReadsValues", "raised RuntimeError: Tensor.item() cannot be called on meta tensors"),
    ("ForwardRaises", "ForwardRaises.loss(model, batch) (the model's forward and the loss) raised "
                      "RuntimeError: (expected 7 features, got 6)"),   # the error's last line
    ("ForwardTuple", "raised AttributeError: 'tuple' object has no attribute 'size'"),
    ("LossDict", "LossDict.loss(model, batch) returned a dict, not a one-element loss tensor"),
    ("LossNone", "LossNone.loss(model, batch) returned None, not a one-element loss tensor"),
    ("NoTrainable", "NoTrainable.build_model() has no trainable parameters"),
    ("NotAModule", "NotAModule.build_model() returned function, not a torch.nn.Module"),
    ("UnusedParameter", "2 of 4 trainable parameters get no gradient from the loss (unused.weight, "
                        "unused.bias)"),
    ("Pairs", "Pairs is class Pairs, not a subclass of bench.workloads.Workload"),
])
def test_a_bad_model_exits_2_with_one_line_and_nothing_created(tmp_path, name, cause):
    proc = bench(tmp_path, f"{MODELS}:{name}", "matrix.world_size=2")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()   # one line, no traceback
    assert line.startswith(f"error: workload: model='{MODELS}:{name}': ") and cause in line, line
    assert not (tmp_path / "run").exists() and not (tmp_path / "results").exists()


def test_a_syntax_error_in_the_model_file_exits_2_naming_file_and_line(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("from torch import nn\n\ndef forward(:\n")
    proc = bench(tmp_path, f"{bad}:Net")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert f"importing {bad} raised SyntaxError" in line and "line 3" in line, line
    assert not (tmp_path / "run").exists()


def test_a_model_meta_cannot_step_is_left_to_the_ranks_with_a_note(tmp_path):
    proc = bench(tmp_path, f"{MODELS}:MaskedForward", "matrix.world_size=1", extra=("--dry-run",))
    assert proc.returncode == 0, proc.stderr
    assert "not checked before launch (NotImplementedError" in proc.stderr and "its cells check it" in \
        proc.stderr


@pytest.mark.timeout(150)
def test_a_forward_raising_on_one_rank_fails_that_cell_and_keeps_the_others(tmp_path):
    """Only the ranks see it: world size 1 (rank 0 alone) is measured, world size 2 fails with the model's
    own error on rank 1, and the launcher exits 0 (failed cells are recorded, not fatal)."""
    proc = bench(tmp_path, f"{MODELS}:ForwardRaisesOnRank1", "matrix.world_size=1,2",
                 "profile.enabled=false")
    assert proc.returncode == 0, proc.stderr[-3000:]
    _, rows = read_csv(tmp_path / "run")
    by_ws = {r["world_size"]: r for r in rows}
    assert by_ws["1"]["status"] == "ok" and float(by_ws["1"]["samples_per_s"]) > 0
    assert by_ws["2"]["status"] == "failed", by_ws["2"]
    assert "the user's forward fails on rank 1 only" in by_ws["2"]["error"], by_ws["2"]["error"]
    assert "Traceback" not in by_ws["2"]["error"].splitlines()[0]
    assert_no_orphans(tmp_path / "run")
