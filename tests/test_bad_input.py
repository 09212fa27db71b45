"""Every bad input is refused before anything starts: exit 2, one line naming the key (or file) and the
value, no traceback, nothing created. Table-driven, in-process through bench.__main__.main."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

import pytest

from bench.__main__ import main as bench_main

sys.path.insert(0, str(Path(__file__).parent))  # report_fixtures, beside this file

# (argv after `run`, text the message must contain); files are written by the fixture below.
CASES = [
    (["--set", "run.cell_timeout_s=nan"], "run.cell_timeout_s=nan: must be a finite number"),
    (["--set", "run.startup_timeout_s=nan"], "run.startup_timeout_s=nan"),
    (["--set", "matrix.bucket_cap_mb=nan"], "matrix.bucket_cap_mb=nan"),
    (["--set", "matrix.bucket_cap_mb=inf"], "matrix.bucket_cap_mb=inf"),
    (["--set", "matrix.bucket_cap_mb=1e30"], "matrix.bucket_cap_mb=1e+30: must be <= 16384"),
    (["--set", "run.pg_timeout_s=1e300"], "run.pg_timeout_s=1e+300: must be <="),
    (["--set", "run.timed_steps=-1"], "run.timed_steps=-1"),
    (["--set", "run.target_ci_pct=-1"], "run.target_ci_pct=-1.0: must be >= 0 and <= 100"),
    (["--set", "run.target_ci_pct=nan"], "run.target_ci_pct=nan: must be a finite number"),
    (["--set", "run.max_group_s=0"], "run.max_group_s=0.0: must be > 0"),
    (["--set", "run.target_ci_pct=2", "--set", "run.max_timed_steps=5"],
     "run.max_timed_steps=5: must be >= run.timed_steps × run.repeats = 20"),
    (["--set", "matrix.world_size=100000"], "matrix.world_size=100000: must be <= 65536"),
    (["--set", "run.threads_per_rank=1e3"], "run.threads_per_rank='1e3': must be a int"),
    (["--set", "workload.seq_len=" + "9" * 100_000], "workload.seq_len="),
    (["--retry", "ok", "--resume"], "--retry='ok'"),
    (["--retry", "failed"], "--retry='failed': needs --resume"),
]
FILE_CASES = {  # TOML files that are not a valid preset
    "matrix5.toml": (b"matrix = 5\n", "matrix=5: must be a table"),
    "device5.toml": (b"[run]\ndevice = 5\n", "run.device=5"),
    "latin1.toml": (b"description = '\xe9t\xe9'\n", "not UTF-8"),
    "broken.toml": (b"[matrix\n", "not valid TOML"),
}


def run(argv, capsys):
    rc = bench_main(["run", *argv])
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@pytest.mark.parametrize(("argv", "expected"), CASES, ids=[c[1][:40] for c in CASES])
def test_bad_values_are_refused_before_anything_is_created(tmp_path, capsys, argv, expected):
    out = tmp_path / "run"
    rc, text = run(["--config", "cpu-smoke", "--out", str(out), *argv], capsys)
    assert rc == 2 and expected in text and "Traceback" not in text
    assert len(text) < 400  # a 100 KB value is not echoed whole
    assert not out.exists()


@pytest.mark.parametrize("name", sorted(FILE_CASES))
def test_bad_preset_files_are_refused(tmp_path, capsys, name):
    content, expected = FILE_CASES[name]
    (tmp_path / name).write_bytes(content)
    out = tmp_path / "run"
    rc, text = run(["--config", str(tmp_path / name), "--out", str(out)], capsys)
    assert rc == 2 and expected in text and "Traceback" not in text and not out.exists()


def test_bad_folders_are_refused(tmp_path, capsys):
    (tmp_path / "afile").write_text("")
    for argv, expected in [
        (["--config", str(tmp_path)], "is a directory"),
        (["--config", "cpu-smoke", "--out", str(tmp_path / "afile" / "run")], "is a file, not a folder"),
        (["--config", "cpu-smoke", "--out", "/proc/ddpbench-run"], "is a system folder"),
        (["--collect", str(tmp_path)], "no config.toml or plan.json"),
    ]:
        rc, text = run(argv, capsys)
        assert rc == 2 and expected in text and "Traceback" not in text, (argv, text)
    assert not (tmp_path / ".lock").exists()  # --collect on a wrong folder leaves nothing behind


def test_resume_names_the_key_that_differs(tmp_path, capsys):
    out = tmp_path / "run"
    base = ["--config", "cpu-smoke", "--out", str(out), "--set", "matrix.engine=torch"]
    assert run([*base, "--plan-only"], capsys)[0] == 0
    rc, text = run([*base, "--set", "run.timed_steps=7", "--resume"], capsys)
    assert rc == 2 and "run.timed_steps=7 differs from 20" in text


@pytest.mark.slow  # a real sweep on a disk that fills (~8 s): `make test` runs it
def test_a_full_disk_mid_run_keeps_every_finished_row(tmp_path, capsys, monkeypatch):
    # The second record cannot be written (ENOSPC): the run stops with a clear message and the resume
    # hint, the first record and a whole results.csv stay, no .tmp is left; --resume then finishes it.
    from bench.run import results

    real = results.append_records
    calls = []

    def full_after_one(run_dir, records):
        calls.extend(r["cell_id"] for r in records)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(run_dir, records)

    monkeypatch.setattr(results, "append_records", full_after_one)
    out = tmp_path / "run"
    argv = ["--config", "cpu-smoke", "--out", str(out), "--set", "matrix.engine=torch", "--set",
            "matrix.world_size=1", "--set", "matrix.scaling=strong", "--set", "profile.enabled=false",
            "--set", "run.launches=1"]
    rc, text = run(argv, capsys)
    assert rc == 1 and "No space left on device" in text and "--resume" in text and "Traceback" not in text
    assert [r["cell_id"] for r in results.read_records(out)] == calls[:1]
    assert (out / "results.csv").read_text().count("\n") == 2 and not list(out.glob("*.tmp"))
    monkeypatch.setattr(results, "append_records", real)
    assert run([*argv, "--resume"], capsys)[0] == 0
    assert len(results.read_records(out)) == 2 and {r["status"] for r in results.read_records(out)} == {"ok"}


# ---- the report's inputs ----------------------------------------------------------------------------

def report_run(tmp_path):
    """A small real-looking run folder (two cells) written by the report tests' fixture helpers."""
    from report_fixtures import row, write_run

    return write_run(tmp_path / "run", [row("torch", 1, 10.0), row("torch", 2, 6.0)])


@pytest.mark.parametrize(("name", "content", "expected"), [
    ("results.csv", b'cell_id,status\n"unterminated,ok\n', "results.csv: not a readable CSV"),
    ("results.csv", bytes(range(256)) * 4, "results.csv"),
    ("results.csv", b"", "results.csv"),
    ("env.json", b"{not json", "env.json: not valid JSON"),
    ("config.toml", b"[run\n", "config.toml: not valid TOML"),
])
def test_report_refuses_corrupt_files_with_one_line(tmp_path, capsys, name, content, expected):
    run_dir = report_run(tmp_path)
    if name == "results.csv":
        (run_dir / "cells.jsonl").unlink()  # results.csv alone is what the report must read
    (run_dir / name).write_bytes(content)
    out = tmp_path / "report"
    rc = bench_main(["report", str(run_dir), "--out", str(out)])
    text = capsys.readouterr().err
    assert rc == 2 and expected in text and "Traceback" not in text and len(text.splitlines()) == 1
    assert not out.exists()


def test_report_out_being_a_file_is_refused(tmp_path, capsys):
    run_dir = report_run(tmp_path)
    (tmp_path / "afile").write_text("")
    for out in (tmp_path / "afile", tmp_path / "afile" / "under"):
        assert bench_main(["report", str(run_dir), "--out", str(out)]) == 2
        assert "is a file, not a folder" in capsys.readouterr().err
        assert bench_main(["compare", str(run_dir), str(run_dir), "--out", str(out)]) == 2
        assert "is a file, not a folder" in capsys.readouterr().err


def test_a_truncated_results_csv_is_rebuilt_from_cells_jsonl_and_said(tmp_path, capsys):
    run_dir = report_run(tmp_path)
    text = (run_dir / "results.csv").read_text()
    (run_dir / "results.csv").write_text(text[: text.index("\n") + 40])  # header and a row cut mid-field
    lines = (run_dir / "cells.jsonl").read_text().splitlines()
    (run_dir / "cells.jsonl").write_text("\n".join([lines[0], *lines]) + "\n")  # a duplicated line
    out = tmp_path / "report"
    assert bench_main(["report", str(run_dir), "--out", str(out)]) == 0
    summary = (out / "summary.md").read_text()
    assert "results.csv disagrees with cells.jsonl" in summary
    from bench.run_folder import load_run

    assert len(load_run(run_dir).results) == 2  # both cells, the duplicated one once


def test_error_text_cannot_inject_html_into_summary_md(tmp_path):
    from report_fixtures import row, write_run

    from bench.report import build_report

    bad = row("torch", 1, None, status="failed", error="<script>alert(1)</script> | a\nb")
    index = build_report(write_run(tmp_path / "run", [bad]), tmp_path / "report")
    summary = (index.parent / "summary.md").read_text()
    assert "<script>" not in summary and "&lt;script&gt;" in summary
    assert "<script>" not in index.read_text()


@pytest.mark.parametrize(("port", "expected"), [(99999, "must be between 0"), (-5, "must be between 0")])
def test_tensorboard_port_out_of_range(tmp_path, capsys, port, expected):
    run_dir = tmp_path / "run" / "traces" / "c"
    run_dir.mkdir(parents=True)
    (run_dir / "rank0.1.pt.trace.json.gz").write_bytes(b"")
    assert bench_main(["tensorboard", str(tmp_path / "run"), "--port", str(port)]) == 2
    assert expected in capsys.readouterr().err


def test_tensorboard_port_in_use(tmp_path, capsys):
    import socket

    run_dir = tmp_path / "run" / "traces" / "c"
    run_dir.mkdir(parents=True)
    (run_dir / "rank0.1.pt.trace.json.gz").write_bytes(b"")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert bench_main(["tensorboard", str(tmp_path / "run"), "--port", str(port)]) == 2
    assert "cannot listen there" in capsys.readouterr().err


def test_options_a_model_does_not_read_are_refused(tmp_path, capsys):
    for setting, key in (("workload.data=train.tsv", "workload.data='train.tsv'"),
                         ("workload.task=lm", "workload.task='lm'"),
                         ("workload.image_size=64", "image_size=64")):
        rc, text = run(["--config", "cpu-smoke", "--out", str(tmp_path / "r"), "--set", setting], capsys)
        assert rc == 2 and key in text and "does not use it" in text


def test_cpu_world_sizes_far_above_the_cores_are_refused_unless_allowed(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 64)  # the node's; this process may use two of them
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    base = ["--config", "cpu-smoke", "--set", "matrix.scaling=weak", "--dry-run"]
    rc, text = run([*base, "--set", "matrix.world_size=64"], capsys)
    assert rc == 2 and "64 CPU ranks on 2 cores" in text and "run.allow_oversubscribe" in text
    rc, text = run([*base, "--set", "matrix.world_size=4"], capsys)
    assert rc == 0 and "4 busy threads on 2 CPU cores" in text  # a warning with the numbers
    rc, _ = run([*base, "--set", "matrix.world_size=64", "--set", "run.allow_oversubscribe=true"], capsys)
    assert rc == 0


@pytest.mark.parametrize("fails", ["write_env", "lock_run_dir"])
def test_a_disk_that_fills_while_the_run_folder_is_made_is_one_line(tmp_path, capsys, monkeypatch, fails):
    # Issue 45: a disk full after config.toml (the lock's pid, env.json) was a traceback, the folder left
    # half-made. Now: exit 2, one line, nothing left.
    from bench.run import folder

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(folder, fails, full)
    out = tmp_path / "run"
    rc, text = run(["--config", "cpu-smoke", "--out", str(out), "--set", "matrix.world_size=1"], capsys)
    assert rc == 2 and "cannot create the run folder (No space left on device)" in text, text
    assert "Traceback" not in text and len(text.strip().splitlines()) == 1 and not out.exists()
