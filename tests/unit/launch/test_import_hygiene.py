"""The library imports neither its command line, nor its test helpers, nor pytest.

A plain `pip install accelerando` has no pytest, and `accelerando launch`, `notebook_launcher` and
`debug_launcher` must work there. Read from the source (AST), so every module counts, imported
by a test or not.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import accelerando

PACKAGE = Path(accelerando.__file__).parent


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, dotted
    target: str  # what it imports, dotted
    line: int
    at_import_time: bool  # False when inside a function body


def _targets(node: ast.Import | ast.ImportFrom) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = node.module or ""
    return [base] + [f"{base}.{alias.name}" for alias in node.names]


def _walk(node: ast.AST, in_function: bool) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, in_function
        nested = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        yield from _walk(child, nested)


def library_imports() -> list[Import]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = ".".join(("accelerando", *path.relative_to(PACKAGE).with_suffix("").parts))
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, in_function in _walk(tree, False):
            if isinstance(node, ast.ImportFrom) and node.level:
                raise AssertionError(
                    f"{module}:{node.lineno} uses a relative import; the project uses absolute ones"
                )
            for target in _targets(node):
                found.append(Import(module, target, node.lineno, not in_function))
    return found


def _is(target: str, package: str) -> bool:
    return target == package or target.startswith(package + ".")


def test_the_walk_sees_the_modules_and_their_lazy_imports() -> None:
    imports = library_imports()
    assert any(i.module == "accelerando.commands.main" for i in imports)
    assert any(i.module == "accelerando.testing.markers" and i.target == "pytest" for i in imports)


def test_only_the_command_line_imports_the_command_line() -> None:
    bad = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in library_imports()
        if _is(i.target, "accelerando.commands") and not _is(i.module, "accelerando.commands")
    ]
    assert not bad, (
        "the library must not import accelerando.commands (move the code into the library):\n"
        + "\n".join(bad)
    )


def test_only_the_test_helpers_import_the_test_helpers() -> None:
    bad = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in library_imports()
        if _is(i.target, "accelerando.testing") and not _is(i.module, "accelerando.testing")
    ]
    assert not bad, "\n".join(bad)


def test_pytest_is_never_imported_when_a_module_loads() -> None:
    bad = [
        f"{i.module}:{i.line} imports pytest" + ("" if i.at_import_time else " (outside accelerando.testing)")
        for i in library_imports()
        if _is(i.target, "pytest") and (i.at_import_time or not _is(i.module, "accelerando.testing"))
    ]
    assert not bad, "pytest is not a dependency of accelerando:\n" + "\n".join(bad)


def test_importing_the_library_and_its_command_line_leaves_the_compiler_unloaded() -> None:
    """torch._dynamo costs about a second to import; `import accelerando` paid it for a decorator
    (`torch.compiler.disable` on a hook's methods), so did every `accelerando` command and every
    launch agent. Loaded once something compiles or builds a torch optimizer, not before."""
    probe = (
        "import sys, accelerando, accelerando.commands.main, accelerando.launch.worker; "
        "print(sorted(m for m in sys.modules if m.startswith('torch._dynamo')))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
