"""How a batch becomes bytes for another process, and back.

A batch is its structure (tensors replaced by slots) plus each tensor; its header is the pickled
structure with each tensor's dtype and shape. A message is either the tensors' bytes, aligned and
in order from its start, then the header (the shared-memory ring, gloo: tensors first, so that a
batch collated straight into a ring slot is already where the message wants it, `slot_collate`),
or the header then one (address, length) pair per tensor for a receiver that copies the bytes
straight out of the sender's memory (`cross_memory`). Each end
keeps the header of the last batch and its layout, and reuses them while the structure repeats,
as it does batch after batch (pickling it is a fifth of the cost of a message).
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
    return numel * dtype.itemsize


def place(buf: torch.Tensor, pos: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """The tensor of `dtype` and `shape` at byte `pos` of `buf` (what `decode` and a collation
    into a ring slot both build)."""
    return buf[pos : pos + _nbytes(dtype, shape)].view(dtype).view(shape)


def next_offset(pos: int, dtype: torch.dtype, shape: tuple[int, ...]) -> int:
    """Where the tensor after one of `dtype` and `shape` at `pos` starts."""
    return _aligned(pos + _nbytes(dtype, shape))


def _layout(header_len: int, metas: list[tuple[torch.dtype, tuple[int, ...]]]) -> tuple[list[int], int]:
    """(each tensor's offset, the message's total bytes): the tensors from 0, the header after them."""
    offsets, pos = [], 0
    for dtype, shape in metas:
        offsets.append(pos)
        pos = next_offset(pos, dtype, shape)
    return offsets, pos + header_len


@dataclass
class Packed:
    """A message: each tensor's bytes at its offset then the header or, when `where` is given,
    the header then the tensors' addresses (the tensors must then live until the receiver has read them)."""

    header: bytes
    tensors: list[torch.Tensor]
    offsets: list[int]
    total: int
    where: bytes = b""

    def write(self, buf: torch.Tensor) -> None:
        """Lay the message out in `buf`. A tensor already at its place (collated there) is not
        copied; one elsewhere in `buf` is taken out first, so that no copy overwrites it."""
        if self.where:
            buf[: self.total].numpy()[:] = memoryview(self.header + self.where)
            return
        base, end = buf.data_ptr(), buf.data_ptr() + buf.numel()
        moves = []
        for t, off in zip(self.tensors, self.offsets):
            if t.numel() and not (t.data_ptr() == base + off and t.is_contiguous()):
                moves.append((t.clone() if base <= t.data_ptr() < end else t, off))
        for t, off in moves:
            place(buf, off, t.dtype, t.shape).copy_(t)
        buf[self.total - len(self.header) : self.total].numpy()[:] = memoryview(self.header)


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


class Codec:
    """One end's encoder and decoder, with the header (and layout) of the last batch it saw."""

    def __init__(self) -> None:
        self._key: Any = None
        self._header = b""
        self._plan: Any = None  # (skeleton, metas, offsets, total) of `_header`

    def _describe(self, batch: Any, contiguous: bool = False) -> tuple[bytes, list[torch.Tensor], Any]:
        skeleton, tensors, key = _split(batch)
        if contiguous:
            tensors = [t.contiguous() if t.is_cpu else t.cpu().contiguous() for t in tensors]
        metas = [(t.dtype, tuple(t.shape)) for t in tensors]
        if key is None or (key, metas) != self._key:
            self._key = None if key is None else (key, metas)
            self._header = pickle.dumps((skeleton, metas), protocol=pickle.HIGHEST_PROTOCOL)
            self._plan = (skeleton, metas, *_layout(len(self._header), metas))
        return self._header, tensors, self._plan

    def pack(self, batch: Any) -> Packed:
        """Plan the buffer for `batch`: its header and where each tensor's bytes go."""
        header, tensors, (_, _, offsets, total) = self._describe(batch)
        return Packed(header, tensors, offsets, total)

    def pack_addresses(self, batch: Any) -> Packed:
        """The message naming where `batch`'s tensors are, for a cross-memory receiver."""
        header, tensors, _ = self._describe(batch, contiguous=True)
        where = struct.pack(f"<{2 * len(tensors)}q", *[v for t in tensors for v in (t.data_ptr(), t.nbytes)])
        return Packed(header, tensors, [], len(header) + len(where), where)

    def _read_header(self, header: bytes) -> Any:
        if header != self._header:
            skeleton, metas = pickle.loads(header)
            self._header, self._plan = header, (skeleton, metas, *_layout(len(header), metas))
        return self._plan

    def decode(self, buf: torch.Tensor, header_len: int) -> Any:
        """The batch in `buf` (as `Packed.write` laid it out, `buf` is the whole message); its
        tensors are views into `buf`."""
        skeleton, metas, offsets, _ = self._read_header(buf[buf.numel() - header_len :].numpy().tobytes())
        tensors = [
            place(buf, off, dtype, shape) if _nbytes(dtype, shape) else torch.empty(shape, dtype=dtype)
            for (dtype, shape), off in zip(metas, offsets)
        ]
        return _join(skeleton, tensors)

    def read(self, header: bytes, where: bytes, pid: int, pin: bool) -> Any:
        """In the receiving process: copy each tensor out of process `pid`."""
        skeleton, metas, _, _ = self._read_header(header)
        tensors = [torch.empty(shape, dtype=dtype, pin_memory=pin) for dtype, shape in metas]
        pairs = struct.unpack(f"<{len(where) // 8}q", where)
        cross_memory.read(pid, list(zip(pairs[::2], pairs[1::2])), tensors)
        return _join(skeleton, tensors)
