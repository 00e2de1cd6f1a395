"""The layout of experiments/, read from its sources (ast, nothing imported): the harness and the
studies import no circle, a study imports no other study, and nothing in experiments/ imports plots/
(the plot step runs after a study, from the Makefile)."""
from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "experiments"
STUDIES = "experiments.studies"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(path: Path) -> set[str]:
    """Every module `path` imports, at module level or inside functions, as absolute names; `from
    X import y` counts as X.y too, since y may be a module (what no module is gets dropped later)."""
    package = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def graph() -> dict[str, set[str]]:
    """experiments' modules and, for each, the modules of experiments/ it imports."""
    modules = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: {m for m in imported(path) if m in modules and m != name} for name, path in modules.items()}


def is_study(name: str) -> bool:
    return name.startswith(STUDIES + ".") and name.rpartition(".")[2] not in ("__init__", "__main__")


def test_the_reader_sees_the_harness_and_every_study():
    edges = graph()
    assert {"experiments.launch", "experiments.floors", "experiments.studies.__main__"} <= set(edges)
    assert {n for n in edges if is_study(n)} >= {f"{STUDIES}.{s}" for s in ("bench", "nary", "sst", "targets")}
    assert "experiments.launch" in edges["experiments.studies.bench"]       # relative imports resolved
    assert "experiments.floors" in edges["experiments.studies.nary"]


def test_no_import_circle_in_experiments():
    edges = graph()
    done, path = set(), []

    def visit(name):
        if name in path:
            raise AssertionError("import circle: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        path.append(name)
        for other in sorted(edges[name]):
            visit(other)
        path.pop()
        done.add(name)

    for name in sorted(edges):
        visit(name)


def test_no_study_imports_another_study():
    edges = graph()
    for name in filter(is_study, edges):
        others = sorted(m for m in edges[name] if is_study(m))
        assert not others, f"{name} imports the studies {others}: shared code belongs in the harness"


def test_nothing_in_experiments_imports_plots():
    for path in PACKAGE.rglob("*.py"):
        plots = sorted(m for m in imported(path) if m == "plots" or m.startswith("plots."))
        assert not plots, f"{module_name(path)} imports {plots}: the Makefile runs the plot step after a study"
