"""What Accelerate's own test scripts and transformers touch, compared with Accelerate on the same input.

The scripts themselves run on 2 ranks in tests/distributed/test_accelerate_dropin.py; these are
the single-process checks of each name and behaviour they needed.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import accelerate.data_loader as their_data
import accelerate.test_utils as their_tests
import accelerate.utils as their_utils
import accelerate.utils.dataclasses as their_dataclasses
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import accelerando.test_utils as our_tests
import accelerando.utils as our_utils
from accelerando import Accelerator, FullyShardedDataParallelPlugin
from accelerando.commands.merge import merge_command, merge_command_parser
from accelerando.config import env
from accelerando.config.fsdp import get_module_class_from_name
from accelerando.config.options import DataLoaderConfiguration, DistributedType
from accelerando.data.samplers import SeedableRandomSampler
from accelerando.state import AcceleratorState, GradientState, PartialState


# ---- accelerate.test_utils ----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs", [{}, {"a": 1.5, "b": -2, "length": 10, "seed": 7}])
def test_regression_dataset_draws_what_accelerates_draws(kwargs: dict) -> None:
    ours, theirs = our_tests.RegressionDataset(**kwargs), their_tests.RegressionDataset(**kwargs)
    if "seed" in kwargs:
        np.testing.assert_array_equal(ours.x, theirs.x)
        np.testing.assert_array_equal(ours.y, theirs.y)
    assert len(ours) == len(theirs) and ours[3].keys() == theirs[3].keys()


def test_regression_model_and_launch_command_match(capsys: pytest.CaptureFixture[str]) -> None:
    x = torch.arange(4.0)
    assert torch.equal(our_tests.RegressionModel(2, 3)(x), their_tests.RegressionModel(2, 3)(x))
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == printed[1]  # the same dtype report, once each
    kw = {"num_processes": 2, "monitor_interval": 0.1, "use_cpu": True, "debug": False, "x": None}
    assert our_tests.get_launch_command(**kw) == their_tests.get_launch_command(**kw)
    assert our_tests.torch_device == their_tests.torch_device == "cpu"


def test_assert_exception_checks_class_message_and_absence() -> None:
    with our_tests.assert_exception(ValueError, "bad"):
        raise ValueError("a bad value")
    with pytest.raises(AssertionError, match="Expected exception of type"):
        with our_tests.assert_exception(ValueError):
            pass
    with pytest.raises(AssertionError, match="but got"):
        with our_tests.assert_exception(KeyError):
            raise ValueError("x")


def test_are_the_same_tensors_in_one_process() -> None:
    Accelerator(cpu=True)
    assert our_tests.are_the_same_tensors(torch.tensor([1.0, 2.0]))


# ---- accelerate.utils -------------------------------------------------------------------------
def test_parse_flag_and_accelerator_backend_match(monkeypatch: pytest.MonkeyPatch) -> None:
    for value in ("1", "true", "no", "FALSE"):
        monkeypatch.setenv("SOME_FLAG", value)
        assert our_utils.parse_flag_from_env("SOME_FLAG") == their_utils.parse_flag_from_env("SOME_FLAG")
    monkeypatch.delenv("SOME_FLAG")
    assert our_utils.parse_flag_from_env("SOME_FLAG", True) is True
    assert our_utils.get_torch_accelerator_backend() == their_utils.get_torch_accelerator_backend()


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU())


class Net(torch.nn.Module):
    _no_split_modules = ["Block", "Absent"]

    def __init__(self) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block()])
        self.head = torch.nn.Linear(2, 1)


def test_get_module_class_from_name_matches() -> None:
    model = Net()
    for name in ("Block", "Linear", "ReLU", "Net", "ModuleList", "Missing"):
        assert get_module_class_from_name(model, name) is their_dataclasses.get_module_class_from_name(
            model, name
        )


def test_set_auto_wrap_policy_fills_and_checks_class_names() -> None:
    plugin = FullyShardedDataParallelPlugin(auto_wrap_policy="TRANSFORMER_BASED_WRAP")
    plugin.set_auto_wrap_policy(Net())
    assert plugin.transformer_cls_names_to_wrap == ["Block"]  # of _no_split_modules, those present
    wrong = FullyShardedDataParallelPlugin(
        auto_wrap_policy="transformer_based_wrap", transformer_cls_names_to_wrap="Layer"
    )
    with pytest.raises(ValueError, match="Could not find the transformer layer class Layer in the model"):
        wrong.set_auto_wrap_policy(Net())
    FullyShardedDataParallelPlugin().set_auto_wrap_policy(Net())  # no policy named: nothing to check


def test_merge_command_has_accelerates_arguments(tmp_path: Path) -> None:
    args = merge_command_parser().parse_args(
        [str(tmp_path / "ckpt"), str(tmp_path), "--unsafe_serialization"]
    )
    assert (args.checkpoint_directory, args.unsafe_serialization, args.remove_checkpoint_dir) == (
        str(tmp_path / "ckpt"), True, False,
    )  # fmt: skip
    with pytest.raises(ValueError, match="is not a folder"):
        merge_command(args)


# ---- data ---------------------------------------------------------------------------------------
def test_seedable_sampler_advances_per_pass_like_accelerates() -> None:
    torch.manual_seed(3)
    ours = SeedableRandomSampler(range(10), data_seed=5)
    theirs = their_data.SeedableRandomSampler(range(10), data_seed=5)
    assert [list(ours) for _ in range(3)] == [list(theirs) for _ in range(3)]
    ours.set_epoch(1)  # from now on the caller chooses each epoch (prepared loaders do)
    assert list(ours) == list(ours)


# ---- state ------------------------------------------------------------------------------------
def test_state_debug_is_settable() -> None:
    state = PartialState(cpu=True)
    assert state.debug is False
    state.debug = True
    assert PartialState().debug is True
    state.debug = False


def test_shared_state_and_reset_errors_read_like_accelerates() -> None:
    assert AcceleratorState._shared_state == {}
    accelerator = Accelerator(cpu=True)
    assert AcceleratorState._shared_state != {} and PartialState._shared_state["num_processes"] == 1
    AcceleratorState._reset_state(reset_partial_state=True)
    assert AcceleratorState._shared_state == {}
    with pytest.raises(
        AttributeError, match=r"`AcceleratorState` object has no attribute `device`\. This happens if"
    ):
        accelerator.state.device  # noqa: B018
    with pytest.raises(AttributeError, match="`AcceleratorState._reset_state\\(\\)` was called"):
        accelerator.prepare(torch.nn.Linear(1, 1))
    Accelerator(cpu=True)
    assert accelerator.state.device == torch.device("cpu")  # a view reads the next runtime
    with pytest.raises(AttributeError, match="'PartialState' object has no attribute 'nothing'"):
        PartialState().nothing  # noqa: B018


def test_distributed_type_assigned_is_a_label() -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.state.distributed_type = DistributedType.FSDP
    assert accelerator.distributed_type == DistributedType.FSDP
    assert accelerator.strategy.distributed_type == DistributedType.NO  # what runs is unchanged
    accelerator.state.distributed_type = DistributedType.NO
    assert accelerator.distributed_type == DistributedType.NO
    with pytest.raises(ValueError):
        accelerator.state.distributed_type = "NOT_A_TYPE"


def test_gradient_state_binds_to_the_next_runtime() -> None:
    Accelerator(cpu=True)
    gradient = GradientState()
    AcceleratorState._reset_state(reset_partial_state=True)
    Accelerator(cpu=True, gradient_accumulation_steps=3)
    assert gradient.num_steps == 3


# ---- Accelerator --------------------------------------------------------------------------------
def test_accelerator_without_precision_keeps_the_configured_one() -> None:
    Accelerator(cpu=True, mixed_precision="bf16")
    assert Accelerator(cpu=True).mixed_precision == "bf16"
    with pytest.raises(ValueError, match="already has an Accelerator with mixed_precision='bf16'"):
        Accelerator(cpu=True, mixed_precision="no")


def test_dataloader_config_is_assignable() -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.dataloader_config = DataLoaderConfiguration(even_batches=False)
    assert accelerator.even_batches is False
    with pytest.raises(TypeError, match="must be a DataLoaderConfiguration"):
        accelerator.dataloader_config = {"even_batches": False}  # type: ignore[assignment]


class _Stream(IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(torch.arange(4.0))


def test_join_warns_for_iterable_loaders_and_for_strategies_that_cannot_join() -> None:
    accelerator = Accelerator(cpu=True)
    accelerator.prepare(DataLoader(_Stream(), batch_size=2), DataLoader(list(range(4)), batch_size=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with accelerator.join_uneven_inputs([], even_batches=False):
            pass
    assert any("only supported for map-style datasets" in str(w.message) for w in caught)
    AcceleratorState._reset_state(reset_partial_state=True)
    fsdp = Accelerator(cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    with pytest.warns(UserWarning, match="only supported for multi-GPU training.*'fsdp2' does not join"):
        with fsdp.join_uneven_inputs([]):
            pass


def test_switch_serves_accelerandos_cli_as_the_accelerate_command() -> None:
    """In a fresh interpreter: the `accelerate` console-script entry point and its module path."""
    code = textwrap.dedent(
        """
        import contextlib, importlib.metadata, io, sys
        import accelerando
        accelerando.as_accelerate()
        (point,) = importlib.metadata.entry_points(group="console_scripts", name="accelerate")
        import accelerate.commands.accelerate_cli as cli
        assert point.load() is cli.main is accelerando.commands.accelerate_cli.main
        out = io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):
            cli.main(["--help"])
        print(out.getvalue().splitlines()[0])
        """
    )
    child = {k: v for k, v in env.snapshot().items() if not k.startswith((env.PREFIX, env.ALIAS_PREFIX))}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=child, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("usage: accelerate")
    assert proc.stderr.count("accelerate: this is accelerando") == 1  # said once, before anything else
