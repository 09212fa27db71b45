"""Every bad input is refused before anything starts: exit 2, one line naming the key (or file) and the
value, no traceback, nothing created. Table-driven, in-process through bench.__main__.main."""

from __future__ import annotations

import errno

import pytest

from bench.__main__ import main as bench_main

# (argv after `run`, text the message must contain); files are written by the fixture below.
CASES = [
    (["--set", "run.cell_timeout_s=nan"], "run.cell_timeout_s=nan: must be a finite number"),
    (["--set", "run.startup_timeout_s=nan"], "run.startup_timeout_s=nan"),
    (["--set", "matrix.bucket_cap_mb=nan"], "matrix.bucket_cap_mb=nan"),
    (["--set", "matrix.bucket_cap_mb=inf"], "matrix.bucket_cap_mb=inf"),
    (["--set", "matrix.bucket_cap_mb=1e30"], "matrix.bucket_cap_mb=1e+30: must be <= 16384"),
    (["--set", "run.pg_timeout_s=1e300"], "run.pg_timeout_s=1e+300: must be <="),
    (["--set", "run.timed_steps=-1"], "run.timed_steps=-1"),
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
        (["--config", "cpu-smoke", "--out", str(tmp_path / "afile" / "run")], "cannot create the run folder"),
        (["--config", "cpu-smoke", "--out", "/proc/ddpbench-run"], "cannot create the run folder"),
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
    assert rc == 2 and "run.timed_steps=7 differs from 5" in text


def test_a_full_disk_mid_run_keeps_every_finished_row(tmp_path, capsys, monkeypatch):
    # The second record cannot be written (ENOSPC): the run stops with a clear message and the resume
    # hint, the first record and a whole results.csv stay, no .tmp is left; --resume then finishes it.
    from bench import results

    real = results.append_record
    calls = []

    def full_after_one(run_dir, record):
        calls.append(record["cell_id"])
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(run_dir, record)

    monkeypatch.setattr(results, "append_record", full_after_one)
    out = tmp_path / "run"
    argv = ["--config", "cpu-smoke", "--out", str(out), "--set", "matrix.engine=torch", "--set",
            "matrix.world_size=1", "--set", "matrix.scaling=strong", "--set", "profile.enabled=false"]
    rc, text = run(argv, capsys)
    assert rc == 1 and "No space left on device" in text and "--resume" in text and "Traceback" not in text
    assert [r["cell_id"] for r in results.read_records(out)] == calls[:1]
    assert (out / "results.csv").read_text().count("\n") == 2 and not list(out.glob("*.tmp"))
    monkeypatch.setattr(results, "append_record", real)
    assert run([*argv, "--resume"], capsys)[0] == 0
    assert len(results.read_records(out)) == 2 and {r["status"] for r in results.read_records(out)} == {"ok"}
