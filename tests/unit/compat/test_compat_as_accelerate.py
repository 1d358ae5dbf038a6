"""The `import accelerate` switch, each check in a fresh interpreter (the switch changes sys.modules)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from accelerando._as_accelerate import ACCELERATE_VERSION
from accelerando.config import env

ENV_FLAG = env.PREFIX + "AS_ACCELERATE"


def run_python(code: str, flag: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `code` in a new interpreter with this environment (minus any switch flag, unless given)."""
    child = {
        k: v for k, v in env.snapshot().items() if k not in (ENV_FLAG, env.ALIAS_PREFIX + "AS_ACCELERATE")
    }
    if flag is not None:
        child[ENV_FLAG] = flag
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=child, capture_output=True, text=True, timeout=240
    )


def check(code: str, flag: str | None = None) -> str:
    proc = run_python(code, flag)
    assert proc.returncode == 0, f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
    return proc.stdout


def test_every_accelerate_module_is_the_accelerando_module_and_patching_either_path_patches_it() -> None:
    out = check(
        """
        import sys
        import accelerando
        accelerando.as_accelerate()
        import accelerate.utils.operations as a
        import accelerando.utils.operations as b
        assert a is b and a.__name__ == "accelerando.utils.operations"
        assert a.__spec__.name == "accelerando.utils.operations"  # the module keeps its own spec
        import accelerate, accelerate.utils
        assert accelerate is accelerando and accelerate.utils is accelerando.utils
        from accelerate import Accelerator, PartialState
        from accelerate.utils import DataLoaderConfiguration, gather
        assert Accelerator is accelerando.Accelerator and gather is accelerando.utils.gather
        from accelerate.parallelism_config import ParallelismConfig
        assert ParallelismConfig is accelerando.ParallelismConfig
        import accelerate.state
        assert sys.modules["accelerate.state"] is sys.modules["accelerando.state"]
        assert "site-packages/accelerate" not in (getattr(m, "__file__", "") or "" for m in sys.modules.values())
        import pickle
        config = DataLoaderConfiguration(split_batches=True)
        assert pickle.loads(pickle.dumps(config)) == config
        from unittest import mock
        calls = []
        with mock.patch("accelerate.utils.memory.clear_device_cache", lambda **kw: calls.append(kw)):
            accelerando.utils.memory.release_memory(1, 2)
        assert calls == [{"garbage_collection": True}], calls
        with mock.patch("accelerando.utils.memory.clear_device_cache", lambda **kw: calls.append("ours")):
            accelerate.utils.memory.release_memory(1)
        assert calls[-1] == "ours"
        # modules accelerando lacks: the error names the accelerando module that is missing
        for name in ("accelerate.utils.megatron_lm", "accelerate.no_such_module"):
            try:
                __import__(name)
            except ModuleNotFoundError as err:
                missing = "accelerando" + name.removeprefix("accelerate")
                assert err.name == name and repr(missing) in str(err), err
            else:
                raise AssertionError(name + " imported")
        print("same modules")
        """
    )
    assert "same modules" in out


def test_metadata_answers_the_compatible_accelerate_version() -> None:
    out = check(
        """
        import importlib.metadata as md, importlib.util
        import accelerando
        real = md.version("accelerate")
        accelerando.as_accelerate()
        print(real, md.version("accelerate"), md.metadata("accelerate")["Name"])
        assert importlib.util.find_spec("accelerate") is not None
        assert "accelerate" in md.packages_distributions()
        from transformers.utils import is_accelerate_available
        assert is_accelerate_available("1.12.0")
        """
    )
    real, served, name = out.split()
    assert served == ACCELERATE_VERSION and name == "accelerate"
    assert real != "" and real[0].isdigit()  # the installed wheel, untouched before the switch


def test_without_the_switch_nothing_changes_and_nothing_is_said() -> None:
    proc = run_python(
        """
        import logging, sys
        logging.basicConfig(level=logging.INFO)
        import accelerando, accelerate
        assert accelerate is not accelerando and "site-packages" in accelerate.__file__
        assert not accelerando._as_accelerate.is_active()
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "as_accelerate" not in proc.stderr + proc.stdout


def test_one_log_line_and_no_print() -> None:
    quiet = run_python("import accelerando; accelerando.as_accelerate(); import accelerate")
    assert quiet.returncode == 0 and quiet.stdout == "" and "as_accelerate" not in quiet.stderr
    logged = run_python(
        """
        import logging
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
        import accelerando
        accelerando.as_accelerate()
        accelerando.as_accelerate()  # a second call changes nothing and says nothing
        import accelerate
        """
    )
    lines = [line for line in logged.stderr.splitlines() if "as_accelerate" in line]
    assert len(lines) == 1 and lines[0].startswith("INFO accelerando._as_accelerate"), logged.stderr
    assert ACCELERATE_VERSION in lines[0]


def test_real_accelerate_already_imported_is_a_clear_error() -> None:
    proc = run_python(
        """
        import accelerate.utils
        import accelerando
        accelerando.as_accelerate()
        """
    )
    assert proc.returncode == 1
    assert "RuntimeError: accelerando.as_accelerate(): the real accelerate is already imported" in proc.stderr
    assert (
        "already imported (accelerate, " in proc.stderr
        and "call accelerando.as_accelerate() first" in proc.stderr
    )


def test_environment_variable_switches_at_import() -> None:
    check(
        """
        import accelerando, accelerate, importlib.metadata as md
        assert accelerate is accelerando and md.version("accelerate") == accelerando._as_accelerate.ACCELERATE_VERSION
        """,
        flag="1",
    )
    proc = run_python("import accelerate; import accelerando", flag="1")
    assert proc.returncode == 1 and "already imported" in proc.stderr
    proc = run_python("import accelerando", flag="maybe")
    assert proc.returncode == 1 and "ACCELERANDO_AS_ACCELERATE='maybe' is not a boolean" in proc.stderr
