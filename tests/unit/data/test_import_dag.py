"""`accelerando.data` is an import DAG: every sibling import sits at module level, and none loops."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import accelerando.data

PACKAGE = "accelerando.data"
DATA = Path(accelerando.data.__file__).parent
MODULES = {p.stem for p in DATA.glob("*.py")} - {"__init__"}


def _siblings(node: ast.Import | ast.ImportFrom) -> set[str]:
    """The data modules an import statement names."""
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    elif node.module == PACKAGE:  # from accelerando.data import x (x a module or a name of __init__)
        names = [f"{PACKAGE}.{a.name}" if a.name in MODULES else PACKAGE for a in node.names]
    else:
        names = [node.module or ""]
    out = set()
    for name in names:
        if name == PACKAGE:
            out.add("__init__")
        elif name.startswith(PACKAGE + "."):
            out.add(name[len(PACKAGE) + 1 :].split(".")[0])
    return out


def _imports(path: Path) -> tuple[set[str], list[str]]:
    """(sibling modules imported at module level, function-level sibling imports as 'line: module')."""
    tree = ast.parse(path.read_text())
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            top |= _siblings(node)
        elif isinstance(node, ast.Try):  # optional dependencies
            for inner in node.body:
                if isinstance(inner, (ast.Import, ast.ImportFrom)):
                    top |= _siblings(inner)
    nested = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and _siblings(node):
                    nested.append(f"{path.name}:{node.lineno}: {sorted(_siblings(node))}")
    return top, nested


def test_data_modules_import_each_other_only_at_module_level_and_without_a_cycle() -> None:
    graph, nested = {}, []
    for path in sorted(DATA.glob("*.py")):
        top, inner = _imports(path)
        graph[path.stem] = top - {path.stem}
        nested += inner
    assert not nested, f"function-level imports of data modules: {nested}"
    assert all("__init__" not in deps for name, deps in graph.items() if name != "__init__"), graph
    try:
        order = list(TopologicalSorter(graph).static_order())
    except CycleError as err:
        raise AssertionError(f"import cycle in accelerando.data: {err.args[1]}") from None
    assert order[-1] == "__init__" and set(order) == MODULES | {"__init__"}


def test_no_module_getattr_and_one_prepare_data_loader() -> None:
    defined = []
    for path in sorted(DATA.glob("*.py")):
        tree = ast.parse(path.read_text())
        names = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert "__getattr__" not in names, f"{path.name} defines a module __getattr__"
        defined += [path.name for name in names if name == "prepare_data_loader"]
    assert defined == ["prepare.py"]
    from accelerando import data_loader
    from accelerando.data import prepare

    assert data_loader.prepare_data_loader is prepare.prepare_data_loader
