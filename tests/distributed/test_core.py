"""Core behaviour on 2 real gloo processes."""

import os
import subprocess
import sys
import time
from pathlib import Path

from accelerando.testing import free_port, run_distributed
from accelerando.testing.distributed import native_failures

SCRIPTS = Path(__file__).parent / "scripts"


def test_core_checks_on_two_ranks():
    proc = run_distributed(SCRIPTS / "core_ddp.py", timeout=240)
    assert "core checks passed" in proc.stdout


def test_failing_rank_ends_the_job_with_its_traceback():
    start = time.monotonic()
    proc = run_distributed(SCRIPTS / "core_crash.py", expect_success=False, timeout=120)
    assert time.monotonic() - start < 30
    assert "rank one exploded on purpose" in proc.stderr
    assert "[accelerando] rank 1 failed" in proc.stderr


def test_script_without_cleanup_or_with_end_training_exits_zero_every_time():
    """Without a launcher agent, so a gloo abort at interpreter exit would show as a non-zero code.

    Rank 0 hosts the store here (`tcp://`): a peer still meeting through it after rank 0 left would
    print a C++ stack trace."""
    for attempt in range(4):
        args = ["end"] if attempt % 2 else []
        port = free_port()
        procs = []
        for rank in range(2):
            env = {
                **os.environ,
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            }
            procs.append(
                subprocess.Popen(
                    [sys.executable, str(SCRIPTS / "core_clean_exit.py"), *args],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                )
            )
        for rank, p in enumerate(procs):
            out, err = p.communicate(timeout=120)
            assert p.returncode == 0, f"attempt {attempt} rank {rank} exited {p.returncode}\n{out}\n{err}"
            assert "[0, 1]" in out
            assert not native_failures(out + err), f"attempt {attempt} rank {rank} printed a C++ trace\n{err}"
