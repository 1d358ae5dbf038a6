"""Public helpers for testing code that uses accelerando."""

from accelerando.testing.distributed import free_port, run_distributed, torchrun_command
from accelerando.testing.markers import require_cuda, require_multi_cuda, require_package

__all__ = [
    "free_port",
    "require_cuda",
    "require_multi_cuda",
    "require_package",
    "run_distributed",
    "torchrun_command",
]
