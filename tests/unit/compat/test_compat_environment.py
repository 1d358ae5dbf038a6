"""utils.environment / utils.other / utils.imports helpers, compared with Accelerate's."""

from __future__ import annotations

import logging
import os
import platform
import unittest
from collections import OrderedDict
from pathlib import Path
from unittest import mock

import accelerate.utils.environment as their_env
import accelerate.utils.imports as their_imports
import accelerate.utils.other as their_other
import pytest
import torch

import accelerando.utils.environment as our_env
import accelerando.utils.imports as our_imports
import accelerando.utils.other as our_other


def test_convert_dict_to_env_variables_matches_accelerate(caplog: pytest.LogCaptureFixture) -> None:
    env = {
        "ACCELERATE_DEBUG_MODE": "1",
        "BAD": "<x",
        "SPACE": "a b",
        "EMPTY": "",
        "": "v",
        "OK": "2",
        "NL": "a\nb",
    }
    assert our_env.convert_dict_to_env_variables(env) == their_env.convert_dict_to_env_variables(env)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="accelerando.utils.environment"):
        assert our_env.convert_dict_to_env_variables(env) == ["ACCELERATE_DEBUG_MODE=1\n", "OK=2\n"]
    skipped = [r for r in caplog.records if r.name == "accelerando.utils.environment"]
    assert len(skipped) == 5 and "Skipping BAD=<x" in skipped[0].getMessage()


def test_str_to_bool_matches_accelerate() -> None:
    for value in ("y", "yes", "t", "true", "on", "1", "n", "no", "f", "false", "off", "0", "TRUE"):
        assert our_env.str_to_bool(value) == their_env.str_to_bool(value)
        assert our_env.str_to_bool(value, to_bool=True) is bool(their_env.str_to_bool(value))
    with pytest.raises(ValueError):
        our_env.str_to_bool("maybe")


def _set_and_change(extra: str) -> None:
    os.environ[f"ACCELERATE_{extra}"] = "set inside"
    os.environ["ACCELERATE_EXISTING"] = "changed inside"
    os.environ[f"ACCELERANDO_{extra}"] = "set inside"


@pytest.mark.parametrize(
    "purge", [our_env.purge_accelerate_environment, their_env.purge_accelerate_environment]
)
def test_purge_on_a_function_restores_accelerate_variables(purge, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ACCELERATE_EXISTING", "before")
    purged = purge(_set_and_change)
    assert purged.__name__ == "_set_and_change"
    purged("NEW")
    assert os.environ["ACCELERATE_EXISTING"] == "before" and "ACCELERATE_NEW" not in os.environ
    if purge is our_env.purge_accelerate_environment:  # ours also restores our own prefix
        assert "ACCELERANDO_NEW" not in os.environ
    else:
        os.environ.pop("ACCELERANDO_NEW")


@pytest.mark.parametrize(
    "purge", [our_env.purge_accelerate_environment, their_env.purge_accelerate_environment]
)
def test_purge_on_a_class_wraps_test_methods_also_of_subclasses(
    purge, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCELERATE_EXISTING", "before")

    @purge
    class Base(unittest.TestCase):
        def test_sets(self) -> None:
            os.environ["ACCELERATE_FROM_BASE"] = "1"

        def helper(self) -> None:
            os.environ["ACCELERATE_FROM_HELPER"] = "1"

    class Child(Base):
        def test_child(self) -> None:
            os.environ["ACCELERATE_EXISTING"] = "changed"
            os.environ["ACCELERATE_FROM_CHILD"] = "1"

    child = Child("test_child")
    child.test_child()
    child.test_sets()
    child.helper()
    assert os.environ["ACCELERATE_EXISTING"] == "before"
    assert "ACCELERATE_FROM_CHILD" not in os.environ and "ACCELERATE_FROM_BASE" not in os.environ
    assert os.environ.pop("ACCELERATE_FROM_HELPER") == "1"  # not a test method: left alone


def _kernel_warnings(module, release: str, system: str = "Linux") -> int:
    uname = platform.uname_result(system, "host", release, "#1", "x86_64")
    with mock.patch("platform.uname", return_value=uname), mock.patch.object(module, "logger") as logger:
        module.check_os_kernel()
    return logger.warning.call_count


@pytest.mark.parametrize(
    "release", ["4.15.0-generic", "5.4.99", "5.5.0", "6.8.0-45-generic", "5.10", "weird"]
)
def test_check_os_kernel_warns_like_accelerate(release: str) -> None:
    assert _kernel_warnings(our_other, release) == _kernel_warnings(their_other, release)
    assert _kernel_warnings(our_other, release, system="Darwin") == 0


def test_check_os_kernel_message(caplog: pytest.LogCaptureFixture) -> None:
    uname = platform.uname_result("Linux", "host", "5.4.0", "#1", "x86_64")
    with mock.patch("platform.uname", return_value=uname), caplog.at_level(logging.WARNING):
        our_env.check_os_kernel()
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "Detected kernel version 5.4.0, which is below the recommended minimum of 5.5.0" in caplog.text


def test_availability_probes_match_accelerate() -> None:
    for name in ("is_datasets_available", "is_pytest_available", "is_hpu_available"):
        assert getattr(our_imports, name)() == bool(getattr(their_imports, name)()), name
    assert our_imports.is_pytest_available() is True
    with mock.patch.object(our_imports, "_has", lambda module: module == "datasets"):
        assert our_imports.is_datasets_available() is True


def test_save_main_process_torch_and_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    weight = torch.arange(6.0).reshape(2, 3)
    state = {"a.weight": weight, "tied.weight": weight, "b": torch.ones(3)[::2]}
    our_other.save({"x": 1, "t": weight}, tmp_path / "obj.pt")
    assert torch.load(tmp_path / "obj.pt")["x"] == 1
    our_other.save(state, tmp_path / "m.safetensors", safe_serialization=True)
    their_other.save(OrderedDict(state), tmp_path / "theirs.safetensors", safe_serialization=True)
    mine, reference = load_file(tmp_path / "m.safetensors"), load_file(tmp_path / "theirs.safetensors")
    assert mine.keys() == reference.keys() == {"a.weight", "b"}
    assert all(torch.equal(mine[k], reference[k]) for k in mine)
    with pytest.raises(TypeError, match="dict of tensors"):
        our_other.save([weight], tmp_path / "list.safetensors", safe_serialization=True)
