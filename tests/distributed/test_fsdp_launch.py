"""`accelerando launch` with an Accelerate-style `fsdp_config` file plus a flag: the FSDP2 strategy
inside the 2 processes sees the merged settings (flags override the file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).parent / "scripts" / "fsdp_launched.py"
CONFIG = """\
compute_environment: LOCAL_MACHINE
distributed_type: FSDP
num_processes: 2
mixed_precision: 'no'
use_cpu: true
fsdp_config:
  fsdp_version: 2
  fsdp_auto_wrap_policy: SIZE_BASED_WRAP
  fsdp_min_num_params: 100
  fsdp_reshard_after_forward: false
  fsdp_state_dict_type: SHARDED_STATE_DICT
"""


def test_launch_with_fsdp_config_file_and_flag(tmp_path: Path) -> None:
    config = tmp_path / "fsdp.yaml"
    config.write_text(CONFIG)
    cmd = [
        sys.executable,
        "-m",
        "accelerando.commands.main",
        "launch",
        "--config_file",
        str(config),
        "--fsdp_state_dict_type",
        "FULL_STATE_DICT",
        str(SCRIPT),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    reports = [
        json.loads(line[len("RESULT ") :]) for line in proc.stdout.splitlines() if line.startswith("RESULT ")
    ]
    assert sorted(r["rank"] for r in reports) == [0, 1], proc.stdout
    for report in reports:
        assert report["distributed_type"] == "FSDP" and report["sharded"]
        assert report["reshard_after_forward"] is False and report["auto_wrap_policy"] == "size_based_wrap"
        assert report["min_num_params"] == 100 and report["units"] == 2
        assert report["state_dict_type"] == "FULL_STATE_DICT"  # the flag beat the file
