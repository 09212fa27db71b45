"""The code's layering (docs/design.md "Layout"), checked on the source: the launcher lives in bench/run/, the
ranks import nothing from it, no stage imports a later one or another stage's command-line module, nothing
but the dispatcher builds an `argparse.Namespace`, the modules' imports have no cycle (annotation-only imports
under TYPE_CHECKING included), and every module is on design.md's Layout map."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
DESIGN = ROOT / "docs" / "design.md"
# the stages in data-flow order; each may import the shared modules and any earlier stage. bench.run is the
# first; its pipeline (and cli, which reaches it) runs the later stages after a sweep, so they come last.
STAGES = {"run": 0, "analyze": 1, "project": 2, "advise": 3, "report": 4}
AFTER_EVERY_STAGE = {"bench.run.pipeline", "bench.run.cli"}
DISPATCHER = "bench.__main__"
MAX_TOP_LEVEL_MODULES = 14


def module_name(path: Path) -> str:
    parts = path.relative_to(BENCH.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, modules: set[str], typing_too: bool = False) -> set[str]:
    """Every bench module `path` imports, wherever the import statement is (with `typing_too`, also under
    `if TYPE_CHECKING:`), and dynamic imports of a literal module name. `from pkg import sub` of a submodule
    is an import of the submodule, not of the package's __init__."""
    tree = ast.parse(path.read_text())
    typing_only = set() if typing_too else {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If)
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


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in BENCH.rglob("*.py")}


def graph(typing_too: bool = False) -> dict[str, set[str]]:
    files = modules()
    edges = {}
    for name, path in files.items():
        if name == DISPATCHER:  # every command's module, by design
            continue
        targets = set()
        for target in imports(path, set(files), typing_too):
            while target not in files and "." in target:  # `from bench.x import y` where y is a name
                target = target.rsplit(".", 1)[0]
            if target in files and target != name:
                targets.add(target)
        edges[name] = targets
    return edges


def stage(module: str) -> int | None:
    if module in AFTER_EVERY_STAGE:
        return max(STAGES.values()) + 1
    part = module.split(".")[1] if module.count(".") else ""
    return STAGES.get(part)


def test_no_stage_imports_a_later_one():
    bad = [(a, b) for a, targets in graph().items() for b in targets
           if stage(a) is not None and stage(b) is not None and stage(b) > stage(a)]
    assert bad == []


def test_the_ranks_import_nothing_from_the_launcher():
    bad = [(a, b) for a, targets in graph().items() for b in targets
           if a.startswith("bench.worker") and (b == "bench.run" or b.startswith("bench.run."))]
    assert bad == []


def test_no_stage_calls_another_through_its_command_line():
    # a stage's cli module is imported by the dispatcher alone; a stage reaches another through its functions
    clis = {m for m in modules() if m.endswith(".cli")}
    bad = [(a, b) for a, targets in graph().items() for b in targets
           if b in clis and a.rsplit(".", 1)[0] != b.rsplit(".", 1)[0]]
    assert bad == []
    namespaces = [module_name(p) for p in BENCH.rglob("*.py") if module_name(p) != DISPATCHER
                  and re.search(r"\bNamespace\(", p.read_text())]
    assert namespaces == []


def find_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    state, cycles = {}, []

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
    return cycles


def test_no_import_cycle_not_even_for_annotations():
    assert find_cycles(graph(typing_too=True)) == []


def test_the_cycle_finder_finds_one():
    assert find_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_bench_top_level_reads_as_the_pipeline():
    top = sorted(p.name for p in BENCH.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, top
    packages = {p.name for p in BENCH.iterdir() if (p / "__init__.py").is_file()}
    assert {"run", "worker", "engines", "workloads", "analyze", "project", "advise", "report"} <= packages


def layout_map() -> str:
    """design.md's Layout section: the fenced tree under `## Layout`."""
    text = DESIGN.read_text()
    section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    return section.split("```", 2)[1]


def mapped_paths(tree: str) -> set[str]:
    """Every file the map names, as a path under the repository: an indented tree whose entries are
    `name/` (a folder, deeper lines inside it) or `a.py, b.py` (files of the folder the indentation is in)."""
    stack: list[tuple[int, str]] = []
    found = set()
    for line in tree.splitlines():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        entry = re.split(r"\s{2,}", line.strip())[0]
        names = [n.strip() for n in entry.split(",")]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        folder = stack[-1][1] if stack else ""
        if len(names) == 1 and names[0].endswith("/"):
            stack.append((indent, folder + names[0]))
            found.add(folder + names[0])
            continue
        found.update(folder + n for n in names if re.fullmatch(r"[\w.]+\.(py|toml)", n))
    return found


def test_every_module_is_on_the_design_map():
    mapped = mapped_paths(layout_map())
    files = {p.relative_to(ROOT).as_posix() for folder in (BENCH, ROOT / "ddp_core")
             for p in folder.rglob("*.py") if p.name != "__init__.py"}
    assert sorted(files - mapped) == []
    assert sorted(f for f in mapped - files if f.endswith(".py")) == []  # no module that is gone


def test_the_map_reader_reads_the_tree():
    tree = "bench/\n  a.py           what a is\n  run/\n    b.py, c.py   two\n  d.py\nother/\n  e.py\n"
    assert mapped_paths(tree) == {"bench/", "bench/a.py", "bench/run/", "bench/run/b.py", "bench/run/c.py",
                                  "bench/d.py", "other/", "other/e.py"}


def test_nothing_outside_the_engines_tests_an_engine_by_name():
    # what an engine is (the reference, bucketless, sharded, ...) is its facts' to say (engines/base.py): a
    # comparison with a built-in engine's name elsewhere would miss a plug-in engine of the same kind
    from bench.engines import names

    engine_names = set(names())
    found = []
    for path in BENCH.rglob("*.py"):
        if path.parent.name == "engines":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                sides = [node.left, *node.comparators]
                literals = [s.value for s in sides if isinstance(s, ast.Constant)]
                literals += [e.value for s in sides if isinstance(s, (ast.Tuple, ast.List, ast.Set))
                             for e in s.elts if isinstance(e, ast.Constant)]
                found += [f"{module_name(path)}:{node.lineno} {v!r}" for v in literals if v in engine_names]
    assert found == []


def test_run_folder_file_names_are_spelled_once():
    # every file of a run folder is a constant of bench/run_folder/layout.py, which writers and readers use
    # (through the package: run_folder.RESULTS); the report's own folder (reports/<run-id>/) has names of
    # its own and is not checked here
    from bench import run_folder

    names = {v for k, v in vars(run_folder).items() if k.isupper() and isinstance(v, str)
             and re.fullmatch(r"[\w.-]+\.(csv|json|jsonl|toml|txt|md|sbatch)", v)}
    found = []
    for path in BENCH.rglob("*.py"):
        if path == BENCH / "run_folder" / "layout.py" or path.parent.name == "report":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{module_name(path)}:{node.lineno} {node.value!r}")
    assert found == []
