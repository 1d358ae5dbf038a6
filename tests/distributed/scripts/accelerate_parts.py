"""Which parts of an Accelerate test script there are: read from its source, never run.

A part is a call, in the script's `__main__` block or its `main()`, of a function the script
defines; with keyword arguments the part names them (`training_check(use_seedable_sampler=False)`).
Used by accelerate_scripts.py (which runs them) and test_accelerate_dropin.py (one test each).
"""

import ast


def main_block(tree: ast.Module) -> list[ast.stmt]:
    for node in tree.body:
        if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
            return node.body
    raise ValueError("script has no `if __name__ == '__main__':` block")


def call_id(name: str, keywords: dict[str, str]) -> str:
    return name + (f"({', '.join(f'{k}={v}' for k, v in keywords.items())})" if keywords else "")


def parts(tree: ast.Module) -> list[str]:
    defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    bodies: list[ast.AST] = list(main_block(tree))
    bodies += [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
    found: list[str] = []
    for body in bodies:
        for node in ast.walk(body):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                name = node.func.id
                part = call_id(name, {kw.arg: ast.unparse(kw.value) for kw in node.keywords if kw.arg})
                if name in defined and name != "main" and part not in found:
                    found.append(part)
    return found
