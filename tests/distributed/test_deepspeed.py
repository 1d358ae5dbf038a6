"""DeepSpeed ZeRO 0-3 on 2 real gloo ranks, against plain PyTorch: one launch runs every check
(scripts/deepspeed_checks.py: stage parity with DDP, config optimizer/scheduler, a ZeRO-2 student
distilled from a ZeRO-3 teacher with a bit-identical save/load round trip and the frozen teacher's
save_model reloaded into the plain model, a ZeRO-3 Llama saved for transformers, a contradiction
refused before any engine is built); a second launch resumes the first one's ZeRO-1/2/3 and
distillation checkpoints in fresh processes."""

from __future__ import annotations

from pathlib import Path

from accelerando.testing import run_distributed

SCRIPTS = Path(__file__).parent / "scripts"


def test_deepspeed_matches_pytorch_on_two_ranks(tmp_path: Path) -> None:
    work = ("--work", str(tmp_path))
    proc = run_distributed(SCRIPTS / "deepspeed_checks.py", args=work, timeout=420)
    for line in ("stages OK", "dummies OK", "distillation OK", "llama OK", "refusal OK", "DEEPSPEED_OK"):
        assert line in proc.stdout, proc.stdout[-4000:]
    assert "deepspeed_shm_comm" not in proc.stdout + proc.stderr  # the JIT-built op stayed off

    # The checkpoints saved above, loaded by new processes: training continues bit-identically.
    proc = run_distributed(SCRIPTS / "deepspeed_checks.py", args=(*work, "resume"), timeout=240)
    assert "fresh resume OK" in proc.stdout and "DEEPSPEED_OK" in proc.stdout, proc.stdout[-4000:]
