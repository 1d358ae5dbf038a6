"""A CPU device that reports streams and events, logging every use (the CUDA protocol, checked on CPU).

Copies still happen on the CPU, synchronously; what the tests check is the order of the calls a
real stream backend relies on: buffer reuse only after its transfer's event, the compute stream
waiting for a prefetch's event before the block runs, tensors recorded on the compute stream.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Any

import torch

from accelerando.devices.cpu import CpuDevice

_ids = itertools.count()


class LoggedEvent:
    def __init__(self, log: list[tuple], stream: str) -> None:
        self.id = next(_ids)
        self.log = log
        log.append(("record", stream, self.id))

    def synchronize(self) -> None:
        self.log.append(("sync", self.id))


class LoggedStream:
    def __init__(self, log: list[tuple], name: str) -> None:
        self.log = log
        self.name = name

    def record_event(self) -> LoggedEvent:
        return LoggedEvent(self.log, self.name)

    def wait_event(self, event: LoggedEvent) -> None:
        self.log.append(("wait", self.name, event.id))

    def synchronize(self) -> None:
        self.log.append(("stream-sync", self.name))


class StreamedCpu(CpuDevice):
    """CpuDevice with a compute stream and side streams that log; copies stay synchronous on the CPU."""

    def __init__(self) -> None:
        self.log: list[tuple] = []
        self.compute = LoggedStream(self.log, "compute")
        self.sides = 0

    def new_stream(self, device: torch.device) -> Any | None:
        self.sides += 1
        return LoggedStream(self.log, f"side{self.sides}")

    def current_stream(self, device: torch.device) -> Any | None:
        return self.compute

    @contextmanager
    def use_stream(self, stream: Any | None):  # type: ignore[override]
        name = None if stream is None else stream.name
        self.log.append(("enter", name))
        try:
            yield
        finally:
            self.log.append(("exit", name))

    def record_stream(self, tensor: torch.Tensor, stream: Any | None) -> None:
        self.log.append(("record_stream", id(tensor), None if stream is None else stream.name))
