"""Drop the known, harmless lines other libraries print when they are imported next to accelerando.

A default install prints, per rank, when transformers imports torchao: "Failed to load .../torchao/
_C_*.so" for each prebuilt kernel library built for another Python or CUDA (torchao then runs
without those kernels), and torch's "<enum ...> is an Enum subclass and is now natively supported"
for torchao's enums. Only those records are filtered, at the loggers that emit them; anything else
those loggers say still shows. `ACCELERANDO_SHOW_IMPORT_NOISE=1` keeps them.
"""

from __future__ import annotations

import logging
import sys


def _from_torchao() -> bool:
    """Whether torchao's code is on the current call stack (torch's warning names no module)."""
    frame = sys._getframe(1)
    while frame is not None:
        if "torchao" in frame.f_code.co_filename.replace("\\", "/").split("/"):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class _TorchaoNoise(logging.Filter):
    dropped = 0  # how many records were filtered, in this process (for tests)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.name == "torchao":
            noise = message.startswith("Failed to load ") and "/_C" in message and ".so" in message
        else:
            noise = "is an Enum subclass and is now natively supported" in message and _from_torchao()
        _TorchaoNoise.dropped += noise
        return not noise


def silence_known_import_noise() -> None:
    """Install the filter once (importing accelerando calls it)."""
    from accelerando.config import env

    if env.flag("SHOW_IMPORT_NOISE"):
        return
    for name in ("torchao", "torch.utils._pytree"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _TorchaoNoise) for f in logger.filters):
            logger.addFilter(_TorchaoNoise())
