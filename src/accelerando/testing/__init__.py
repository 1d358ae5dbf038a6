"""Public helpers for testing code that uses accelerando."""

from accelerando.testing.distributed import free_port, run_distributed, torchrun_command

__all__ = ["free_port", "run_distributed", "torchrun_command"]
