"""The Device interface: the one place that talks to a backend's device module (`torch.cuda`, ...)."""

from __future__ import annotations

from typing import Any

import torch


class Device:
    """A device kind (cpu, cuda, xpu, ...), thin over `torch.get_device_module`.

    Subclasses set `type` and `dist_backend`; the generic methods work for every backend that
    follows the `torch.cuda` module shape, which all in-tree accelerators do.
    """

    type: str = ""
    dist_backend: str = "gloo"
    rng_type: str = ""

    def module(self) -> Any:
        return torch.get_device_module(self.type)

    def is_available(self) -> bool:
        try:
            return bool(self.module().is_available())
        except (AttributeError, RuntimeError, AssertionError):
            return False

    def device_count(self) -> int:
        return int(self.module().device_count()) if self.is_available() else 0

    def torch_device(self, index: int | None = None) -> torch.device:
        return torch.device(self.type) if index is None else torch.device(self.type, index)

    def set_current(self, index: int) -> None:
        self.module().set_device(index)

    def synchronize(self) -> None:
        self.module().synchronize()

    def empty_cache(self) -> None:
        self.module().empty_cache()

    def memory_stats(self, index: int = 0) -> dict[str, Any]:
        return dict(self.module().memory_stats(index))

    def mem_get_info(self, index: int = 0) -> tuple[int, int]:
        """(free, total) bytes of device `index`."""
        free, total = self.module().mem_get_info(index)
        return int(free), int(total)

    def supports_dtype(self, dtype: torch.dtype) -> bool:
        if dtype == torch.bfloat16:
            checker = getattr(self.module(), "is_bf16_supported", None)
            return bool(checker()) if checker is not None else True
        return True

    def get_rng_state(self) -> Any:
        return self.module().get_rng_state_all()

    def set_rng_state(self, state: Any) -> None:
        self.module().set_rng_state_all(state)

    def manual_seed_all(self, seed: int) -> None:
        self.module().manual_seed_all(seed)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(type={self.type!r}, backend={self.dist_backend!r})"
