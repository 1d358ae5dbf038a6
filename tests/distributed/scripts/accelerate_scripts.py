"""Run test scripts shipped in the installed `accelerate` wheel on accelerando, through the switch.

Started by tests/distributed/test_accelerate_dropin.py as `accelerando launch --as_accelerate --cpu
--num_processes 2 accelerate_scripts.py OUT SKIPS SCRIPT... [--then OURS ARGS...]`,
so `import accelerate` inside the scripts gives accelerando (the worker turned the switch on before
this file ran). Each script is loaded as a module from its file, never copied; its parts (the
functions of the script that its `main()` or `__main__` block calls) are wrapped so each records
whether it passed, failed (with the error) or was skipped by name (SKIPS: {"script:part": reason}),
then the script's `__main__` block runs as written. Each rank writes OUT/rank<r>.json.

`--then` runs one more script afterwards in the same processes (compat_trainer.py: one launch, not
two; each costs 10-18 s of process start and imports here). The scripts share one process group:
each ends with `destroy_process_group()` / `end_training()`, which this driver defers to the end
of the launch (one launch instead of one per script); the accelerator state is reset between
scripts, as a fresh process would have it.
"""

import ast
import functools
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

import accelerate  # the switch is on: this is accelerando
from accelerate_parts import call_id, main_block, parts  # noqa: E402 - beside this file

import accelerando

assert accelerate is accelerando, "the launcher did not turn the switch on"
import torch.distributed as dist  # noqa: E402

from accelerando.state import AcceleratorState, PartialState  # noqa: E402

OUT = Path(sys.argv[1])
SKIPS: dict[str, str] = json.loads(sys.argv[2])
_rest = sys.argv[3:]
_then = _rest.index("--then") if "--then" in _rest else len(_rest)
SCRIPTS = [Path(p) for p in _rest[:_then]]
THEN = _rest[_then + 1 :]  # a script of ours (and its arguments) run afterwards in the same processes
report: dict[str, dict] = {}


def _start_accelerate_command():  # type: ignore[no-untyped-def]
    """Rank 0 runs `accelerate --help` from PATH while the scripts run (it imports torch: seconds)."""
    import shutil
    import subprocess

    command = shutil.which("accelerate")
    if command is None or os.environ.get("RANK", "0") != "0":
        return command, None
    return command, subprocess.Popen(
        [command, "--help"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _switch_facts(command, running) -> dict:  # type: ignore[no-untyped-def]
    import importlib.metadata

    facts = {"version": importlib.metadata.version("accelerate"), "accelerate_command": command}
    if running is not None:
        out, err = running.communicate(timeout=120)
        facts.update(help=out[:120], notice=err.strip().splitlines()[:1], returncode=running.returncode)
    return facts


def _wrap(script: str, function, results: dict):  # type: ignore[no-untyped-def]
    """Record each call of `function` under its part id; a part skipped by name is not run."""

    @functools.wraps(function)
    def part(*args, **kwargs):  # type: ignore[no-untyped-def]
        name = call_id(function.__name__, {k: repr(v) for k, v in kwargs.items()})
        entry = results.setdefault(name, {"calls": 0, "seconds": 0.0})
        entry["calls"] += 1
        if f"{script}:{name}" in SKIPS:
            entry["status"] = "skipped"
            return None
        start = time.perf_counter()
        try:
            value = function(*args, **kwargs)
        except BaseException as err:
            entry["status"] = "failed"
            entry["error"] = "".join(traceback.format_exception(err))[-3000:]
            raise
        finally:
            entry["seconds"] += time.perf_counter() - start
        entry.setdefault("status", "passed")
        return value

    return part


def run_script(path: Path) -> dict:
    tree = ast.parse(path.read_text())
    spec = importlib.util.spec_from_file_location(f"accelerate_wheel_scripts.{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    results: dict = {}
    for name in {part.split("(")[0] for part in parts(tree)}:
        setattr(module, name, _wrap(path.name, getattr(module, name), results))
    block = compile(ast.Module(body=main_block(tree), type_ignores=[]), str(path), "exec")
    start = time.perf_counter()
    try:
        exec(block, module.__dict__)
    except BaseException as err:  # noqa: BLE001 - reported per script; the next script still runs
        results["_script"] = {"status": "failed", "error": "".join(traceback.format_exception(err))[-3000:]}
    results["_seconds"] = time.perf_counter() - start
    return {"parts": parts(tree), "results": results}


# The scripts' closing teardown is deferred to the end of the launch (see the docstring).
_destroy = PartialState.destroy_process_group
PartialState.destroy_process_group = lambda self, group=None: None  # type: ignore[method-assign]
command, running = _start_accelerate_command()
for script in SCRIPTS:
    os.chdir(OUT)  # test_merge_weights.py writes into the working directory (rank 0 removes it)
    report[script.name] = run_script(script)
    if dist.is_initialized():
        dist.barrier()
    AcceleratorState._reset_state(reset_partial_state=True)
report["_switch"] = _switch_facts(command, running)
(OUT / f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(report, indent=1))
if THEN:
    import runpy

    sys.argv = list(THEN)
    runpy.run_path(THEN[0], run_name="__main__")
PartialState.destroy_process_group = _destroy  # type: ignore[method-assign]
PartialState().destroy_process_group()
