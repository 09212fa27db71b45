"""scripts/setup_env.py: which Python, never replacing an installed torch, the pinned build when none.

Most tests run set-up's main() against a stand-in interpreter: a script that answers the probe from a
state file and logs the pip commands it is given (installing nothing). The probe itself runs for real on
this interpreter and on temporary venvs, one without torch and one that sees this interpreter's torch.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement

from bench import envinfo

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("setup_env", ROOT / "scripts" / "setup_env.py")
setup_env = importlib.util.module_from_spec(_spec)
sys.modules["setup_env"] = setup_env  # dataclasses look their module up by name
_spec.loader.exec_module(setup_env)

FAKE = '''#!{python}
"""Stand-in interpreter: answers set-up's probe from state.json; logs pip calls, installing nothing."""
import json, sys
from pathlib import Path

here = Path(__file__).resolve().parent
state = json.loads((here / "state.json").read_text())
if sys.argv[1] == "-c":
    sys.stderr.write(state.get("probe_stderr", ""))
    print(json.dumps(state["info"]))
    sys.exit(state.get("probe_rc", 0))
args = sys.argv[4:]  # after -m pip install
call = {{"args": args}}
if "-c" in args:
    call["constraint"] = Path(args[args.index("-c") + 1]).read_text()
with open(here / "pip-calls.jsonl", "a") as f:
    f.write(json.dumps(call) + "\\n")
if any(a.startswith("torch") for a in args):  # pip installing TORCH_SPEC: the CPU wheel
    state["info"]["torch"] = state["wheel"]
if "-e" in args:
    state["info"]["ddp_core"] = "ddp_core"
(here / "state.json").write_text(json.dumps(state))
'''

CPU_WHEEL = {"version": "2.13.0+cpu", "dist_version": "2.13.0+cpu", "cuda": None, "hip": None, "xpu": None,
             "nccl": None, "location": "/env/lib/python3.11/site-packages/torch"}
CUDA_215 = {"version": "2.15.0+cu128", "dist_version": "2.15.0", "cuda": "12.8", "hip": None, "xpu": None,
            "nccl": "2.27.3", "location": "/usr/local/lib/python3.12/site-packages/torch"}


def fake_python(tmp_path: Path, torch_info: dict | None, version: str = "3.12.3", dists: dict | None = None,
                **state) -> Path:
    """An executable stand-in interpreter whose prefix is tmp_path/env; `dists`: what its probe says is
    installed (None: a probe that does not say, as before set-up asked)."""
    env = tmp_path / "env"
    env.mkdir(parents=True)
    python = env / "python"
    python.write_text(FAKE.format(python=sys.executable))
    python.chmod(0o755)
    info = {"executable": str(python), "version": version, "prefix": str(env), "torch": torch_info,
            "ddp_core": None, **({"dists": dists} if dists is not None else {})}
    (env / "state.json").write_text(json.dumps({"info": info, "wheel": CPU_WHEEL, **state}))
    return python


def pip_calls(python: Path) -> list[dict]:
    log = python.parent / "pip-calls.jsonl"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


ANNOUNCED: list[str] = []  # the last run's "setup: <what it is about to do> ..." lines (stderr)


def run_setup(python: Path, capsys, *extra: str) -> tuple[int, str, str]:
    """(exit code, stdout, stderr less the announcements, which land in ANNOUNCED)."""
    rc = setup_env.main(["--python", str(python), *extra])
    out, err = capsys.readouterr()
    lines = err.splitlines(keepends=True)
    ANNOUNCED[:] = [x for x in lines if x.startswith("setup: ") and x.rstrip().endswith("...")]
    return rc, out, "".join(x for x in lines if x not in ANNOUNCED)


@pytest.fixture(autouse=True)
def _no_torch_spec(monkeypatch):
    monkeypatch.delenv("TORCH_SPEC", raising=False)


def test_pyproject_torch_range_admits_current_releases():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    (req,) = [r for r in map(Requirement, project["dependencies"]) if r.name == "torch"]
    for version in ["2.9.0", "2.13.0", "2.13.0+cpu", "2.14.0", "2.14.1", "2.15.0", "2.15.0+cu128"]:
        assert req.specifier.contains(version), (version, str(req.specifier))
    assert not req.specifier.contains("2.8.1")  # no fp32_precision TF32 flags before 2.9
    assert setup_env.project_ranges()[0] == req.specifier


def test_installed_torch_is_pinned_and_never_reinstalled(tmp_path, capsys):
    python = fake_python(tmp_path, CUDA_215)
    rc, out, err = run_setup(python, capsys)
    assert (rc, err) == (0, "")
    (call,) = pip_calls(python)
    assert call["constraint"] == "torch==2.15.0\n"  # the distribution version pip sees, not __version__
    assert call["args"][-2:] == ["-e", str(ROOT)]  # the runtime only: `make bench`
    assert not [a for a in call["args"] if a.startswith("torch")]
    assert out.count("\n") == 1
    assert f"setup: {python} (Python 3.12.3) · torch 2.15.0+cu128 (CUDA 12.8 build, already installed)" in out
    assert "NCCL 2.27.3 · ddpbench installed" in out
    record = json.loads((python.parent / setup_env.RECORD).read_text())
    assert (record["torch"], record["build"], record["nccl"]) == ("2.15.0+cu128", "CUDA 12.8", "2.27.3")
    assert record["torch_source"] == "already installed"

    rc, out, _ = run_setup(python, capsys)  # the stamp makes the second run a no-op
    assert rc == 0 and len(pip_calls(python)) == 1 and out.rstrip().endswith("ddpbench up to date")


def test_without_torch_installs_the_pinned_cpu_build_first(tmp_path, capsys):
    python = fake_python(tmp_path, None)
    rc, out, err = run_setup(python, capsys)
    assert (rc, err) == (0, "")
    torch_call, project_call = pip_calls(python)
    assert torch_call["args"][-1] == "torch==2.13.0"
    assert project_call["constraint"] == "torch==2.13.0+cpu\n"
    assert "torch 2.13.0+cpu (CPU build, installed now)" in out and "NCCL none" in out
    # said before pip starts: what is installed, and that it is the long step
    assert "has no torch: installing torch==2.13.0 with pip" in ANNOUNCED[0] and "long step" in ANNOUNCED[0]
    assert "installing ddpbench" in ANNOUNCED[1]
    record_path = python.parent / setup_env.RECORD
    assert json.loads(record_path.read_text())["torch_source"] == "installed now"

    rc, out, _ = run_setup(python, capsys)
    assert rc == 0 and len(pip_calls(python)) == 2 and "already installed" in out
    assert json.loads(record_path.read_text())["torch_source"] == "installed now"  # provenance kept


def test_torch_spec_overrides_the_pin_only_when_no_torch(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TORCH_SPEC", "torch==2.14.1")
    python = fake_python(tmp_path, None)
    assert run_setup(python, capsys)[0] == 0
    assert pip_calls(python)[0]["args"][-1] == "torch==2.14.1"

    python = fake_python(tmp_path / "second", CUDA_215)
    rc, out, _ = run_setup(python, capsys)
    assert rc == 0 and "TORCH_SPEC=torch==2.14.1 unused" in out
    assert pip_calls(python)[0]["constraint"] == "torch==2.15.0\n"


def test_torch_below_the_lower_bound_is_a_clear_error(tmp_path, capsys):
    old = CUDA_215 | {"version": "2.8.0+cu126", "dist_version": "2.8.0", "cuda": "12.6"}
    python = fake_python(tmp_path, old)
    rc, out, err = run_setup(python, capsys)
    assert (rc, out) == (2, "")
    assert err.count("\n") == 1 and "torch 2.8.0+cu126" in err and "torch>=2.9" in err
    assert pip_calls(python) == [] and not (python.parent / setup_env.RECORD).exists()


@pytest.mark.parametrize("torch_info, state, expected", [
    (CUDA_215, {}, "Python 3.10.12; ddpbench needs Python >=3.11"),
    (CUDA_215 | {"dist_version": None}, {}, "pip sees no installed distribution"),
    (None, {"probe_rc": 1, "probe_stderr": "ImportError: libcudart.so.12: cannot open shared object file\n"},
     "fails the probe (it imports torch): ImportError: libcudart.so.12"),
])
def test_unusable_interpreters_are_refused_before_any_install(tmp_path, capsys, torch_info, state, expected):
    version = "3.10.12" if "3.10" in expected else "3.12.3"
    python = fake_python(tmp_path, torch_info, version=version, **state)
    rc, out, err = run_setup(python, capsys)
    assert rc == 2 and expected in err and pip_calls(python) == []


def running(tmp_path: Path, torch_dir: str | None = None, in_venv: bool = False):
    base = tmp_path / "base"
    prefix = tmp_path / "venv" if in_venv else base
    return setup_env.Running(Path("/usr/bin/python3"), prefix, base, torch_dir)


def test_choose_target_order(tmp_path, monkeypatch):
    venv = tmp_path / ".venv"
    plain = running(tmp_path)
    assert setup_env.choose_target(sys.executable, {"VIRTUAL_ENV": "/v"}, plain, venv).why == "PYTHON="
    monkeypatch.chdir(tmp_path)  # a relative PYTHON= becomes absolute (the probe runs from /), unresolved
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    assert setup_env.choose_target("bin/python", {}, plain, venv).python == tmp_path / "bin" / "python"
    with pytest.raises(setup_env.SetupError, match="PYTHON=/no/python: no such interpreter"):
        setup_env.choose_target("/no/python", {}, plain, venv)
    assert setup_env.choose_target(None, {"VIRTUAL_ENV": "/v"}, plain, venv).python == Path("/v/bin/python")
    assert setup_env.choose_target(None, {"CONDA_PREFIX": "/c"}, plain, venv).python == Path("/c/bin/python")
    assert setup_env.choose_target(None, {}, running(tmp_path, in_venv=True), venv).python == plain.executable

    # No ./.venv: created isolated when python3 has no torch (CI), seeing python3's packages when it has one.
    target = setup_env.choose_target(None, {}, plain, venv)
    assert (target.python, target.create, target.system_site) == (venv / "bin" / "python", True, False)
    assert "--system-site-packages" not in setup_env.venv_command(target, plain)
    with_torch = running(tmp_path, torch_dir="/usr/lib/python3/dist-packages/torch")
    target = setup_env.choose_target(None, {}, with_torch, venv)
    assert target.system_site and "--system-site-packages" in setup_env.venv_command(target, with_torch)

    # An existing ./.venv made without the system's packages hides python3's torch: set-up says so.
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    assert setup_env.choose_target(None, {}, with_torch, venv).hidden_torch == with_torch.torch_dir
    (venv / "pyvenv.cfg").write_text("include-system-site-packages = true\n")
    assert setup_env.choose_target(None, {}, with_torch, venv).hidden_torch is None


def test_probe_of_this_interpreter():
    info = setup_env.probe(Path(sys.executable))
    t = info["torch"]
    assert (t["version"], t["location"]) == (torch.__version__, os.path.dirname(torch.__file__))
    assert t["dist_version"] == importlib.metadata.version("torch")
    if torch.version.cuda or not torch.version.hip:
        assert setup_env.build(t) == (f"CUDA {torch.version.cuda}" if torch.version.cuda else "CPU")
    assert (t["nccl"] is None) == (not torch.distributed.is_nccl_available())


def test_probe_and_plan_on_real_venvs(tmp_path):
    """A venv without torch gets the pin; one that sees a torch gets it pinned and nothing installed."""
    torch_range, python_range = setup_env.project_ranges()
    for name in ("bare", "sees-torch"):
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / name)], check=True)
    site = tmp_path / "sees-torch" / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    (site / "site-packages" / "torch-here.pth").write_text(str(Path(torch.__file__).parent.parent) + "\n")

    bare = setup_env.probe(tmp_path / "bare" / "bin" / "python")
    assert bare["torch"] is None
    plan = setup_env.plan(bare, setup_env.DEFAULT_TORCH_SPEC, torch_range, python_range, stamp_current=False)
    assert (plan.install_torch, plan.constraint) == ("torch==2.13.0", None)

    seen = setup_env.probe(tmp_path / "sees-torch" / "bin" / "python")
    assert seen["torch"]["version"] == torch.__version__
    plan = setup_env.plan(seen, setup_env.DEFAULT_TORCH_SPEC, torch_range, python_range, stamp_current=False)
    assert plan.install_torch is None and plan.install_project
    assert plan.constraint == f"torch=={importlib.metadata.version('torch')}"


def test_envinfo_reads_the_record_for_the_torch_it_describes(tmp_path):
    assert envinfo.SETUP_RECORD == setup_env.RECORD
    info = {"executable": "/env/bin/python", "version": "3.11.7", "prefix": str(tmp_path), "torch": CPU_WHEEL}
    record = setup_env.new_record(info, setup_env.INSTALLED, previous=None)
    (tmp_path / setup_env.RECORD).write_text(json.dumps(record))
    assert envinfo.setup_record(tmp_path, torch_version="2.13.0+cpu")["torch_source"] == "installed now"
    assert envinfo.setup_record(tmp_path, torch_version="2.15.0+cu128") is None  # torch changed since
    assert envinfo.setup_record(tmp_path / "elsewhere") is None  # set-up never ran there
    assert "torch_source" in envinfo.collect("cpu", "gloo", ["test"])


def test_print_python_runs_no_probe():
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "setup_env.py"), "--print-python"],
                         capture_output=True, text=True, env=env, check=True, timeout=10)
    # this interpreter is a virtualenv, so set-up would install into it
    assert out.stdout.strip() == sys.executable


# ---- which extras, and a node without a package index (issue 42 item 8) ------------------------------------

def test_the_runtime_for_bench_the_dev_extras_for_the_suite_each_stamped(tmp_path, capsys):
    python = fake_python(tmp_path, CUDA_215)
    assert run_setup(python, capsys)[0] == 0
    assert run_setup(python, capsys, "--extras", "dev")[0] == 0  # the runtime's stamp does not cover dev
    assert run_setup(python, capsys, "--extras", "dev")[0] == 0  # now it does: no pip
    assert run_setup(python, capsys)[0] == 0  # nor for the runtime
    assert [c["args"][-1] for c in pip_calls(python)] == [str(ROOT), f"{ROOT}[dev]"]
    assert run_setup(python, capsys, "--extras", "everything")[0] == 2
    # the Makefile: `make bench` sets up the runtime, `make test` the dev extras, `make gpu-check` pytest
    plain = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}  # in make

    def setup_line(target: str) -> str:
        dry = subprocess.run(["make", "-n", "--no-print-directory", target], cwd=ROOT, env=plain,
                             capture_output=True, text=True).stdout
        return next(line for line in dry.splitlines() if "setup_env.py" in line)

    dry = {t: setup_line(t) for t in ("bench", "test", "lint", "gpu-check")}
    assert "--extras" not in dry["bench"] and dry["test"].endswith("--extras dev")
    assert dry["lint"].endswith("--extras dev") and dry["gpu-check"].endswith("--extras gpu-check")


# What the H200 of issue 42 had: torch 2.11 (CUDA 13.0), pandas, matplotlib, tensorboard; no msgspec, no
# setuptools to build with, and no network.
CUDA_211 = CUDA_215 | {"version": "2.11.0+cu130", "dist_version": "2.11.0", "cuda": "13.0", "nccl": "2.28.9"}
H200_DISTS = {"numpy": "2.1.2", "pandas": "2.2.3", "msgspec": None, "matplotlib": "3.9.2",
              "tensorboard": "2.18.0", "torch-tb-profiler": "0.4.3", "setuptools": None}


@pytest.fixture
def no_index(monkeypatch):
    """pip configured with one index that refuses connections (port 9, discard: nothing listens)."""
    for var in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_CONSTRAINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")


def test_a_node_without_an_index_names_what_is_missing_and_how_to_bring_it(tmp_path, capsys, no_index):
    python = fake_python(tmp_path, CUDA_211, dists=H200_DISTS)
    rc, out, err = run_setup(python, capsys)
    assert (rc, out) == (2, "") and pip_calls(python) == []  # nothing installed, torch untouched
    assert f"{python} lacks msgspec>=0.22, and no package index answers here (tried " \
           "http://127.0.0.1:9/simple). Nothing was installed; its torch 2.11.0+cu130 stays as it is" in err
    assert "`python3 -m pip download --dest wheels 'msgspec>=0.22' 'setuptools>=68'`" in err
    assert "`make setup WHEELS=wheels`" in err and "same Python (3.12.3)" in err

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    rc, out, err = run_setup(python, capsys, "--wheels", str(wheels))
    assert (rc, err) == (0, "")
    (call,) = pip_calls(python)
    assert call["args"][2:5] == ["--no-index", "--find-links", str(wheels)]  # that folder, nothing else
    assert call["constraint"] == "torch==2.11.0\n" and call["args"][-2:] == ["-e", str(ROOT)]
    assert not [a for a in call["args"] if a.startswith("torch")]
    assert "torch 2.11.0+cu130 (CUDA 13.0 build, already installed)" in out
    rc, out, _ = run_setup(python, capsys)  # stamped: nothing to do, no index needed
    assert rc == 0 and len(pip_calls(python)) == 1 and out.rstrip().endswith("ddpbench up to date")
    assert run_setup(python, capsys, "--wheels", str(tmp_path / "nowhere"))[0] == 2  # a typo is not ignored


def test_a_node_without_an_index_that_has_everything_installs_the_checkout_with_no_download(
        tmp_path, capsys, no_index):
    have = H200_DISTS | {"msgspec": "0.19.0"}  # too old: named with its bound
    python = fake_python(tmp_path, CUDA_211, dists=have)
    rc, _, err = run_setup(python, capsys, "--extras", "gpu-check")
    assert rc == 2 and "lacks msgspec>=0.22, pytest>=8, pytest-timeout>=2.2 (gpu-check extras)" in err
    python = fake_python(tmp_path / "b", CUDA_211, dists=have | {"msgspec": "0.22.0", "setuptools": "80.9.0"})
    rc, out, err = run_setup(python, capsys)
    assert (rc, err) == (0, "")
    (call,) = pip_calls(python)
    assert call["args"][2:5] == ["--no-index", "--no-build-isolation", "--no-deps"]
    python = fake_python(tmp_path / "c", CUDA_211, dists=have | {"msgspec": "0.22.0"})  # no setuptools either
    rc, out, err = run_setup(python, capsys)
    assert rc == 0 and pip_calls(python) == [] and "ddpbench runs from this checkout" in out


def test_index_reachability():
    assert setup_env.reachable(f"file://{ROOT}") and setup_env.reachable(str(ROOT))
    assert not setup_env.reachable("file:///no/such/index") and not setup_env.reachable("/no/such/wheels")
    assert not setup_env.reachable("http://127.0.0.1:9/simple", timeout_s=2)
