"""Every name of issue 19's list exists where Accelerate defines it, as one object on every path."""

from __future__ import annotations

import importlib

import accelerate.utils
import pytest

import accelerando
import accelerando.utils

# Names Accelerate 1.16 exports from `accelerate.utils`; each is looked up in the module Accelerate
# defines it in (its `__module__`, or the given module for constants).
UTILS_NAMES = [
    "purge_accelerate_environment",
    "CannotPadNestedTensorWarning",
    "check_os_kernel",
    "convert_dict_to_env_variables",
    "convert_outputs_to_fp32",
    "find_device",
    "listify",
    "pad_input_tensors",
    "save",
    "is_datasets_available",
    "is_hpu_available",
    "is_pytest_available",
    "DeepSpeedSequenceParallelConfig",
    "TorchContextParallelConfig",
    "TorchTensorParallelConfig",
    "get_module_size_with_ties",
    "get_state_dict_offloaded_model",
    "get_state_dict_from_offload",
    "DistributedOperationException",
    "copy_tensor_to_devices",
    "compare_versions",
    "is_torch_version",
    "prepare_multi_gpu_env",
    "prepare_simple_launcher_cmd_env",
    "str_to_bool",
    "ParallelismConfig",
]
CONSTANTS = [
    "SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING",
    "BETA_TP_AVAILABLE_TRANSFORMERS_VERSION",
    "BETA_SP_AVAILABLE_DEEPSPEED_VERSION",
    "STR_OPERATION_TO_FUNC",
]


def _ours(module_name: str) -> object:
    return importlib.import_module("accelerando" + module_name.removeprefix("accelerate"))


# Names Accelerate defines in a submodule without exporting them from `accelerate.utils`.
SUBMODULE_ONLY = {
    "get_module_size_with_ties": "accelerate.utils.modeling",
    "get_state_dict_offloaded_model": "accelerate.utils.modeling",
    "get_state_dict_from_offload": "accelerate.utils.modeling",
    "DistributedOperationException": "accelerate.utils.operations",
}


@pytest.mark.parametrize("name", UTILS_NAMES)
def test_name_is_in_the_same_module_as_in_accelerate(name: str) -> None:
    where = SUBMODULE_ONLY.get(name, "accelerate.utils")
    home = getattr(importlib.import_module(where), name).__module__
    ours = getattr(accelerando.utils, name)
    assert getattr(_ours(home), name) is ours, f"accelerando{home.removeprefix('accelerate')}.{name}"


@pytest.mark.parametrize("name", CONSTANTS)
def test_constants_equal_accelerate(name: str) -> None:
    theirs = getattr(importlib.import_module("accelerate.utils.constants"), name)
    ours = getattr(importlib.import_module("accelerando.utils.constants"), name)
    if name == "STR_OPERATION_TO_FUNC":
        assert {k: v(2, 1) for k, v in ours.items()} == {k: v(2, 1) for k, v in theirs.items()}
    else:
        assert ours == theirs


def test_top_level_and_new_modules() -> None:
    assert (
        accelerando.ParallelismConfig
        is importlib.import_module("accelerando.parallelism_config").ParallelismConfig
    )
    assert accelerando.ParallelismConfig is accelerando.utils.ParallelismConfig
    for module in ("versions", "launch", "environment"):
        importlib.import_module(f"accelerate.utils.{module}")
        importlib.import_module(f"accelerando.utils.{module}")
    assert callable(accelerando.as_accelerate)


def test_fp8_recipe_kwargs_kept_for_accelerate_1_0_code() -> None:
    """Removed after Accelerate 1.0; `accelerate.utils.FP8RecipeKwargs` code still imports it here."""
    from accelerando.utils import FP8RecipeKwargs
    from accelerando.utils.dataclasses import FP8RecipeKwargs as same

    assert FP8RecipeKwargs is same
    assert not hasattr(accelerate.utils, "FP8RecipeKwargs")


def test_every_accelerate_name_transformers_and_peft_import_exists_here() -> None:
    """Scan the installed transformers and peft for `from accelerate[.x] import y` (absolute
    imports only) and find each `y` at the same path under accelerando."""
    import ast
    import importlib
    import importlib.util
    from pathlib import Path

    missing, seen = [], 0
    for package in ("transformers", "peft"):
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:
            continue
        for path in Path(spec.origin).parent.rglob("*.py"):
            text = path.read_text(errors="ignore")
            if "from accelerate" not in text:
                continue
            for node in ast.walk(ast.parse(text)):
                if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                    continue
                if node.module != "accelerate" and not node.module.startswith("accelerate."):
                    continue
                ours = importlib.import_module("accelerando" + node.module[len("accelerate") :])
                for alias in node.names:
                    seen += 1
                    if not hasattr(ours, alias.name):
                        missing.append(f"{path.name}: from {node.module} import {alias.name}")
    assert not missing, missing
    assert seen > 50 or importlib.util.find_spec("transformers") is None
