"""Your own workload: `workload.model = "path/to/file.py:Name"` or `"package.module:Name"`.

`Name` is a subclass of `bench.workloads.Workload`, built as `Name(model_size, options)` exactly like the
built-in workloads. A spec is any model name holding ':' other than `hf:<dir>`; the text after the last
':' is the class name.

- A file spec (the part before ':' ends in `.py` or holds a '/') is imported on its own, as a module
  named after the file's path and content; its directory is not put on `sys.path`, so a model spread over
  several files is better given as a module spec.
- A module spec is imported through the normal import system: installed packages, PYTHONPATH, and the
  working directory (`python -m bench` and the torchrun workers, which inherit it, both put it on sys.path).

A relative file path is resolved against the working directory of the process that builds the config:
that of `bench run`. `resolve_model_spec` makes it absolute when the config is built, so config.toml, the
launch plans and every rank (on any node, from any directory) name the same file.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from .base import Workload, WorkloadOptions
from .hf import PREFIX as HF_PREFIX

SEPARATOR = ":"
SHORT_HASH = 8   # hex digits of sha256 in cell ids and module names: enough to tell specs apart in a run


class UserModelError(ValueError):
    """A user model spec that cannot be loaded or built; the message names the spec and the cause.

    A ValueError, so that config validation reports it (exit 2) before anything is created.
    """


@dataclass(frozen=True)
class UserSpec:
    """A parsed spec: `target` is a file path (`is_file`) or a dotted module name; `name` the class."""

    target: str
    name: str
    is_file: bool


def is_user_spec(model: str) -> bool:
    """True for "path/to/file.py:Name" and "package.module:Name" (not for built-in names or `hf:`)."""
    return SEPARATOR in model and not model.startswith(HF_PREFIX)


def parse_spec(spec: str) -> UserSpec:
    """Split and check a spec's syntax (nothing is imported); raises UserModelError."""
    target, _, name = spec.rpartition(SEPARATOR)
    if not target or not name.isidentifier():
        raise UserModelError(f"model={spec!r}: expected 'path/to/file.py:Name' or 'package.module:Name' "
                             "with Name a Python identifier")
    is_file = target.endswith(".py") or "/" in target or os.sep in target
    if is_file and not target.endswith(".py"):
        raise UserModelError(f"model={spec!r}: {target!r} is not a .py file")
    if not is_file and not all(part.isidentifier() for part in target.split(".")):
        raise UserModelError(f"model={spec!r}: {target!r} is neither a .py file nor a dotted module name")
    return UserSpec(target, name, is_file)


def _absolute(target: str) -> Path:
    """A file path made absolute against the working directory (symlinks kept as written)."""
    return Path(os.path.abspath(os.path.expanduser(target)))


def resolve_model_spec(model: str) -> str:
    """The spec with its file path made absolute; other model names are returned unchanged.

    Idempotent, so a config rebuilt from its resolved form (a worker reading the plan) keeps the same spec.
    """
    if not is_user_spec(model):
        return model
    spec = parse_spec(model)
    return f"{_absolute(spec.target)}{SEPARATOR}{spec.name}" if spec.is_file else model


def model_label(model: str) -> str:
    """A short, filesystem-safe, stable name for cell ids: `Name-<sha256 of the spec, 8 hex>` for a spec.

    The hash tells apart two specs naming classes of the same name; other model names are unchanged.
    """
    if not is_user_spec(model):
        return model
    digest = hashlib.sha256(model.encode()).hexdigest()[:SHORT_HASH]
    return f"{model.rpartition(SEPARATOR)[2]}-{digest}"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _import_file(model: str, target: str):
    path = _absolute(target)
    if not path.is_file():
        raise UserModelError(f"model={model!r}: no such file {str(path)!r} (a relative path is resolved "
                             "against the directory `bench run` is started from)")
    # Named after the path and the content: an edited file is imported afresh, an unchanged one only once
    # per process (config validation and the workers' get_workload share it).
    stem = re.sub(r"\W", "_", path.stem)
    digest = hashlib.sha256(str(path).encode() + b"\0" + path.read_bytes()).hexdigest()[:SHORT_HASH]
    name = f"_bench_user_model_{stem}_{digest}"
    if name in sys.modules:
        return sys.modules[name]
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module   # before running it: dataclasses and pickle look classes up by module name
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # whatever the user's file raises on import is reported with its cause
        del sys.modules[name]
        raise UserModelError(f"model={model!r}: importing {path} raised {type(e).__name__}: {e}") from e
    return module


def _import_module(model: str, target: str):
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as e:
        if e.name and (target == e.name or target.startswith(e.name + ".")):
            raise UserModelError(f"model={model!r}: no module named {e.name!r} (neither installed nor on "
                                 "sys.path: PYTHONPATH or the directory `bench run` is started from)") from e
        raise UserModelError(f"model={model!r}: importing {target} raised ModuleNotFoundError: {e}") from e
    except Exception as e:  # whatever the user's module raises on import is reported with its cause
        raise UserModelError(f"model={model!r}: importing {target} raised {type(e).__name__}: {e}") from e


def load_workload_class(model: str) -> type[Workload]:
    """Import the spec's file or module and return its Workload subclass; raises UserModelError."""
    spec = parse_spec(model)
    module = _import_file(model, spec.target) if spec.is_file else _import_module(model, spec.target)
    where = module.__file__ if spec.is_file else spec.target
    if not hasattr(module, spec.name):
        found = sorted(k for k, v in vars(module).items()
                       if isinstance(v, type) and issubclass(v, Workload) and v is not Workload)
        raise UserModelError(f"model={model!r}: {where} defines no {spec.name!r} "
                             f"(Workload subclasses there: {found})")
    obj = getattr(module, spec.name)
    if not (isinstance(obj, type) and issubclass(obj, Workload)):
        what = f"class {obj.__name__}" if isinstance(obj, type) else f"a {type(obj).__name__}"
        raise UserModelError(f"model={model!r}: {spec.name} is {what}, not a subclass of "
                             "bench.workloads.Workload")
    return obj


def build_user_workload(model: str, size: str, options: WorkloadOptions | None = None) -> Workload:
    """`Name(size, options)` from the spec; anything the constructor raises becomes a UserModelError."""
    cls = load_workload_class(model)
    try:
        return cls(size, options or WorkloadOptions())
    except Exception as e:  # the user's constructor: report its error with the spec that named it
        raise UserModelError(f"model={model!r}: {cls.__name__}({size!r}, options) raised "
                             f"{type(e).__name__}: {e}") from e


def describe_model_spec(model: str) -> dict | None:
    """What env.json records about a user model (None for a built-in or `hf:` model).

    `file` is the file the spec names (a module spec: the module's source file) and `sha256` its content's
    hash; files that it imports are not covered. `label` is the name cell ids use.
    """
    if not is_user_spec(model):
        return None
    spec = parse_spec(model)
    if spec.is_file:
        path: Path | None = _absolute(spec.target)
    else:
        found = importlib.util.find_spec(spec.target)
        path = Path(found.origin) if found is not None and found.origin else None
    return {"spec": model, "class": spec.name, "module": None if spec.is_file else spec.target,
            "file": None if path is None else str(path),
            "sha256": _sha256(path) if path is not None and path.is_file() else None,
            "label": model_label(model)}


def check_model_unchanged(recorded: dict | None, model: str) -> None:
    """Raise UserModelError when the file a run recorded (env.json's `user_model`) has changed since.

    `--resume` calls it: cells measured on an edited model must not join the earlier cells of one run.
    """
    if recorded is None or not is_user_spec(model):
        return
    now = describe_model_spec(model)
    if now["sha256"] != recorded.get("sha256"):
        raise UserModelError(f"model={model!r}: {now['file']} changed since the run recorded it "
                             f"(sha256 {str(recorded.get('sha256'))[:12]}… in env.json, now "
                             f"{str(now['sha256'])[:12]}…)")
