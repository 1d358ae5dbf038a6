"""Collating a receiver's batch straight into the ring slot that will carry it (rank 0 of a dispatcher).

Without it rank 0 collates a receiver's batch into fresh memory and then copies it into the ring:
that copy was the cost of the local route (1.4x the floor of rank 0 reading everything). torch's
`default_collate` makes a batch's tensors through a table of functions per element type
(`collate_fn_map`); given one whose tensor-making entries take their memory from the slot, one
after another at the offsets `batch_codec` lays a message out at, the batch is born where the
message wants it, and `Packed.write` finds nothing to copy. Only for torch's `default_collate` in
the loading process (no workers); anything that does not fit or does not line up is made as
usual and copied as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import default_collate
from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map

from accelerando.data.batch_codec import next_offset, place


class _Slot:
    """Hands out the slot's memory in message order; once something does not fit, nothing more."""

    def __init__(self, buf: torch.Tensor) -> None:
        self.buf, self.pos = buf, 0

    def take(self, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor | None:
        if 0 in shape:  # nothing to place: the layout gives it no bytes
            return None
        end = next_offset(self.pos, dtype, shape)
        if end > self.buf.numel():
            self.pos = end  # out of room: the rest is made as usual, and copied
            return None
        out, self.pos = place(self.buf, self.pos, dtype, shape), end
        return out

    def stack(self, batch: list[torch.Tensor], *, collate_fn_map: Any = None) -> torch.Tensor:
        """`torch.stack(batch)` into the slot, when its samples agree in shape and dtype."""
        elem = batch[0]
        plain = type(elem) is torch.Tensor and elem.device.type == "cpu" and elem.layout == torch.strided
        if plain and not any(
            t.requires_grad or t.shape != elem.shape or t.dtype != elem.dtype for t in batch
        ):
            out = self.take(elem.dtype, (len(batch), *elem.shape))
            if out is not None:
                return torch.stack(batch, 0, out=out)
        return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)

    def moved(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn`, with a (small) tensor it makes elsewhere copied into the slot (numbers' tensors)."""

        def run(batch: list[Any], *, collate_fn_map: Any = None) -> Any:
            made = fn(batch, collate_fn_map=collate_fn_map)
            if type(made) is not torch.Tensor or self._holds(made):
                return made
            out = self.take(made.dtype, tuple(made.shape))
            return made if out is None else out.copy_(made)

        return run

    def _holds(self, t: torch.Tensor) -> bool:
        start = self.buf.data_ptr()
        return start <= t.data_ptr() < start + self.buf.numel()


def collate_into(buf: torch.Tensor, samples: list[Any]) -> Any:
    """`default_collate(samples)`, its tensors made in `buf` from its start, in order."""
    slot = _Slot(buf)
    table: dict[Any, Callable[..., Any]] = {
        kind: slot.moved(fn) for kind, fn in default_collate_fn_map.items()
    }
    table[torch.Tensor] = slot.stack
    return collate(samples, collate_fn_map=table)


class SlotCollate:
    """Rank 0's collate function for a pass: the batch for rank `rank_of()` (the rank of the indices
    fetched last; 0 or -1 when it is rank 0's own or unknown) is made in the ring buffer of that
    rank's next message; any other batch as usual, so rank 0 never keeps a batch in the ring."""

    def __init__(self, next_buffer: Callable[[int], torch.Tensor | None], rank_of: Callable[[], int]) -> None:
        self.next_buffer, self.rank_of = next_buffer, rank_of

    def __call__(self, samples: list[Any]) -> Any:
        rank = self.rank_of()
        buf = self.next_buffer(rank) if rank > 0 else None
        return default_collate(samples) if buf is None else collate_into(buf, samples)

    @staticmethod
    def applies(loader: Any) -> bool:
        """Whether rank 0's `loader` collates in this process with torch's `default_collate`."""
        return loader.num_workers == 0 and loader.collate_fn is default_collate
