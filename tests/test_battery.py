"""The fault battery, table-driven (issue 45): each case is a command line, the exit status it must end
with, words its output must hold, and the files that must and must not exist afterwards. Every case is also
held to what every command owes a user: no traceback; a refusal (exit 2) said in one line naming the value;
every file of the user's still there, unchanged; the run folders' own files (their rows, their traces)
unchanged; every CSV, TOML and JSON written parseable; no stage folder left behind.

A command that takes --out gets the --out rule's cases (run_folder.writing: a system folder, a name too
long, a file, a symbolic link, a folder of the user's holding files of the names it writes, a part of a run
folder, a new folder, the same folder again) from OUT_COMMANDS alone: a new one fails
`test_every_command_with_out_is_in_the_battery` until it is listed there. In-process through
bench.__main__.main, on copies of a real CPU run (tests/data/traces/ddpbench-cpu-run); no rank is started.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import pytest

from bench import run_folder
from bench.__main__ import COMMANDS
from bench.__main__ import main as bench_main

TESTS = Path(__file__).parent
CPU_RUN = TESTS / "data" / "traces" / "ddpbench-cpu-run"  # a real CPU run (tests/data/traces/README.md)
# The user's files in {user}: a page's, project's, advise's and analyze's names among them
USER_FILES = {"index.html": "<html>mine</html>", "report.md": "mine", "tables/mine.csv": "a\n1\n",
              "notes.txt": "mine", "projection.csv": "a\n1\n", "advice.md": "mine", "best.toml": "a = 1\n",
              "trace_summary.csv": "a\n1\n", "plan.json": "{}", "job.sbatch": "#!/bin/sh\n"}
LONG = "x" * 300  # longer than any filesystem's name (255 bytes)
SYSTEM = Path("/etc/ddpbench-battery")  # a system folder's: as root, a command could make it


@dataclass(frozen=True)
class Case:
    """A command line ({ws} the workspace, {run}/{run2} run folders, {user} the user's folder, {link} a
    link to it, {long} a name too long), its exit status, words its output holds, paths (under {ws}) that
    must and must not exist after it, what files must contain, and commands to run first."""

    name: str
    argv: tuple[str, ...]
    code: int
    words: tuple[str, ...] = ()
    exists: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    contains: dict[str, str] = field(default_factory=dict)
    before: tuple[tuple[str, ...], ...] = ()
    setup: str | None = None  # a name in SETUPS


# ---- the --out rule, for every command that writes (run_folder.writing, run_folder.out_problem) ----------
# command → (its arguments before --out, the file a success writes into --out)
OUT_COMMANDS = {
    "report": (("report", "{run}"), "index.html"),
    "compare": (("compare", "{run}", "{run2}"), "index.html"),
    "project": (("project", "{run}"), "projection.csv"),
    "what-if": (("project", "--params", "100M", "--step-ms", "10", "--per-gpu-batch", "4"), "projection.csv"),
    "advise": (("advise", "{run}"), "best.toml"),
    "analyze": (("analyze", "{run}"), "trace_summary.csv"),
    "run": (("run", "--config", "cpu-smoke", "--plan-only", "--set", "matrix.world_size=1"), "plan.json"),
    "slurm": (("slurm", "--config", "cpu-smoke", "--nodes", "1", "--ranks-per-node", "2"), "job.sbatch"),
}
NEW_FOLDER = ("run", "slurm")  # --out is a new run folder: an existing one is refused, never written into


def out_cases() -> list[Case]:
    cases = []
    for name, (argv, written) in OUT_COMMANDS.items():
        new_only = name in NEW_FOLDER
        cases += [
            Case(f"{name}: a system folder", (*argv, "--out", str(SYSTEM)), 2,
                 (f"--out='{SYSTEM}'", "system folder")),
            Case(f"{name}: a name too long", (*argv, "--out", "{ws}/{long}/out"), 2,
                 ("a name of 300 bytes",)),
            Case(f"{name}: a file", (*argv, "--out", "{user}/notes.txt"), 2,
                 ("already exists",) if new_only else ("is a file, not a folder",)),
            Case(f"{name}: under a file", (*argv, "--out", "{user}/notes.txt/sub"), 2,
                 ("is a file, not a folder",)),
            Case(f"{name}: a symbolic link", (*argv, "--out", "{link}"), 2,
                 ("already exists",) if new_only else ("is a symbolic link",)),
            Case(f"{name}: the user's files", (*argv, "--out", "{user}"), 2,
                 ("already exists",) if new_only else ("did not write there",)),
            Case(f"{name}: a run's traces",
                 (*argv, "--out", "{run}/traces/new" if new_only else "{run}/traces"), 2,
                 ("inside the run folder",) if new_only else ("which `bench run` writes",),
                 absent=("run/traces/new",)),
            Case(f"{name}: a new folder", (*argv, "--out", "{ws}/fresh"), 0,
                 exists=(f"fresh/{written}",) + (() if new_only else (f"fresh/{run_folder.MARKER}",))),
            Case(f"{name}: again into its own", (*argv, "--out", "{ws}/fresh"), 2 if new_only else 0,
                 ("already exists",) if new_only else (), exists=(f"fresh/{written}",),
                 before=((*argv, "--out", "{ws}/fresh"),)),
        ]
    return cases


# ---- bad values and hostile inputs, each exit 2 naming the value (or a clean per-file failure) -----------
DRY = ("run", "--config", "cpu-smoke", "--dry-run")
SLURM = ("slurm", "--config", "cpu-smoke", "--nodes", "1", "--ranks-per-node", "2", "--out", "{ws}/job")
SPEC = ("project", "--params", "100M", "--step-ms", "10", "--per-gpu-batch", "4", "--out", "{ws}/wi")
CASES = out_cases() + [
    Case("run --memory-gb inf", (*DRY, "--memory-gb", "inf"), 2, ("--memory-gb=inf",)),
    Case("advise --memory-gb inf", ("advise", "{run}", "--memory-gb", "inf"), 2, ("--memory-gb=inf",),
         absent=("run/advice",)),
    Case("advise --memory-gb nan", ("advise", "{run}", "--memory-gb", "nan"), 2, ("--memory-gb=nan",)),
    Case("advise --memory-gb -1", ("advise", "{run}", "--memory-gb", "-1"), 2, ("--memory-gb=-1",)),
    Case("advise --target-gpus 0", ("advise", "{run}", "--target-gpus", "0"), 2, ("--target-gpus",)),
    Case("slurm --cpus-per-node 100000", (*SLURM, "--cpus-per-node", "100000"), 2,
         ("--cpus-per-node=100000",), absent=("job",)),
    Case("slurm --time 1-25:00:00", (*SLURM, "--time", "1-25:00:00"), 2, ("--time='1-25:00:00'",),
         absent=("job",)),
    Case("slurm --time 10:99:00", (*SLURM, "--time", "10:99:00"), 2, ("--time='10:99:00'",), absent=("job",)),
    Case("slurm --time 1-23:59:59", (*SLURM, "--time", "1-23:59:59"), 0, exists=("job/job.sbatch",)),
    Case("slurm --nodes 0", (*SLURM, "--nodes", "0"), 2, ("--nodes=0",), absent=("job",)),
    Case("debug.fault matching no cell", (*DRY, "--set", "debug.fault=crash@nomatch"), 2,
         ("debug.fault='crash@nomatch'", "matches none")),
    Case("matrix.cells matching no cell", ("run", "--config", "cpu-smoke", "--out", "{ws}/r", "--set",
                                           "matrix.cells=nomatch*"), 2, ("matrix.cells='nomatch*'",),
         absent=("r",)),
    Case("profile.cells=[", (*DRY, "--set", "profile.cells=["), 2, ("profile.cells='['",)),
    Case("matrix.world_size=[1,2", (*DRY, "--set", "matrix.world_size=[1,2"), 2,
         ("matrix.world_size='[1,2'",)),
    Case("a run folder that exists", ("run", "--config", "cpu-smoke", "--out", "{run}"), 2,
         ("already exists",)),
    Case("--resume of a folder without config", ("run", "--config", "cpu-smoke", "--resume", "--out",
                                                 "{user}"), 2, ("no config.toml",)),
    Case("analyze a garbage file", ("analyze", "{ws}/garbage.json", "--out", "{ws}/an"), 2,
         ("garbage.json: not valid JSON",), absent=("an",)),
    Case("analyze an empty file", ("analyze", "{ws}/empty.json", "--out", "{ws}/an"), 2,
         ("empty.json: not valid JSON (empty)",), absent=("an",)),
    Case("analyze a cut file", ("analyze", "{ws}/cut.json", "--out", "{ws}/an"), 2,
         ("cut.json: not valid JSON (unterminated traceEvents array",), absent=("an",)),
    Case("analyze JSON that is no trace", ("analyze", "{ws}/other.json", "--out", "{ws}/an"), 2,
         ("no 'traceEvents' list",), absent=("an",)),
    Case("analyze a gzip bomb", ("analyze", "{ws}/bomb.json.gz", "--out", "{ws}/an"), 2,
         ("not a profiler trace: one value longer than",), absent=("an",), setup="bomb"),
    Case("analyze a folder without traces", ("analyze", "{ws}/nothing-here", "--out", "{ws}/an"), 2,
         ("no *.json or *.json.gz trace files",), absent=("an",)),
    Case("analyze --workers 0", ("analyze", "{run}", "--workers", "0"), 2, ("--workers 0",)),
    Case("analyze a run with a corrupt trace", ("analyze", "{run}"), 1, ("not valid JSON",),
         exists=("run/trace_summary.csv",), setup="corrupt_trace"),
    Case("report of a partial analysis", ("report", "{run}", "--out", "{ws}/page"), 0,
         contains={"page/index.html": "Partial analysis: `bench analyze` read 5 of 6 trace files"},
         before=(("analyze", "{run}"),), setup="corrupt_trace"),
    Case("what-if lists of 1,600 combinations", (*SPEC, "--bucket-cap-mb", ",".join(map(str, range(1, 201))),
                                                  "--grad-accum", "1,2,3,4,5,6,7,8"), 2,
         ("1600 combinations; at most 1000",), absent=("wi",)),
    Case("what-if over a list of networks", (*SPEC, "--network", "h100-nvlink,a100-nvlink"), 0,
         ("2 what-ifs: network",), exists=("wi/projection.csv",)),
    Case("project an unknown network", ("project", "{run}", "--network", "nope"), 2, ("network='nope'",),
         absent=("run/projection",)),
    Case("project --world-sizes 0", ("project", "{run}", "--world-sizes", "0"), 2, ("--world-sizes",)),
    Case("advise through a symlinked advice/", ("advise", "{run}"), 2, ("is a symbolic link",),
         setup="advice_link"),
    Case("advise into the run's projection/", ("advise", "{run}", "--out", "{run}/projection"), 2,
         ("which `bench project` writes",), absent=("run/projection",)),
    Case("project into the run's advice/", ("project", "{run}", "--out", "{run}/advice"), 2,
         ("which `bench advise` writes",), absent=("run/advice",)),
    Case("report into the run folder", ("report", "{run}", "--out", "{run}"), 2, ("itself",)),
    Case("analyze into another run", ("analyze", "{run}", "--out", "{run2}"), 2, ("another run's files",)),
    Case("advise, a run named with a newline and a quote", ("advise", "{odd}"), 0,
         exists=("odd\nname\"/advice/best.toml",), setup="odd_name"),
    Case("advise then report: the page links the advice", ("report", "{run}", "--out", "{ws}/page"), 0,
         exists=("page/index.html", "page/tables/advice.csv"), before=(("advise", "{run}"),)),
    Case("compare one run", ("compare", "{run}", "--out", "{ws}/page"), 2, ("at least two",),
         absent=("page",)),
    Case("report a missing run", ("report", "{ws}/nothing", "--out", "{ws}/page"), 2, ("nothing",),
         absent=("page",)),
    Case("tensorboard --port 99999", ("tensorboard", "{run}", "--port", "99999"), 2, ("must be between 0",)),
]


def _bomb(ws: Path) -> None:
    """A 40 KB gzip holding one 40 MB event (past bench.analyze.trace_text.MAX_VALUE_CHARS)."""
    with gzip.open(ws / "bomb.json.gz", "wb", compresslevel=1) as f:
        f.write(b'{"traceEvents": [{"name": "')
        for _ in range(40):
            f.write(b"a" * 2**20)
        f.write(b'"}]}')


def _corrupt_trace(ws: Path) -> None:
    victim = sorted((ws / "run" / "traces").glob("overlap-*/rank1.*"))[0]
    victim.write_bytes(gzip.compress(b"garbage"))


def _advice_link(ws: Path) -> None:
    (ws / "elsewhere").mkdir()
    (ws / "run" / "advice").symlink_to(ws / "elsewhere")


def _odd_name(ws: Path) -> None:
    shutil.copytree(CPU_RUN, ws / "odd\nname\"")


SETUPS = {"bomb": _bomb, "corrupt_trace": _corrupt_trace, "advice_link": _advice_link, "odd_name": _odd_name}


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` → its content's hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


@pytest.fixture
def ws(tmp_path, monkeypatch):
    """The workspace: two run folders, the user's folder and a link to it, hostile trace files; the
    current folder (where default outputs go)."""
    for name in ("run", "run2"):
        shutil.copytree(CPU_RUN, tmp_path / name)
    for rel, text in USER_FILES.items():
        (tmp_path / "user" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "user" / rel).write_text(text)
    (tmp_path / "link").symlink_to(tmp_path / "user")
    (tmp_path / "garbage.json").write_text("garbage")
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "cut.json").write_text('{"traceEvents": [{"name": "a", "ts": 1')
    (tmp_path / "other.json").write_text('{"events": []}')
    (tmp_path / "nothing-here").mkdir()
    monkeypatch.chdir(tmp_path)
    assert not SYSTEM.exists()
    yield tmp_path
    if SYSTEM.exists():  # a case made it: take it away, the case has failed
        shutil.rmtree(SYSTEM)


def filled(argv, ws: Path) -> list[str]:
    values = {"ws": str(ws), "run": str(ws / "run"), "run2": str(ws / "run2"), "user": str(ws / "user"),
              "link": str(ws / "link"), "long": LONG, "odd": str(ws / "odd\nname\"")}
    return [a.format(**values) for a in argv]


def call(argv: list[str], capsys) -> tuple[int, str]:
    try:
        rc = bench_main(argv)
    except SystemExit as exc:  # argparse's own refusals
        rc = exc.code
    captured = capsys.readouterr()
    return rc, captured.out + captured.err


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_battery(case: Case, ws, capsys):
    if case.setup:
        SETUPS[case.setup](ws)
    for argv in case.before:
        call(filled(argv, ws), capsys)
    user, runs = snapshot(ws / "user"), {n: snapshot(ws / n) for n in ("run", "run2")}
    rc, text = call(filled(case.argv, ws), capsys)
    assert rc == case.code, text[-2000:]
    assert "Traceback" not in text, text[-2000:]
    for words in case.words:
        assert words in text, text[-2000:]
    if case.code == 2 and case.words:  # one line says it all, naming the value
        assert any(all(w in line for w in case.words) for line in text.splitlines()), text[-2000:]
    for rel in case.exists:
        assert (ws / rel).exists(), rel
    for rel in case.absent:
        assert not (ws / rel).exists(), rel
    for rel, words in case.contains.items():
        assert words in (ws / rel).read_text(), rel
    assert snapshot(ws / "user") == user  # not one of the user's files lost or changed
    for name, before in runs.items():  # a run's own files (rows, traces) never rewritten
        after = snapshot(ws / name)
        assert {k: v for k, v in after.items() if k in before} == before
    assert not list(ws.rglob(f"{run_folder.STAGE_PREFIX}*"))
    assert not SYSTEM.exists()
    for path in ws.rglob("*"):
        if path.is_file() and not path.is_relative_to(ws / "user") and path.name not in (
                "garbage.json", "empty.json", "cut.json", "other.json"):
            parseable(path)


def parseable(path: Path) -> None:
    """A CSV, TOML or JSON file the commands wrote reads back."""
    if path.suffix == ".csv" and path.stat().st_size:
        pd.read_csv(path)
    elif path.suffix == ".toml":
        tomllib.loads(path.read_text())
    elif path.suffix == ".json" and path.parent.name != "traces" and "traces" not in path.parts:
        json.loads(path.read_text())


def test_every_command_with_out_is_in_the_battery():
    """A command that takes --out is listed in OUT_COMMANDS, so the --out rule's cases cover it."""
    import argparse
    import importlib

    listed = {argv[0] for argv, _ in OUT_COMMANDS.values()}
    for name, (module_name, prefix, _) in COMMANDS.items():
        parser = argparse.ArgumentParser()
        getattr(importlib.import_module(module_name), prefix + "add_arguments")(parser)
        takes_out = any("--out" in a.option_strings for a in parser._actions)
        assert not takes_out or name in listed, f"`bench {name}` takes --out: add it to OUT_COMMANDS"


def test_a_run_without_traces_says_so_once(tmp_path, capsys, monkeypatch):
    # First contact: `bench run --report` on a run without traces printed "`bench analyze` failed
    # (AnalyzeInputError ...)". It says once that there is nothing to analyse, and the report goes on.
    from bench.run import pipeline

    run = tmp_path / "run"
    shutil.copytree(CPU_RUN, run)
    shutil.rmtree(run / "traces")
    rows = pd.read_csv(run / "results.csv", dtype=str, keep_default_na=False)
    rows.assign(trace_dir="").to_csv(run / "results.csv", index=False)
    monkeypatch.chdir(tmp_path)
    assert pipeline.after_run(run) == 0
    text = capsys.readouterr()
    said = text.out + text.err
    assert "failed" not in said and "AnalyzeInputError" not in said
    assert said.count("no traces to analyse") == 1
    page = (tmp_path / "reports" / "run" / "index.html").read_text()
    assert "This run recorded no profiler traces" in page


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
