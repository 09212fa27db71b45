"""Issue 38's surfaces, each bad input refused with exit 2 and one line naming the key or file and the
value, before anything is created; nothing a command wrote into a run folder rewritten by another.
In-process through bench.__main__.main, on small run folders written here (no rank is started)."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench import engines, run_folder
from bench.__main__ import main as bench_main

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))  # report_fixtures, beside this file
CPU_RUN = TESTS / "data" / "traces" / "ddpbench-cpu-run"  # a real CPU run (tests/data/traces/README.md)


def call(argv: list[str], capsys) -> tuple[int, str]:
    rc = bench_main(argv)
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


def refused(argv: list[str], capsys, expected: str) -> str:
    rc, text = call(argv, capsys)
    assert rc == 2, text
    assert expected in text and "Traceback" not in text, text
    return text


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` → its content's hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def run_dir(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(CPU_RUN, run)
    return run


# ---- 2. no command rewrites what another wrote into a run folder ------------------------------------------

def test_advise_into_the_run_folder_leaves_the_projection_alone(run_dir, capsys):
    assert call(["project", str(run_dir)], capsys)[0] == 0
    before = snapshot(run_dir)
    refused(["advise", str(run_dir), "--out", str(run_dir)], capsys,
            f"--out={str(run_dir)!r}: is the run folder {str(run_dir)!r} itself")
    assert snapshot(run_dir) == before  # projection/projection.csv kept its rows
    # advise's own folder holds its projection to the target; the run's projection/ is untouched
    assert call(["advise", str(run_dir)], capsys)[0] == 0
    assert (run_dir / "advice" / "projection" / "projection.csv").is_file()
    assert {k: v for k, v in snapshot(run_dir).items() if not k.startswith("advice/")} == before


@pytest.mark.parametrize(("command", "out", "expected"), [
    (["advise"], "projection", "which `bench project` writes"),
    (["advise"], "cells.jsonl", "which `bench run` writes"),
    (["advise"], "traces", "which `bench run` writes"),
    (["project"], "advice", "which `bench advise` writes"),
    (["project"], ".", "itself, which `bench run` and `bench analyze` write"),
    (["project", "--params", "100", "--step-ms", "10", "--per-gpu-batch", "4"], "projection",
     "for that run, not for a what-if"),
    (["analyze"], "projection", "which `bench project` writes"),
    (["report"], ".", "itself"),
    (["compare", str(CPU_RUN)], "advice", "which `bench advise` writes"),
])
def test_no_command_writes_into_another_commands_part_of_a_run(run_dir, capsys, command, out, expected):
    before = snapshot(run_dir)
    source = [] if "--params" in command else [str(run_dir)]
    refused([command[0], *source, *command[1:], "--out", str(run_dir / out)], capsys, expected)
    assert snapshot(run_dir) == before and not (run_dir / "advice").exists()


def test_a_commands_own_folder_of_another_run_is_refused(run_dir, tmp_path, capsys):
    other = tmp_path / "other"
    shutil.copytree(CPU_RUN, other)
    for command in ("project", "advise", "analyze"):
        own = {"project": "projection", "advise": "advice", "analyze": "."}[command]
        refused([command, str(run_dir), "--out", str(other / own)], capsys, f"not for {str(run_dir)!r}")
    assert snapshot(other) == snapshot(CPU_RUN)


@pytest.mark.parametrize("command", ["advise", "project", "analyze", "report"])
def test_an_out_that_is_a_file_or_under_one_is_one_line(run_dir, tmp_path, capsys, command):
    (tmp_path / "afile").write_text("mine")
    for out in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        text = refused([command, str(run_dir), "--out", str(out)], capsys, "is a file, not a folder")
        assert len(text.strip().splitlines()) == 1
    assert (tmp_path / "afile").read_text() == "mine"


def test_compare_replaces_only_a_page_it_wrote_and_never_deletes_a_users_file(run_dir, tmp_path, capsys):
    lookalike = tmp_path / "site"  # a page's names, but the user's (issue 45: mine.csv was deleted)
    for name in ("index.html", "report.md", "summary.md", "plots/a.png", "tables/mine.csv"):
        (lookalike / name).parent.mkdir(parents=True, exist_ok=True)
        (lookalike / name).write_text("the user's")
    before = snapshot(lookalike)
    for command in (["compare", str(run_dir), str(CPU_RUN)], ["report", str(run_dir)]):
        refused([*command, "--out", str(lookalike)], capsys, f"did not write there ({sorted(before)[:3]}")
    assert snapshot(lookalike) == before and not (lookalike / run_folder.MARKER).exists()

    out = tmp_path / "page"
    assert call(["compare", str(run_dir), str(CPU_RUN), "--out", str(out)], capsys)[0] == 0
    written = run_folder.written_by(out)["compare"]
    assert "index.html" in written and "tables/cells.csv" in written
    # a file of an earlier page of compare's that this one no longer draws goes; the new page is whole
    (out / "plots" / "from-an-older-run.png").write_text("an earlier page's")
    (out / run_folder.MARKER).write_text(json.dumps({"compare": [*written, "plots/from-an-older-run.png"]}))
    (out / "index.html").write_text("an earlier page's")
    assert call(["compare", str(run_dir), str(CPU_RUN), "--out", str(out)], capsys)[0] == 0
    assert not (out / "plots" / "from-an-older-run.png").exists()
    assert "an earlier page" not in (out / "index.html").read_text()
    (out / "tables" / "notes.txt").write_text("the user's")
    before = snapshot(out)
    refused(["compare", str(run_dir), str(CPU_RUN), "--out", str(out)], capsys, "['tables/notes.txt']")
    assert snapshot(out) == before


# ---- 4 and 5. the what-if spec and the projection's arguments --------------------------------------------

SPEC_FLAGS = ["--step-ms", "10", "--per-gpu-batch", "4"]


@pytest.mark.parametrize(("argv", "expected"), [
    (["--params", "0", *SPEC_FLAGS], "params=0: must be an integer in [1, "),
    (["--params", "100", "--step-ms", "1e-300", "--per-gpu-batch", "4"], "step_ms=1e-300: must be"),
    (["--params", "100", "--step-ms", "inf", "--per-gpu-batch", "4"], "step_ms=inf"),
    (["--params", "100", *SPEC_FLAGS, "--world-sizes", "2000000"], "--world-sizes='2000000'"),
    (["--params", "100", *SPEC_FLAGS, "--world-sizes", "8,16,...,2097152"], "must lie in [1, 65536]"),
    (["--params", "100", *SPEC_FLAGS, "--interference", "1e300"], "interference=1e+300"),
    (["--params", "100", *SPEC_FLAGS, "--per-gpu-batch", "0"], "per_gpu_batch=0"),
])
def test_what_if_values_out_of_range(tmp_path, capsys, argv, expected):
    out = tmp_path / "p"
    refused(["project", *argv, "--out", str(out)], capsys, expected)
    assert not out.exists()


@pytest.mark.parametrize(("content", "expected"), [
    (b"\x00\xff\xfe\x80 not text", "not a UTF-8 text file"),
    (b"", "step_ms: missing"),
    (b"spec = 5\n", "spec=5 is not a table"),
    (b"params = true\nstep_ms = 10\nper_gpu_batch = 4\n", "params=True: must be an integer"),
    (b"params = 100\nstep_ms = 10\nper_gpu_batch = true\n", "per_gpu_batch=True"),
    (b"network = [5]\nparams = 100\nstep_ms = 10\nper_gpu_batch = 4\n", "network=5: must be a string"),
    (b"params = 100\nstep_ms = 10\nper_gpu_batch = 4\nworld_sizes = 8\n", "world_sizes=8: must be a list"),
    (b"bucket_sizes = [true]\nstep_ms = 10\nper_gpu_batch = 4\n", "bucket_sizes=(True,)"),
    (b"params = 100\nstep_ms = 10\nper_gpu_batch = 4\nprecision = 16\n", "precision=16: must be a string"),
])
def test_a_bad_spec_file_is_one_line_naming_its_key(tmp_path, capsys, content, expected):
    spec = tmp_path / "spec.toml"
    spec.write_bytes(content)
    out = tmp_path / "p"
    text = refused(["project", "--spec", str(spec), "--out", str(out)], capsys, expected)
    assert len(text.strip().splitlines()) == 1 and not out.exists()


def test_an_inf_throughput_is_refused_by_the_reader_not_recommended(run_dir, capsys):
    csv_text = (run_dir / "results.csv").read_text().splitlines()
    header = csv_text[0].split(",")
    row = csv_text[1].split(",")
    row[header.index("samples_per_s")] = "inf"
    (run_dir / "results.csv").write_text("\n".join([csv_text[0], ",".join(row), *csv_text[2:]]) + "\n")
    refused(["advise", str(run_dir)], capsys, "column 'samples_per_s' holds inf")
    assert not (run_dir / "advice").exists()


# ---- 4. plug-in engines: every kind of import failure, and no replacing an engine ----------------------

@pytest.mark.parametrize(("source", "expected"), [
    ("raise ValueError('at import')", "importing it raised ValueError: at import"),
    ("def broken(:\n", "importing it raised SyntaxError"),
    ("import sys\nsys.exit(3)", "importing it raised SystemExit: 3"),
    ("import no_such_module_anywhere", "importing it raised ModuleNotFoundError"),
    ("ENGINE = 5", "5 is not an instance of bench.engines.Engine"),
    ("ENGINES = 5", "ENGINES=5 is not a list of Engine instances"),
    ("ENGINES = []", "ENGINES is empty"),
    ("x = 1", "defines neither ENGINE"),
    ("from bench.engines.ddp_core_engines import DdpCore\nENGINE = DdpCore('torch', 'mine')",
     "engine 'torch' is the name of a built-in engine; a plug-in cannot replace it"),
    ("from bench.engines.ddp_core_engines import DdpCore\nENGINE = DdpCore('a b', 'mine')",
     "engine name 'a b' must be"),
    ("from bench.engines.torch_ddp import TorchDDP\nENGINE = TorchDDP('mine', 'x', reference=True)",
     "says reference=True"),
])
def test_a_plug_in_that_cannot_be_added_is_a_config_error(tmp_path, capsys, monkeypatch, source, expected):
    name = f"plugin_{hashlib.sha256(source.encode()).hexdigest()[:10]}"
    (tmp_path / f"{name}.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv(engines.PLUGIN_VARIABLE, name)
    registry, failure = engines._registry()
    monkeypatch.setattr(engines, "REGISTRY", registry)
    monkeypatch.setattr(engines, "_PLUGIN_FAILURE", failure)
    assert registry["torch"] is engines.torch_ddp.ENGINE  # the reference is never replaced
    out = tmp_path / "run"
    text = refused(["run", "--config", "cpu-smoke", "--out", str(out)], capsys, expected)
    assert f"DDPBENCH_ENGINE_MODULES='{name}'" in text and len(text.strip().splitlines()) == 1
    assert not out.exists()



def test_the_report_needs_no_plug_in(tmp_path):
    # the report reads recorded rows: its modules import whatever DDPBENCH_ENGINE_MODULES says
    env = {**os.environ, engines.PLUGIN_VARIABLE: "no_such_plugin_module"}
    proc = subprocess.run([sys.executable, "-c", "import bench.style, bench.report.plots"], env=env,
                          capture_output=True, text=True, cwd=TESTS.parent)
    assert proc.returncode == 0, proc.stderr[-2000:]


def test_a_plug_in_whose_skip_reason_raises_is_a_config_error(tmp_path, capsys, monkeypatch):
    from bench.engines.ddp_core_engines import DdpCore

    class Raising(DdpCore):
        def skip_reason(self, comm_dtype, device):
            raise RuntimeError("no idea")

    monkeypatch.setitem(engines.REGISTRY, "raising", Raising("raising", "test"))
    out = tmp_path / "run"
    refused(["run", "--config", "cpu-smoke", "--set", "matrix.engine=torch,raising", "--out", str(out)],
            capsys, "matrix.engine='raising': its skip_reason('none', 'cpu') raised RuntimeError: no idea")
    assert not out.exists()


# ---- 4 and 5. run --collect, workload.data, bench slurm ------------------------------------------------

def test_collect_names_the_plan_cell_that_lacks_a_field(tmp_path, capsys):
    out = tmp_path / "run"
    assert call(["run", "--config", "cpu-smoke", "--set", "matrix.engine=torch", "--plan-only", "--out",
                 str(out)], capsys)[0] == 0
    plan = json.loads((out / "plan.json").read_text())
    del plan["cells"][1]["world_size"]
    (out / "plan.json").write_text(json.dumps(plan))
    before = snapshot(out)
    lacks = f"cell {plan['cells'][1]['cell_id']} lacks world_size"
    text = refused(["run", "--collect", str(out)], capsys, lacks)
    assert len(text.strip().splitlines()) == 1 and snapshot(out) == before
    (out / "plan.json").write_text(json.dumps({"cells": 5}))
    refused(["run", "--collect", str(out)], capsys, "cells='5': expected the list")


def test_a_data_file_that_is_not_mrpc_is_refused_at_config_time(tmp_path, capsys):
    data = tmp_path / "train.tsv"
    data.write_text("id\tsentence\n1\thello\n")
    out = tmp_path / "run"
    refused(["run", "--config", "seeds-mrpc-cpu", "--set", f"workload.data={data}", "--out", str(out)],
            capsys, f"data='{data}': not a GLUE MRPC file ({data}:1: expected the MRPC header")
    assert not out.exists()


def get_argument(line: str) -> tuple[str | None, str]:
    """Slurm's src/sbatch/opt.c get_argument, transcribed: the next argument of an #SBATCH line and the
    rest (whitespace ends an argument; ' or " group; a backslash escapes the next character; an unquoted #
    starts a comment)."""
    i, arg, quote, escaped = 0, None, "", False
    while i < len(line) and line[i].isspace():
        i += 1
    while i < len(line) and (quote or not line[i].isspace()) and line[i] != "\n":
        c = line[i]
        if escaped:
            escaped = False
        elif c == "\\":
            escaped, i = True, i + 1
            continue
        elif quote:
            if c == quote:
                quote, i = "", i + 1
                continue
        elif c in "\"'":
            quote, i = c, i + 1
            continue
        elif c == "#":
            break
        arg = (arg or "") + c
        i += 1
    assert not quote, f"unmatched {quote} in {line!r}"
    return arg, line[i:]


def test_bench_slurm_quotes_a_folder_with_a_space_a_command_and_quotes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / 'my runs' / '$(touch pwned) "q" #1'
    rc, text = call(["slurm", "--config", "cpu-smoke", "--set", "matrix.engine=torch", "--nodes", "1",
                     "--ranks-per-node", "2", "--out", str(out)], capsys)
    assert rc == 0, text
    script = (out / "job.sbatch").read_text()
    directives = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            arg, rest = get_argument(line[len("#SBATCH"):])
            assert get_argument(rest)[0] is None  # one argument per line, nothing after it
            key, _, value = arg.partition("=")
            directives[key] = value
    assert directives["--output"] == str(out / "logs" / "slurm-%j.out")
    assert directives["--job-name"] == f"ddpbench-{out.name}"
    assert subprocess.run(["bash", "-n", str(out / "job.sbatch")]).returncode == 0
    hint = next(line for line in text.splitlines() if line.startswith("submit it: "))
    words = shlex.split(hint)
    assert words[3] == str(out / "job.sbatch") and words[-1] == str(out)
    assert not (tmp_path / "pwned").exists()


def test_bench_slurm_refuses_nodes_no_step_uses(tmp_path, capsys):
    out = tmp_path / "run"
    refused(["slurm", "--config", "cpu-smoke", "--nodes", "1000", "--out", str(out)], capsys,
            "--nodes=1000: the world sizes 1,2 use at most 2 node(s)")
    assert not out.exists()


# ---- 6. the report's Markdown, the launch logs ----------------------------------------------------------

def test_report_md_shows_html_from_the_run_as_text(tmp_path):
    from report_fixtures import row, write_run

    from bench.report import build_report

    injected = "<script>alert(1)</script>"
    rows = [row("torch", 1, 10.0), row("torch", 2, 6.0)]
    for r in rows:
        r["model_size"] = injected
    run = write_run(tmp_path / "run", rows)
    config = (run / "config.toml").read_text()
    (run / "config.toml").write_text(config.replace('description = "', f'description = "{injected} ', 1))
    index = build_report(run, tmp_path / "report")
    for name in ("report.md", "summary.md", "index.html"):
        text = (index.parent / name).read_text()
        assert injected not in text and ("&lt;script&gt;" in text or name == "summary.md"), name


def test_a_launch_log_keeps_its_head_and_tail_and_says_what_it_left_out(tmp_path):
    from bench.run import launch_log

    # 6 MiB of output in 100-byte lines, the last line the one that matters
    code = ("import sys\nfor i in range(6 * 2**20 // 100): sys.stdout.write(f'{i:099d}\\n')\n"
            "sys.stdout.write('ValueError: the cause\\n')")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    with launch_log.CappedLog(proc.stdout, tmp_path / "launch-0.out"):
        proc.wait()
    text = (tmp_path / "launch-0.out").read_text()
    size = len(text.encode())
    kept = launch_log.LOG_HEAD_BYTES + launch_log.LOG_TAIL_BYTES
    assert kept < size < kept + 300
    dropped = 6 * 2**20 // 100 * 100 + len("ValueError: the cause\n") - kept
    assert f"[bench: {dropped} bytes of this output left out here" in text
    assert text.startswith("0" * 99 + "\n") and text.endswith("ValueError: the cause\n")
    assert launch_log.tail(tmp_path / "launch-0.out").splitlines()[0] == "ValueError: the cause"


@pytest.mark.parametrize("command", ["project", "advise", "analyze", "report"])
def test_a_folder_that_takes_no_writes_is_one_line_and_left_as_it_was(run_dir, tmp_path, capsys, monkeypatch,
                                                                      command):
    # A read-only or full disk under --out: the stage cannot be made, or a file in it not written. Exit 2,
    # one line; the folders made for --out are gone, a user's folder is as it was (issue 45).
    import errno
    import tempfile

    def refused_by_the_disk(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(tempfile, "mkdtemp", refused_by_the_disk)
    out = tmp_path / "new" / "out"
    rc, text = call([command, str(run_dir), "--out", str(out)], capsys)
    assert rc == 2 and "Read-only file system" in text and "Traceback" not in text, text
    said = [line for line in text.splitlines() if "Read-only" in line]  # (analyze's progress line besides)
    assert len(said) == 1 and str(out) in said[0] and not (tmp_path / "new").exists()
