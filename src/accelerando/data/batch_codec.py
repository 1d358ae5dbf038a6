"""How a batch becomes bytes for another process, and back.

A batch is its structure (tensors replaced by slots) plus each tensor. `encode` / `pack` lay the
pickled structure and every tensor's bytes out in one buffer (for the shared-memory ring and for
gloo); `RemoteCodec` instead names each tensor's address, for a receiver that copies the bytes
straight out of the sender's memory (`cross_memory`).
"""

from __future__ import annotations

import pickle
import struct
from dataclasses import dataclass
from typing import Any

import torch

from accelerando.data import cross_memory
from accelerando.ops.tree import recursively_apply

_ALIGN = 64


@dataclass(frozen=True)
class _Slot:
    index: int


def _aligned(n: int) -> int:
    return -(-n // _ALIGN) * _ALIGN


def _nbytes(dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    numel = 1
    for d in shape:
        numel *= d
    return numel * torch.empty((), dtype=dtype).element_size()


def _layout(header_len: int, metas: list[tuple[torch.dtype, tuple[int, ...]]]) -> tuple[list[int], int]:
    offsets, pos = [], _aligned(header_len)
    for dtype, shape in metas:
        offsets.append(pos)
        pos = _aligned(pos + _nbytes(dtype, shape))
    return offsets, pos


@dataclass
class Packed:
    header: bytes
    tensors: list[torch.Tensor]
    offsets: list[int]
    total: int

    def write(self, buf: torch.Tensor) -> None:
        buf[: len(self.header)].copy_(torch.frombuffer(bytearray(self.header), dtype=torch.uint8))
        for t, off in zip(self.tensors, self.offsets):
            if t.numel():
                nbytes = t.numel() * t.element_size()
                buf[off : off + nbytes].view(t.dtype).view(t.shape).copy_(t)


def _split(batch: Any) -> tuple[Any, list[torch.Tensor], Any]:
    """(structure with tensors replaced by slots, the tensors in slot order, a key that names the
    structure exactly when the batch is a tensor, or a tuple, list or dict of tensors; else None)."""
    tensors: list[torch.Tensor] = []

    def take(t: torch.Tensor) -> _Slot:
        tensors.append(t.detach() if t.requires_grad else t)  # detach() costs a tensor each
        return _Slot(len(tensors) - 1)

    kind = type(batch)
    if kind is torch.Tensor:
        return take(batch), tensors, (kind,)
    if kind in (tuple, list) and all(type(x) is torch.Tensor for x in batch):
        return kind(take(x) for x in batch), tensors, (kind, len(batch))
    if kind is dict and all(type(x) is torch.Tensor for x in batch.values()):
        return {k: take(v) for k, v in batch.items()}, tensors, (kind, tuple(batch))
    return recursively_apply(take, batch), tensors, None


def _join(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    return recursively_apply(lambda s: tensors[s.index], skeleton, test_type=lambda x: isinstance(x, _Slot))


def pack(batch: Any) -> Packed:
    """Plan the buffer for `batch`: its pickled skeleton and where each tensor's bytes go."""
    skeleton, tensors, _ = _split(batch)
    metas = [(t.dtype, tuple(t.shape)) for t in tensors]
    header = pickle.dumps((skeleton, metas), protocol=pickle.HIGHEST_PROTOCOL)
    offsets, total = _layout(len(header), metas)
    return Packed(header, tensors, offsets, total)


class RemoteCodec:
    """Describes batches by address for a cross-memory receiver, re-using the description of the
    structure (pickled skeleton, dtypes, shapes) while it repeats, as it does batch after batch.

    A message is that description followed by one (address, bytes) pair per tensor.
    """

    def __init__(self) -> None:
        self._key: Any = None
        self._layout: Any = None
        self._header = b""

    def pack(self, batch: Any) -> tuple[bytes, bytes, list[torch.Tensor]]:
        """(structure, addresses, the tensors to keep alive until the receiver has read them)."""
        skeleton, tensors, key = _split(batch)
        tensors = [t.contiguous() if t.is_cpu else t.cpu().contiguous() for t in tensors]
        metas = [(t.dtype, t.shape) for t in tensors]
        if key is None or (key, metas) != self._key:
            self._key = None if key is None else (key, metas)
            self._header = pickle.dumps((skeleton, metas), protocol=pickle.HIGHEST_PROTOCOL)
        where = [v for t in tensors for v in (t.data_ptr(), t.numel() * t.element_size())]
        return self._header, struct.pack(f"<{len(where)}q", *where), tensors

    def unpack(self, header: bytes, where: bytes, pid: int, pin: bool) -> Any:
        """In the receiving process: copy each tensor out of process `pid`."""
        if header != self._header:
            self._header, self._layout = header, pickle.loads(header)
        skeleton, metas = self._layout
        tensors = [torch.empty(shape, dtype=dtype, pin_memory=pin) for dtype, shape in metas]
        pairs = struct.unpack(f"<{len(where) // 8}q", where)
        cross_memory.read(pid, list(zip(pairs[::2], pairs[1::2])), tensors)
        return _join(skeleton, tensors)


def encode(batch: Any) -> tuple[torch.Tensor, int]:
    packed = pack(batch)
    buf = torch.empty(packed.total, dtype=torch.uint8)
    packed.write(buf)
    return buf, len(packed.header)


def decode(buf: torch.Tensor, header_len: int) -> Any:
    """Inverse of `encode`; the tensors are views into `buf` (no copy)."""
    skeleton, metas = pickle.loads(buf[:header_len].numpy().tobytes())
    offsets, _ = _layout(header_len, metas)
    tensors = []
    for (dtype, shape), off in zip(metas, offsets):
        nbytes = _nbytes(dtype, shape)
        tensors.append(
            buf[off : off + nbytes].view(dtype).view(shape) if nbytes else torch.empty(shape, dtype=dtype)
        )
    return _join(skeleton, tensors)
