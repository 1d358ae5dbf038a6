"""Every script in `examples/` runs on 2 CPU ranks and does what its docstring says.

Each example ends by printing `key=value` pairs; the tests read them. Arguments are cut to the
smallest run that still shows the feature, to keep the suite fast.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from accelerando.testing.distributed import run_distributed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BY_FEATURE = EXAMPLES / "by_feature"
pytestmark = pytest.mark.timeout(600)  # above run_distributed's own timeout, which kills the ranks


def result(stdout: str) -> dict[str, str]:
    """The `key=value` pairs of the last line that has any."""
    for line in reversed(stdout.splitlines()):
        pairs = dict(part.split("=", 1) for part in line.split() if "=" in part)
        if pairs:
            return pairs
    raise AssertionError(f"no key=value line in:\n{stdout[-3000:]}")


def test_every_example_on_two_ranks_in_one_launch(tmp_path):
    """One launch runs them all in turn (tests/integration/scripts/run_examples.py resets the runtime).

    Each script ends with its prepared model going out of scope after `end_training()`; this used to
    hang a rank under load (a gloo group destroyed by the DDP reducer while the GIL was held), which
    strategies/ddp.py's `GroupKeeper` prevents.
    """
    runs = [
        ("nlp", EXAMPLES / "nlp_example.py", "--epochs", "3", "--batch_size", "16"),
        ("cv", EXAMPLES / "cv_example.py", "--epochs", "1", "--train_size", "512"),
        ("accumulation", BY_FEATURE / "gradient_accumulation.py", "--gradient_accumulation_steps", "4", "--epochs", "1"),
        ("metrics", BY_FEATURE / "multi_process_metrics.py", "--epochs", "1"),
        ("early_stopping", BY_FEATURE / "early_stopping.py", "--target_loss", "0.5"),
        ("memory", BY_FEATURE / "memory.py", "--starting_batch_size", "100", "--simulate_oom_above", "80", "--epochs", "1"),
        ("profiler", BY_FEATURE / "profiler.py", "--trace_dir", str(tmp_path / "traces"), "--steps", "3"),
        ("local_sgd", BY_FEATURE / "local_sgd.py", "--epochs", "1", "--local_sgd_steps", "4"),
        ("full", BY_FEATURE / "checkpointing.py", "--epochs", "2", "--output_dir", str(tmp_path / "full")),
        ("cut", BY_FEATURE / "checkpointing.py", "--epochs", "2", "--output_dir", str(tmp_path / "cut"), "--stop_after", "25"),
        ("resumed", BY_FEATURE / "checkpointing.py", "--epochs", "2", "--output_dir", str(tmp_path / "cut"),
         "--resume_from_checkpoint", "latest"),
        ("tracking", BY_FEATURE / "tracking.py", "--epochs", "1", "--project_dir", str(tmp_path / "tb")),
    ]  # fmt: skip
    argv: list[str] = []
    for _, script, *args in runs:
        argv += [str(script), *args, "--"]
    proc = run_distributed(Path(__file__).parent / "scripts" / "run_examples.py", argv, timeout=420)
    lines = [line.split(" ", 2) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(lines) == len(runs), proc.stdout[-4000:]
    out = {name: result(line[2]) for (name, *_), line in zip(runs, lines)}

    assert out["nlp"]["eval_samples"] == "501" and float(out["nlp"]["accuracy"]) > 0.9, out["nlp"]
    assert out["cv"]["eval_samples"] == "301" and float(out["cv"]["accuracy"]) > 0.9, out["cv"]
    assert int(out["accumulation"]["optimizer_steps"]) * 4 == int(out["accumulation"]["batches"]) == 16
    assert out["metrics"]["eval_samples"] == out["metrics"]["dataset"] == "203", out["metrics"]
    assert out["early_stopping"]["stopped_early"] == "True", out["early_stopping"]
    assert out["memory"]["tried"] == "100,90,81,72" and out["memory"]["batch_size"] == "72", out["memory"]
    for rank in (0, 1):
        trace = json.loads((tmp_path / "traces" / f"profile_{rank}.json").read_text())
        assert any("addmm" in event.get("name", "") for event in trace["traceEvents"])
    assert out["local_sgd"]["replicas_equal"] == "True", out["local_sgd"]
    assert out["cut"]["stopped_at"] == "25", out["cut"]
    assert out["resumed"]["final_step"] == out["full"]["final_step"] == "32", (out["full"], out["resumed"])
    assert out["resumed"]["weights"] == out["full"]["weights"], (out["full"], out["resumed"])
    _check_tensorboard_run(out["tracking"], tmp_path / "tb" / "tracking_example")


def _check_tensorboard_run(printed: dict[str, str], log_dir: Path) -> None:
    """The event files hold one loss per step (steps 0..n-1) and the epoch's accuracy, as printed."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    assert printed["log_dir"] == str(log_dir), printed
    events = EventAccumulator(str(log_dir)).Reload()
    losses = events.Scalars("train_loss")
    assert [e.step for e in losses] == list(range(int(printed["steps"]))) and len(losses) == 16
    assert losses[-1].value == pytest.approx(float(printed["last_loss"]), rel=1e-6)
    assert losses[0].value > losses[-1].value  # it trained
    (accuracy,) = events.Scalars("accuracy")
    assert accuracy.step == 15 and accuracy.value == pytest.approx(float(printed["accuracy"]), rel=1e-6)
    assert (log_dir / "hparams.yml").is_file()


def test_fsdp_example_is_sharded_by_the_launcher_alone(tmp_path):
    cli = str(Path(sys.executable).with_name("accelerando"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERANDO_", "ACCELERATE_", "FSDP_"))}
    env.update(HF_HOME=str(tmp_path), OMP_NUM_THREADS="1")
    cmd = [cli, "launch", "--cpu", "--num_processes", "2", "--use_fsdp", "--fsdp_version", "2",
           str(BY_FEATURE / "fsdp_with_peak_mem_tracking.py"), "--epochs", "1"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=200, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    # two processes share the pipe: a line of one rank may land after the other's unfinished line
    ranks = ["rank=" + part.splitlines()[0] for part in proc.stdout.split("rank=")[1:]]
    assert len(ranks) == 2, proc.stdout
    for line in ranks:
        fields = result(line)
        assert fields["distributed_type"] == "FSDP", line
        assert 2 * int(fields["parameter_bytes"]) == int(line.split(" of ")[1].split()[0]), line
