"""The code's layering (docs/design.md "Layout"): no stage imports a later one, and the modules' imports —
top-level, inside functions and `importlib.import_module("bench…")` strings alike — have no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench"
# the stages in data-flow order; each may import the shared modules and any earlier stage. run_cli is the
# `bench run` command: after the sweep, `--report` runs the later stages through bench.pipeline.
STAGES = {"run": 0, "analyze": 1, "project": 2, "advise": 3, "report": 4, "pipeline": 5, "run_cli": 5}
RUN_MODULES = {"launch", "worker", "results", "lifetime", "run_checks", "progress", "nccl_log"}


def module_name(path: Path) -> str:
    parts = path.relative_to(BENCH.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str]) -> set[str]:
    """Every bench module `path` imports, wherever the import statement is (except under `if
    TYPE_CHECKING:`: annotations only), and dynamic imports of a literal module name. `from pkg import sub`
    of a submodule is an import of the submodule, not of the package's __init__."""
    tree = ast.parse(path.read_text())
    typing_only = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and getattr(node.test, "id", "") == "TYPE_CHECKING" for n in ast.walk(node)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench"):
            subs = {f"{node.module}.{a.name}" for a in node.names} & modules
            out |= subs
            if len(subs) < len(node.names):  # a name defined in the module itself
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("bench"))
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "import_module" and node.args
              and isinstance(node.args[0], ast.Constant) and str(node.args[0].value).startswith("bench")):
            out.add(node.args[0].value)
    return out


def graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in BENCH.rglob("*.py")}
    edges = {}
    for name, path in files.items():
        if name == "bench.__main__":  # the dispatcher: every command's module, by design
            continue
        targets = set()
        for target in imports(path, set(files)):
            while target not in files and "." in target:  # `from bench.x import y` where y is a name
                target = target.rsplit(".", 1)[0]
            if target in files and target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def stage(module: str) -> int | None:
    part = module.split(".")[1] if module.count(".") else ""
    if part in RUN_MODULES:
        return STAGES["run"]
    return STAGES.get(part)


def test_no_stage_imports_a_later_one():
    bad = [(a, b) for a, targets in graph().items() for b in targets
           if stage(a) is not None and stage(b) is not None and stage(b) > stage(a)]
    assert bad == []


def test_no_import_cycle():
    edges, state, cycles = graph(), {}, []

    def visit(node, path):
        state[node] = "open"
        for nxt in edges.get(node, ()):
            if state.get(nxt) == "open":
                cycles.append(path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt])
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for node in list(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []
