"""The Device interface: the one place that talks to a backend's device module (`torch.cuda`, ...)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch

_RESERVE_MARGIN = 1 << 30  # bytes left free when warming the allocator (other processes, kernels' workspaces)


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

    def compute_capability(self, index: int = 0) -> tuple[int, int] | None:
        """(major, minor) for devices that number their generations that way (CUDA); else None."""
        return None

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

    # Streams, pinned memory and allocator warm-up: what big-model loading and offload prefetch use.
    # A backend without streams returns None; callers then copy synchronously, with the same result.

    def _stream_api(self, name: str) -> Any | None:
        try:
            return getattr(self.module(), name, None)
        except (ImportError, RuntimeError):
            return None

    def new_stream(self, device: torch.device) -> Any | None:
        """A new side stream on `device` (copies there overlap compute), or None if the backend has none."""
        factory = self._stream_api("Stream")
        try:
            return None if factory is None else factory(device=device)
        except (RuntimeError, TypeError, AssertionError):
            return None

    def current_stream(self, device: torch.device) -> Any | None:
        """The stream work on `device` is queued on now (None if the backend has no streams or no device)."""
        getter = self._stream_api("current_stream")
        try:
            return None if getter is None else getter(device)
        except (RuntimeError, TypeError, AssertionError, ValueError):
            return None

    def use_stream(self, stream: Any | None) -> AbstractContextManager[Any]:
        """Within the block, allocations and copies on this device go to `stream` (no-op for None)."""
        return nullcontext() if stream is None else self.module().stream(stream)

    def record_stream(self, tensor: torch.Tensor, stream: Any | None) -> None:
        """Tell the caching allocator that `tensor`, allocated on another stream, is used on `stream`."""
        if stream is not None:
            tensor.record_stream(stream)

    def pinned_empty(self, nbytes: int) -> torch.Tensor:
        """Page-locked host bytes (DMA straight to the device, asynchronously); pageable if pinning fails."""
        try:
            return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        except RuntimeError:
            return torch.empty(nbytes, dtype=torch.uint8)

    def reserve_memory(self, nbytes: int, device: torch.device) -> int:
        """Warm the caching allocator with one block of about `nbytes` on `device`; returns the bytes taken.

        The many allocations that follow (one per loaded weight) then split that block instead of
        each asking the driver for memory. Reserved-but-free memory counts; 1 GiB stays free.
        """
        module = self.module()
        if not all(hasattr(module, n) for n in ("memory_reserved", "memory_allocated", "mem_get_info")):
            return 0
        try:
            index = device.index if device.index is not None else int(module.current_device())
            free, _ = module.mem_get_info(index)
            idle = int(module.memory_reserved(index)) - int(module.memory_allocated(index))
        except (RuntimeError, AssertionError):
            return 0
        size = min(nbytes, int(free) + idle - _RESERVE_MARGIN)
        if size <= idle:
            return 0
        try:
            block = torch.empty(size, dtype=torch.uint8, device=torch.device(self.type, index))
        except RuntimeError:  # out of memory: loading then allocates piece by piece, as without warm-up
            return 0
        del block
        return size

    def __repr__(self) -> str:
        return f"{type(self).__name__}(type={self.type!r}, backend={self.dist_backend!r})"
