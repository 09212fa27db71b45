"""Idempotent set-up: install ddpbench into the Python it will run with, around the torch already there.

Which Python, the first that applies: `--python PATH` (`make setup PYTHON=PATH`); the active virtualenv or
conda env; python3 itself when it is a virtualenv; else ./.venv, created with `--system-site-packages` when
python3 can import torch, so a container's, conda's or a cluster module's CUDA build is reused.

torch: an installed torch is never replaced, upgraded or downgraded. It must satisfy pyproject's range
(else a one-line error, exit 2), and the project is installed under a pip constraint pinning it, so pip
resolves everything else around it. Only when no torch imports does set-up install one, `TORCH_SPEC`
(default torch==2.13.0: a CPU build from a CPU-only machine's local wheels), never the open range, which
pip resolves to several GB of CUDA wheels.

What it installs: ddpbench and its runtime dependencies (`make bench`), plus an extra of pyproject.toml's
where asked (`--extras dev`: `make test`, `make lint`; `--extras gpu-check`: `make gpu-check`).

Without a package index (a cluster's compute node): set-up first asks the interpreter which requirements
it already satisfies. Nothing missing: the project is installed from this checkout with no download (or,
without setuptools, run from it as it is). Something missing: it names exactly what, and how to bring it —
`pip download` into a folder on a machine with network (a login node), then `make setup WHEELS=dir`, which
installs from that folder only (`pip --no-index --find-links`). The node's torch is never touched.

A stamp keyed on pyproject.toml and the extras installed makes a second run a no-op. A record in the
environment's prefix (`.ddpbench-setup.json`) says where its torch came from; bench.envinfo copies that into
env.json.
Prints one line: which Python, which torch (version, build), which NCCL, where torch came from.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv"
STAMP = ".ddpbench-setup-stamp"  # in the environment's prefix: sha256 of the pyproject.toml installed
RECORD = ".ddpbench-setup.json"  # in the environment's prefix: read by bench.envinfo.setup_record
DEFAULT_TORCH_SPEC = "torch==2.13.0"
EXTRAS = ("dev", "gpu-check")  # pyproject.toml's optional dependencies set-up installs on request
BUILD_BACKEND = "setuptools>=68"  # pyproject.toml [build-system]: what an install from the checkout needs
DEFAULT_INDEX = "https://pypi.org/simple"
INDEX_TIMEOUT_S = 5.0  # a package index that does not answer in this long counts as unreachable
FOUND, INSTALLED = "already installed", "installed now"  # torch_source: the torch was there / set-up put it

# Runs in the target interpreter. A torch that fails to import for any reason but its absence is an error
# (the traceback reaches set-up's message), never a reason to install another one over it.
PROBE = r"""
import importlib.metadata, json, os, platform, sys
info = {"executable": sys.executable, "version": platform.python_version(), "prefix": sys.prefix,
        "torch": None, "ddp_core": None}
try:
    import torch
except ModuleNotFoundError as e:
    if e.name != "torch":
        raise
else:
    try:
        dist = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        dist = None
    nccl = None
    if torch.distributed.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    info["torch"] = {"version": torch.__version__, "dist_version": dist, "cuda": torch.version.cuda,
                     "hip": torch.version.hip, "xpu": getattr(torch.version, "xpu", None), "nccl": nccl,
                     "location": os.path.dirname(torch.__file__)}
if importlib.util.find_spec("ddp_core") is not None:
    info["ddp_core"] = os.path.dirname(importlib.util.find_spec("ddp_core").origin)
info["dists"] = {}
for name in sys.argv[1:]:  # the distributions set-up needs: their installed versions (None: not installed)
    try:
        info["dists"][name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        info["dists"][name] = None
print(json.dumps(info))
"""


class SetupError(Exception):
    """Set-up cannot go on; the message says why and what to do (exit 2, nothing installed)."""


@dataclass(frozen=True)
class Running:
    """The interpreter running this script (python3 from the Makefile)."""

    executable: Path
    prefix: Path
    base_prefix: Path
    torch_dir: str | None  # where its torch package lies, found without importing it


@dataclass(frozen=True)
class Target:
    """The interpreter set-up installs into, and why that one."""

    python: Path
    why: str
    create: bool = False  # ./.venv does not exist yet
    system_site: bool = False  # create ./.venv with python3's packages visible (python3 has torch)
    hidden_torch: str | None = None  # python3's torch, which an existing isolated ./.venv does not see


@dataclass(frozen=True)
class Plan:
    """What set-up does to a probed interpreter."""

    install_torch: str | None  # a requirement for pip: only when no torch imports
    constraint: str | None  # "torch==<installed distribution>", given to pip with the project
    install_project: bool  # the stamp is stale or ddp_core does not import
    missing: list[str] | None = None  # requirements the interpreter does not satisfy (None: not probed)


def running_interpreter() -> Running:
    spec = importlib.util.find_spec("torch")
    torch_dir = spec.submodule_search_locations[0] if spec and spec.submodule_search_locations else None
    return Running(Path(sys.executable), Path(sys.prefix), Path(sys.base_prefix), torch_dir)


def isolated_venv(venv: Path) -> bool:
    """True when `venv` was created without --system-site-packages (its pyvenv.cfg says so)."""
    for line in (venv / "pyvenv.cfg").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "include-system-site-packages":
            return value.strip().lower() != "true"
    return True


def choose_target(explicit: str | None, environ: Mapping[str, str], running: Running,
                  venv: Path = VENV) -> Target:
    """The interpreter to install into (see the module docstring for the order)."""
    if explicit:
        found = shutil.which(explicit)
        if found is None:
            raise SetupError(f"PYTHON={explicit}: no such interpreter")
        # absolute, but not resolved: a venv's python is a symlink to its base interpreter
        return Target(Path(os.path.abspath(found)), "PYTHON=")
    active = environ.get("VIRTUAL_ENV") or environ.get("CONDA_PREFIX")
    if active:
        same = running.prefix.resolve() == Path(active).resolve()
        return Target(running.executable if same else Path(active) / "bin" / "python", "active environment")
    if running.prefix != running.base_prefix:
        return Target(running.executable, "python3's virtualenv")
    python = venv / "bin" / "python"
    if not python.exists():
        return Target(python, "./.venv", create=True, system_site=running.torch_dir is not None)
    hidden = running.torch_dir if isolated_venv(venv) else None
    return Target(python, "./.venv", hidden_torch=hidden)


def venv_command(target: Target, running: Running) -> list[str]:
    """Create ./.venv; with python3's packages visible when python3 has torch, so that torch is reused."""
    system = ["--system-site-packages"] if target.system_site else []
    return [str(running.executable), "-m", "venv", *system, str(target.python.parent.parent)]


def probe(python: Path, names: list[str] = ()) -> dict:
    """Python version, prefix, torch (version, distribution, build, NCCL, location), ddp_core of `python`,
    and the installed version of each distribution in `names` (`dists`).

    Runs from / so that a checkout in the working directory does not pass for an installed ddp_core.
    """
    out = subprocess.run([str(python), "-c", PROBE, *names], capture_output=True, text=True, cwd="/")
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise SetupError(f"{python} fails the probe (it imports torch): {last}")
    return json.loads(out.stdout)


def project_ranges(pyproject: Path = ROOT / "pyproject.toml"):
    """(torch specifier, requires-python specifier) from pyproject.toml, their single source."""
    import tomllib

    try:  # `packaging` where installed; pip's vendored copy otherwise (every interpreter here has pip)
        from packaging.requirements import Requirement
        from packaging.specifiers import SpecifierSet
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
        from pip._vendor.packaging.specifiers import SpecifierSet

    project = tomllib.loads(pyproject.read_text())["project"]
    (torch,) = [r for r in map(Requirement, project["dependencies"]) if r.name == "torch"]
    return torch.specifier, SpecifierSet(project["requires-python"])


def _packaging():
    try:  # `packaging` where installed; pip's vendored copy otherwise (every interpreter here has pip)
        from packaging.requirements import Requirement
    except ImportError:
        from pip._vendor.packaging.requirements import Requirement
    return Requirement


def requirements(extras: list[str], pyproject: Path = ROOT / "pyproject.toml") -> list:
    """pyproject.toml's runtime dependencies but torch, and those of each of `extras` (Requirement objects,
    one per distribution)."""
    import tomllib

    Requirement = _packaging()
    project = tomllib.loads(pyproject.read_text())["project"]
    texts = list(project["dependencies"])
    for extra in extras:
        texts += project.get("optional-dependencies", {}).get(extra, [])
    out = {}
    for req in map(Requirement, texts):
        if req.name != "torch":
            out.setdefault(req.name, req)
    return list(out.values())


def unmet(info: dict, reqs: list) -> list[str] | None:
    """The requirements `info` (a probe) does not satisfy, as pip writes them ("msgspec>=0.22"); None when
    the probe did not say which distributions are installed."""
    dists = info.get("dists")
    if dists is None:
        return None
    return [str(r) for r in reqs if dists.get(r.name) is None
            or not r.specifier.contains(dists[r.name], prereleases=True)]


def has_build_backend(info: dict) -> bool:
    """The interpreter can build ddpbench from this checkout without a download (setuptools >= 68)."""
    version = (info.get("dists") or {}).get("setuptools")
    return version is not None and _packaging()(BUILD_BACKEND).specifier.contains(version, prereleases=True)


def index_sources(environ: Mapping[str, str]) -> list[str]:
    """Where pip would look for packages: its index, extra indexes and find-links, from pip's own
    configuration (files and PIP_* variables, `pip config list`); pip's default index when none is set."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True,
                         env=dict(environ))
    sources, index = [], None
    for line in out.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        values = value.strip().strip("'\"").split()
        if name == "index-url":
            index = values[0] if values else None
        elif name in ("extra-index-url", "find-links"):
            sources += values
    return [index or DEFAULT_INDEX, *sources]


def reachable(source: str, timeout_s: float = INDEX_TIMEOUT_S) -> bool:
    """A package source answers: a folder or file:// URL that exists, an http(s) index that responds."""
    import urllib.error
    import urllib.parse
    import urllib.request

    if source.startswith("file:"):
        return Path(urllib.request.url2pathname(urllib.parse.urlparse(source).path)).exists()
    if "://" not in source:
        return Path(source).exists()
    try:
        urllib.request.urlopen(urllib.request.Request(source, method="HEAD"), timeout=timeout_s)
    except urllib.error.HTTPError:
        return True  # it answered
    except (OSError, ValueError):
        return False
    return True


def offline_message(info: dict, missing: list[str], sources: list[str], extras: list[str]) -> str:
    """What is missing, and how to bring it to a node without a package index."""
    wanted = [*missing, *([] if has_build_backend(info) else [BUILD_BACKEND])]
    quoted = " ".join(f"'{r}'" for r in wanted)
    torch = info["torch"]
    kept = f"; its torch {torch['version']} stays as it is" if torch else ""
    extra = f" ({', '.join(extras)} extras)" if extras else ""
    return (f"{info['executable']} lacks {', '.join(missing)}{extra}, and no package index answers here "
            f"(tried {', '.join(sources)}). Nothing was installed{kept}. On a machine with network (a login "
            f"node) and the same Python ({info['version']}) and platform: `python3 -m pip download --dest "
            f"wheels {quoted}`; copy wheels/ into this checkout, then `make setup WHEELS=wheels` (pip "
            f"installs from that folder only)")


def plan(info: dict, torch_spec: str, torch_range, python_range, stamp_current: bool) -> Plan:
    """What to install into the probed interpreter `info`; SetupError when its Python or torch cannot do.

    An installed torch is checked against the range as pip sees it (its distribution version;
    prereleases admitted, as pip admits an installed one) and pinned, never reinstalled.
    """
    if not python_range.contains(info["version"], prereleases=True):
        raise SetupError(f"{info['executable']} is Python {info['version']}; ddpbench needs Python "
                         f"{python_range} (pyproject.toml requires-python): point PYTHON= at another one")
    torch = info["torch"]
    if torch is None:
        return Plan(install_torch=torch_spec, constraint=None, install_project=True)
    if torch["dist_version"] is None:
        raise SetupError(f"torch {torch['version']} at {torch['location']} imports but pip sees no installed "
                         f"distribution of it, so installing ddpbench would make pip fetch another torch: "
                         f"install that torch as a package, or use another interpreter (PYTHON=)")
    if not torch_range.contains(torch["dist_version"], prereleases=True):
        raise SetupError(f"torch {torch['version']} in {info['executable']} is outside torch{torch_range}, "
                         f"the versions ddpbench is written for (pyproject.toml); set-up never replaces an "
                         f"installed torch: upgrade it yourself or point PYTHON= at another interpreter")
    current = stamp_current and info["ddp_core"] is not None
    return Plan(install_torch=None, constraint=f"torch=={torch['dist_version']}", install_project=not current,
                missing=unmet(info, info.get("reqs", [])) if "reqs" in info else None)


def build(torch: dict) -> str:
    """The accelerator a torch was built for: "CUDA 12.8", "ROCm 6.4.x", "XPU ...", or "CPU"."""
    if torch["cuda"]:
        return f"CUDA {torch['cuda']}"
    if torch["hip"]:
        return f"ROCm {torch['hip']}"
    if torch["xpu"]:
        return f"XPU {torch['xpu']}"
    return "CPU"


def new_record(info: dict, source: str, previous: dict | None) -> dict:
    """The record of this environment's torch: the previous one while it describes the same torch
    (so a torch set-up installed stays "installed now" on later runs), else a new one with `source`."""
    torch = info["torch"]
    if previous and source == FOUND and (previous.get("torch"), previous.get("torch_location")) == (
            torch["version"], torch["location"]):
        return previous
    return {"python": info["executable"], "python_version": info["version"], "torch": torch["version"],
            "torch_dist": torch["dist_version"], "build": build(torch), "nccl": torch["nccl"],
            "torch_location": torch["location"], "torch_source": source,
            "written": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def summary(info: dict, source: str, project: str, notes: list[str]) -> str:
    """The one line set-up prints."""
    torch = info["torch"]
    line = (f"setup: {info['executable']} (Python {info['version']}) · torch {torch['version']} "
            f"({build(torch)} build, {source}) at {torch['location']} · NCCL {torch['nccl'] or 'none'} · "
            f"ddpbench {project}")
    return "; ".join([line, *notes])


def announce(what: str) -> None:
    """Say what set-up is about to do before a step that can take a while (stderr: stdout is the result)."""
    print(f"setup: {what} ...", file=sys.stderr, flush=True)


def pip(python: Path, *args: str) -> None:
    """Run pip in the target interpreter; a failure raises CalledProcessError (pip has printed why)."""
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", *args]
    subprocess.run(cmd, check=True, env=os.environ | {"PIP_ROOT_USER_ACTION": "ignore"})


def project_target(extras: list[str]) -> str:
    """`ROOT` or `ROOT[dev]`: what pip installs (editable)."""
    return f"{ROOT}[{','.join(extras)}]" if extras else str(ROOT)


def install_project(python: Path, constraint: str, extras: list[str], offline: list[str] = ()) -> None:
    """pip install -e ROOT[extras], with the installed torch pinned so that pip cannot replace it; `offline`:
    pip's flags for an install without an index (--no-index and where to look)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "torch-constraint.txt"
        path.write_text(constraint + "\n")
        pip(python, *offline, "-c", str(path), "-e", project_target(extras))


def writable(info: dict) -> None:
    """SetupError, before anything is installed, when the target's prefix is not writable."""
    if not os.access(info["prefix"], os.W_OK):
        raise SetupError(f"cannot install into {info['prefix']} (not writable): create a virtualenv that "
                         f"sees its packages, `{info['executable']} -m venv --system-site-packages DIR`, and "
                         f"use it (activate it, or PYTHON=DIR/bin/python)")


def read_stamp(stamp: Path) -> tuple[str, set[str]]:
    """(the pyproject.toml digest installed, the extras installed with it)."""
    if not stamp.exists():
        return "", set()
    words = stamp.read_text().split()
    return (words[0] if words else ""), set(words[1:])


def setup(target: Target, running: Running, environ: Mapping[str, str], dry_run: bool,
          extras: list[str] = (), wheels: Path | None = None) -> str:
    """Create, probe, plan, install, record; the line to print."""
    extras = list(extras)
    torch_range, python_range = project_ranges()
    torch_spec = environ.get("TORCH_SPEC", DEFAULT_TORCH_SPEC)
    if target.create:
        cmd = venv_command(target, running)
        if dry_run:
            return f"setup (dry run): would run `{' '.join(cmd)}`, then plan inside it"
        announce(f"creating {target.python.parent.parent} with `{' '.join(map(str, cmd))}` (seconds)")
        subprocess.run(cmd, check=True)
    reqs = requirements(extras)
    names = [r.name for r in reqs] + ["setuptools"]
    info = probe(target.python, names)
    if target.hidden_torch and info["torch"] is None and "TORCH_SPEC" not in environ:
        raise SetupError(f"./.venv has no torch and was created without python3's packages, so it does not "
                         f"see the torch at {target.hidden_torch}: `rm -r .venv` and rerun to reuse that "
                         f"torch (or set TORCH_SPEC to install one into ./.venv)")
    prefix = Path(info["prefix"])
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    stamp = prefix / STAMP
    stamped, stamped_extras = read_stamp(stamp)
    stamp_current = stamped == digest and set(extras) <= stamped_extras
    steps = plan({**info, "reqs": reqs}, torch_spec, torch_range, python_range, stamp_current)
    notes = []
    if "TORCH_SPEC" in environ and info["torch"]:
        notes.append(f"TORCH_SPEC={torch_spec} unused: a torch is installed")
    if target.hidden_torch and info["torch"]:
        notes.append(f"note: ./.venv does not see python3's torch at {target.hidden_torch} "
                     f"(`rm -r .venv` and rerun to use it)")
    what = project_target(extras)
    offline: list[str] = []
    if wheels is not None:  # a folder of wheels brought from elsewhere: pip looks nowhere else
        if not wheels.is_dir():
            raise SetupError(f"WHEELS={wheels}: no such folder")
        offline = ["--no-index", "--find-links", str(wheels.resolve())]
    elif steps.install_torch or steps.install_project:
        sources = index_sources(environ)
        if not any(reachable(src) for src in sources):
            if steps.install_torch:
                raise SetupError(f"{info['executable']} has no torch and no package index answers here "
                                 f"(tried {', '.join(sources)}): install a torch into it, or bring a wheel "
                                 f"folder (`python3 -m pip download --dest wheels {torch_spec}` on a machine "
                                 f"with network) and run `make setup WHEELS=wheels`")
            if steps.missing:
                raise SetupError(offline_message(info, steps.missing, sources, extras))
            if steps.missing == []:  # everything is there: install the checkout itself, no download
                if not has_build_backend(info):
                    return summary(info, FOUND, f"runs from this checkout ({ROOT}; not installed: no "
                                   f"{BUILD_BACKEND} to build it and no package index)", notes)
                offline = ["--no-index", "--no-build-isolation", "--no-deps"]
    if dry_run:
        if steps.install_torch:
            return (f"setup (dry run): {info['executable']} has no torch: would pip install {torch_spec}, "
                    f"then -e {what} with that torch pinned")
        project = f"would be installed (-c {steps.constraint}{' ' + ' '.join(offline) if offline else ''})" \
            if steps.install_project else "up to date"
        return summary(info, FOUND, project, notes)

    source, project = FOUND, "up to date"
    if steps.install_torch or steps.install_project:
        writable(info)
    if steps.install_torch:
        announce(f"{info['executable']} has no torch: installing {steps.install_torch} with pip, then "
                 f"ddpbench and its dependencies. This is set-up's long step (torch is its largest download: "
                 f"minutes on a slow connection, with nothing printed until pip's own lines)")
        pip(target.python, *offline, steps.install_torch)
        source, info = INSTALLED, probe(target.python, names)
        steps = plan(info, torch_spec, torch_range, python_range, stamp_current=False)
        if steps.install_torch:
            raise SetupError(f"pip installed {torch_spec} but torch still does not import in {target.python}")
    if steps.install_project:
        if offline and wheels is not None and has_build_backend(info):
            offline.append("--no-build-isolation")  # build with the interpreter's setuptools
        announce(f"installing ddpbench (-e {what}) and its dependencies into {info['executable']}, "
                 f"torch pinned (-c {steps.constraint.strip()})"
                 + (f", from {wheels} only" if wheels is not None else ", no download" if offline else ""))
        install_project(target.python, steps.constraint, extras, offline)
        kept = stamped_extras if stamped == digest else set()
        stamp.write_text(" ".join([digest, *sorted(kept | set(extras))]) + "\n")
        project = "installed"
    record_path = prefix / RECORD
    previous = json.loads(record_path.read_text()) if record_path.exists() else None
    record = new_record(info, source, previous)
    if record != previous:
        if os.access(prefix, os.W_OK):
            record_path.write_text(json.dumps(record, indent=2) + "\n")
        else:
            notes.append(f"{record_path} not written ({prefix} not writable)")
    return summary(info, source, project, notes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", help="install into this interpreter (make setup PYTHON=...)")
    parser.add_argument("--print-python", action="store_true",
                        help="print the interpreter set-up installs into, and do nothing (for the Makefile)")
    parser.add_argument("--dry-run", action="store_true", help="probe and say what set-up would do")
    parser.add_argument("--extras", default="", help=f"comma-separated extras of pyproject.toml to install "
                                                     f"too: {', '.join(EXTRAS)} (default: the runtime only)")
    parser.add_argument("--wheels", type=Path, default=None,
                        help="install from this folder of wheels only, no package index (make setup WHEELS=)")
    args = parser.parse_args(argv)
    extras = [e for e in args.extras.split(",") if e]
    bad = [e for e in extras if e not in EXTRAS]
    if bad:
        print(f"setup: --extras={args.extras!r}: {bad[0]!r} is not one of {list(EXTRAS)}", file=sys.stderr)
        return 2
    running = running_interpreter()
    try:
        target = choose_target(args.python, os.environ, running)
        if args.print_python:
            print(target.python)
            return 0
        print(setup(target, running, os.environ, args.dry_run, extras, args.wheels), flush=True)
        return 0
    except SetupError as e:
        print(f"setup: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"setup: `{' '.join(map(str, e.cmd))}` failed (exit {e.returncode})", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
