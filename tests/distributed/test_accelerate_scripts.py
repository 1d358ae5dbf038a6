"""Accelerate's own test scripts, from the installed wheel, on 2 CPU ranks through the switch.

One `accelerando launch --as_accelerate --cpu --num_processes 2` runs them all
(scripts/accelerate_scripts.py), so this also proves the launcher's switch: `import accelerate`
in the scripts gives accelerando, `version("accelerate")` answers the compatible release and the
`accelerate` command on the processes' PATH is accelerando's. Every part of a script (a function
its main calls, see scripts/accelerate_parts.py) is one test here: a part that cannot pass is
skipped by name in SKIPS with the reason, a part the script does not call on 2 CPU ranks is
skipped with the script's own reason in NOT_CALLED; anything else must pass on both ranks.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from accelerando._as_accelerate import ACCELERATE_VERSION
from accelerando.config import env
from accelerando.launch.accelerate_command import NOTICE

HERE = Path(__file__).parent / "scripts"
SCRIPTS = (
    "test_script.py",
    "test_sync.py",
    "test_ops.py",
    "test_distributed_data_loop.py",
    "test_merge_weights.py",
)


def _load_parts_module() -> Any:
    spec = importlib.util.spec_from_file_location("accelerate_parts", HERE / "accelerate_parts.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheel_scripts() -> Path | None:
    """The installed accelerate's `test_utils/scripts`, located without importing accelerate."""
    spec = importlib.util.find_spec("accelerate")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "test_utils" / "scripts"
    return folder if all((folder / name).is_file() for name in SCRIPTS) else None


WHEEL = _wheel_scripts()
pytestmark = pytest.mark.skipif(WHEEL is None, reason="needs the accelerate wheel (the test extra)")

DELIBERATE = "deliberate difference (docs/architecture.md)"
SKIPS = {
    "test_script.py:training_check(use_seedable_sampler=False)": (
        "NOT FIXED YET (issue 19): a prepared shuffled loader orders each epoch by (seed, epoch), "
        "resumable without saving a generator; Accelerate's draws each epoch from the user's "
        "generator, so after the first epoch the 2-rank model ends 0.25% from the 1-process one. "
        "data/ is being reworked on the arch-data branch; the fix belongs there"
    ),
    "test_sync.py:test_gradient_accumulation_with_opt_and_scheduler": (
        f"{DELIBERATE}: the last, partial accumulation window is scaled by its real length; the "
        "script's reference divides the last 1-batch window's loss by 2, so gradients differ by 2x"
    ),
    "test_distributed_data_loop.py:test_join_raises_warning_for_non_ddp_distributed": (
        f"{DELIBERATE}: the script fakes FSDP by assigning state.distributed_type on a DDP run; here "
        "the assigned type is only reported, the DDP strategy that runs still joins (a real FSDP "
        "run gives Accelerate's warning)"
    ),
    "test_distributed_data_loop.py:test_stateful_dataloader_save_state": (
        f"{DELIBERATE}: each rank saves into its own tempfile.TemporaryDirectory(); a checkpoint is "
        "one directory with one manifest that every rank names the same (docs/checkpointing.md), "
        "and save_state refuses differing directories"
    ),
}
_MERGE = (
    "compares model.state_dict() with plain tensors: under FSDP1 (this script's fsdp_version) they "
    "are gathered full tensors; accelerando runs fsdp_version=1 as FSDP2 (docs/fsdp.md), whose "
    "state_dict() holds DTensor shards (Accelerate fails the same way with fsdp_version=2). "
    "merge_fsdp_weights and `merge-weights` are tested in tests/distributed/test_fsdp.py"
)
for _name in ("safetensors", "command_safetensors", "pytorch", "command_pytorch"):
    SKIPS[f"test_merge_weights.py:test_merge_weights_{_name}"] = f"{DELIBERATE}: {_name} {_MERGE}"

NOT_CALLED = {
    "test_sync.py:test_noop_sync": "main() calls it only without distribution (DistributedType.NO)",
    "test_sync.py:test_gradient_accumulation": "main() calls it only on multi-accelerator types (not MULTI_CPU)",
    "test_script.py:test_split_between_processes_dataset": "main() calls it only with `datasets` installed",
}


def _parts() -> list[tuple[str, str]]:
    if WHEEL is None:
        return []
    module = _load_parts_module()
    return [(name, part) for name in SCRIPTS for part in module.parts(ast.parse((WHEEL / name).read_text()))]


PARTS = _parts()


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict[str, Any]], str]:
    assert WHEEL is not None
    out = tmp_path_factory.mktemp("accelerate_scripts")
    skips = json.dumps(SKIPS)
    command = [
        sys.executable, "-m", "accelerando.commands.main", "launch", "--as_accelerate", "--cpu",
        "--num_processes", "2", "--num_cpu_threads_per_process", "1", "--quiet",
        str(HERE / "accelerate_scripts.py"), str(out), skips, *(str(WHEEL / name) for name in SCRIPTS),
    ]  # fmt: skip
    child = {k: v for k, v in env.snapshot().items() if not k.startswith((env.PREFIX, env.ALIAS_PREFIX))}
    proc = subprocess.run(command, env=child, capture_output=True, text=True, timeout=300, cwd=out)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
    reports = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return reports, proc.stderr


def test_the_launcher_switches_the_processes_to_accelerando(run: Any) -> None:
    reports, stderr = run
    assert NOTICE in stderr  # said once, by the launcher
    for report in reports:
        facts = report["_switch"]
        assert facts["version"] == ACCELERATE_VERSION
        assert Path(facts["accelerate_command"]).parent.name.startswith("accelerando-as-accelerate-")
    rank0 = reports[0]["_switch"]
    assert rank0["returncode"] == 0 and rank0["help"].startswith("usage: accelerate")
    assert rank0["notice"] == [
        f"accelerate: this is accelerando {__import__('accelerando').__version__}'s command line "
        f"(the as_accelerate switch is on; reported as accelerate {ACCELERATE_VERSION})"
    ]


def test_every_skip_names_a_real_part() -> None:
    named = {f"{script}:{part}" for script, part in PARTS}
    assert set(SKIPS) <= named and set(NOT_CALLED) <= named


@pytest.mark.parametrize(("script", "part"), PARTS, ids=[f"{s}:{p}" for s, p in PARTS])
def test_part(run: Any, script: str, part: str) -> None:
    key = f"{script}:{part}"
    if key in SKIPS:
        pytest.skip(SKIPS[key])
    reports, _ = run
    for rank, report in enumerate(reports):
        results = report[script]["results"]
        assert "_script" not in results, f"rank {rank}: {results['_script']['error']}"
        if part not in results:
            if key in NOT_CALLED:
                pytest.skip(f"not called on 2 CPU ranks: {NOT_CALLED[key]}")
            raise AssertionError(f"rank {rank}: {script} never called {part}; say why in NOT_CALLED")
        entry = results[part]
        assert entry["status"] == "passed", f"rank {rank}: {entry.get('error')}"
