"""Accelerate drop-in proof on 2 CPU ranks, in ONE launch plus one plain process started beside it.

`accelerando launch --as_accelerate --cpu --num_processes 2` runs (scripts/accelerate_scripts.py):

1. Accelerate's own test scripts, from the installed wheel (located with importlib, never copied):
   every part of a script (a function its main calls, scripts/accelerate_parts.py) is one test
   here; a part that cannot pass is skipped by name in SKIPS with the reason, a part the script
   does not call on 2 CPU ranks is skipped with the script's own reason in NOT_CALLED.
2. transformers' `Trainer` (scripts/compat_trainer.py) on a tiny random-init Llama, with a peft
   LoRA adapter and with FSDP, against the 1-process doubled-batch reference run meanwhile.

So it also proves the launcher's switch: `import accelerate` in the processes gives accelerando,
`version("accelerate")` answers the compatible release, and the `accelerate` command on their
PATH is accelerando's.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from accelerando._as_accelerate import ACCELERATE_VERSION
from accelerando.config import env
from accelerando.launch.accelerate_command import NOTICE
from accelerando.testing.distributed import native_failures

HERE = Path(__file__).parent / "scripts"
SCRIPTS = (
    "test_script.py",
    "test_sync.py",
    "test_ops.py",
    "test_distributed_data_loop.py",
    "test_merge_weights.py",
)
ACCELERATOR = "accelerando.accelerator"


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
LAUNCH_TIMEOUT = 400
pytestmark = [
    pytest.mark.skipif(
        WHEEL is None or not all(importlib.util.find_spec(n) for n in ("transformers", "peft")),
        reason="needs the accelerate wheel, transformers and peft (the test extra)",
    ),
    # Above the launch's own timeout, so a stuck launch is killed and its output shown, not cut by pytest.
    pytest.mark.timeout(LAUNCH_TIMEOUT + 200),
]

DELIBERATE = "deliberate difference (docs/architecture.md)"
SKIPS = {
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
    "state_dict() holds DTensor shards (as Accelerate's does with fsdp_version=2). "
    "merge_fsdp_weights and `merge-weights` are tested in tests/distributed/test_fsdp.py"
)
for _name in ("safetensors", "command_safetensors", "pytorch", "command_pytorch"):
    SKIPS[f"test_merge_weights.py:test_merge_weights_{_name}"] = f"{DELIBERATE}: the check {_MERGE}"

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


def _child_env() -> dict[str, str]:
    child = {k: v for k, v in env.snapshot().items() if not k.startswith((env.PREFIX, env.ALIAS_PREFIX))}
    return {**child, "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The launch and, beside it, the 1-process Trainer reference (2 cores: they overlap)."""
    assert WHEEL is not None
    out = tmp_path_factory.mktemp("dropin")
    trainer = HERE / "compat_trainer.py"
    (out / "ranks").mkdir()
    (out / "reference").mkdir()
    reference = subprocess.Popen(
        [sys.executable, str(trainer), str(out / "reference"), "reference"],
        env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    command = [
        sys.executable, "-m", "accelerando.commands.main", "launch", "--as_accelerate", "--cpu",
        "--num_processes", "2", "--num_cpu_threads_per_process", "1", "--quiet",
        str(HERE / "accelerate_scripts.py"), str(out), json.dumps(SKIPS), *(str(WHEEL / name) for name in SCRIPTS),
        "--then", str(trainer), str(out / "ranks"), "ranks",
    ]  # fmt: skip
    deadline = time.monotonic() + LAUNCH_TIMEOUT  # for both: they run side by side
    try:
        proc = subprocess.run(
            command, env=_child_env(), capture_output=True, text=True, timeout=LAUNCH_TIMEOUT, cwd=out
        )
        log, _ = reference.communicate(timeout=max(deadline - time.monotonic(), 30))
    except subprocess.TimeoutExpired as err:
        raise AssertionError(f"{err.cmd} took over {LAUNCH_TIMEOUT}s\n{err.output}\n{err.stderr}") from None
    finally:
        if reference.poll() is None:
            reference.kill()
            reference.communicate()
    shown = f"--- stdout\n{proc.stdout[-4000:]}\n--- stderr\n{proc.stderr[-8000:]}"
    assert proc.returncode == 0, shown
    assert not native_failures(proc.stdout + proc.stderr), shown
    assert reference.returncode == 0, log[-6000:]
    return {
        "out": out,
        "stderr": proc.stderr,
        "scripts": [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)],
        "reference": json.loads((out / "reference" / "reference.json").read_text()),
        "ranks": json.loads((out / "ranks" / "ranks.json").read_text()),
    }


# ---- the switch, through the launcher -----------------------------------------------------------
def test_the_launcher_switches_the_processes_to_accelerando(run: Any) -> None:
    reports, stderr = run["scripts"], run["stderr"]
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


# ---- Accelerate's scripts ------------------------------------------------------------------------
@pytest.mark.parametrize(("script", "part"), PARTS, ids=[f"{s}:{p}" for s, p in PARTS])
def test_part(run: Any, script: str, part: str) -> None:
    key = f"{script}:{part}"
    if key in SKIPS:
        pytest.skip(SKIPS[key])
    reports = run["scripts"]
    for rank, report in enumerate(reports):
        results = report[script]["results"]
        assert "_script" not in results, f"rank {rank}: {results['_script']['error']}"
        if part not in results:
            if key in NOT_CALLED:
                pytest.skip(f"not called on 2 CPU ranks: {NOT_CALLED[key]}")
            raise AssertionError(f"rank {rank}: {script} never called {part}; say why in NOT_CALLED")
        entry = results[part]
        assert entry["status"] == "passed", f"rank {rank}: {entry.get('error')}"


# ---- transformers' Trainer and peft ---------------------------------------------------------------
def _weights(out: Path, name: str) -> dict[str, torch.Tensor]:
    return torch.load(out / name, weights_only=True)


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.mark.parametrize("name", ["full", "lora"])
def test_two_ranks_with_accumulation_equal_one_process_with_double_batch(run: Any, name: str) -> None:
    out, reference, ranks = run["out"], run["reference"], run["ranks"]
    assert reference[name]["accelerator"] == ranks[name]["accelerator"] == ACCELERATOR
    assert ranks[name]["steps_run"] == reference[name]["steps_run"] == 4
    assert ranks[name]["losses"] == pytest.approx(reference[name]["losses"], rel=1e-5)
    diff = _max_diff(
        _weights(out / "ranks", f"ranks_{name}.pt"), _weights(out / "reference", f"reference_{name}.pt")
    )
    assert diff < 1e-5, diff


def test_training_moved_the_weights(run: Any) -> None:
    assert run["ranks"]["learned"] > 1e-3  # so equal end weights below are not equal start weights


@pytest.mark.parametrize(
    ("name", "diff"),
    [
        ("resumed", "resume_max_diff"),
        ("lora_resumed", "lora_resume_max_diff"),
        ("fsdp_resumed", "fsdp_resume_max_diff"),
    ],
)
def test_resume_from_checkpoint_reaches_the_uninterrupted_weights(run: Any, name: str, diff: str) -> None:
    ranks = run["ranks"]
    assert ranks[name]["accelerator"] == ACCELERATOR
    assert ranks[name]["steps_run"] == 2  # steps 3 and 4 only: the checkpoint was at step 2
    assert ranks[diff] < 1e-6, ranks[diff]


def test_saved_model_and_adapter_load_with_from_pretrained(run: Any) -> None:
    ranks = run["ranks"]
    assert ranks["from_pretrained_max_diff"] == 0.0
    assert ranks["lora_from_pretrained_max_diff"] == 0.0
    assert "adapter_model.safetensors" in ranks["lora_files"]
    assert "model.safetensors" not in ranks["lora_files"]  # the adapter only


def test_fsdp_helpers_save_and_load_only_the_adapter(run: Any) -> None:
    adapter = run["ranks"]["adapter_only"]
    trained = len(torch.load(run["out"] / "ranks" / "ranks_lora.pt", weights_only=True))
    assert adapter["keys"] == trained and adapter["all_lora"] and adapter["unexpected"] == []
    assert adapter["max_diff"] == 0.0  # zeroed adapter weights restored from the file


def test_fsdp_trainer_checkpoints_through_the_fsdp_helpers(run: Any) -> None:
    ranks = run["ranks"]
    assert ranks["fsdp_is_fsdp"] and ranks["fsdp"]["accelerator"] == ACCELERATOR
    assert ranks["fsdp_vs_ddp_max_diff"] < 1e-5
    assert {"pytorch_model_fsdp.bin", "optimizer.bin"} <= set(ranks["fsdp_checkpoint_files"])
    assert ranks["helpers_dcp1"]["files"] == ["optimizer_0", "pytorch_model_fsdp_0"]
    assert ranks["helpers_dcp0"]["files"] == [
        "optimizer_0_rank0.bin",
        "optimizer_0_rank1.bin",
        "pytorch_model_fsdp_0_rank0.bin",
        "pytorch_model_fsdp_0_rank1.bin",
    ]
    for key in ("helpers_dcp1", "helpers_dcp0"):
        assert ranks[key]["model_max_diff"] == 0.0 and ranks[key]["optimizer_equal"], ranks[key]
