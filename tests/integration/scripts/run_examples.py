"""Run several example scripts one after another in the same 2 ranks (one launch instead of many).

Usage: run_examples.py SCRIPT [ARGS...] -- SCRIPT [ARGS...] -- ...
Each script runs as `__main__` with its own argv; its last `key=value` line is re-printed as
`RESULT <script name> <line>` by rank 0. Between scripts the runtime is reset, so the next
`Accelerator()` starts from scratch (each example ends with `end_training()`).
"""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

from accelerando.state import PartialState, reset_runtime


def groups(argv: list[str]) -> list[list[str]]:
    out: list[list[str]] = [[]]
    for arg in argv:
        if arg == "--":
            out.append([])
        else:
            out[-1].append(arg)
    return [g for g in out if g]


def main() -> None:
    for script, *args in groups(sys.argv[1:]):
        path = Path(script)
        sys.argv = [str(path), *args]
        sys.path.insert(0, str(path.parent))
        captured = io.StringIO()
        with contextlib.redirect_stdout(captured):
            runpy.run_path(str(path), run_name="__main__")
        sys.path.remove(str(path.parent))
        lines = [line for line in captured.getvalue().splitlines() if "=" in line]
        reset_runtime()
        if lines:
            print(f"RESULT {path.name} {lines[-1]}", flush=True)
    PartialState().wait_for_everyone()


if __name__ == "__main__":
    main()
