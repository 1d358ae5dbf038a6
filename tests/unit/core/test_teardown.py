"""The exit teardown's store meeting (issue 17), on a real TCPStore with one thread per rank."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

from torch.distributed import TCPStore

from accelerando import _runtime


class RecordingStore:
    """A client store that notes when each of its rank's calls starts."""

    def __init__(self, store: TCPStore, rank: int, log: list[tuple[float, int]]) -> None:
        self._store, self._rank, self._log = store, rank, log

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._store, name)

        def call(*args: Any) -> Any:
            self._log.append((time.monotonic(), self._rank))
            return method(*args)

        return call


def _meet(
    world: int, delays: dict[int, float], timeout: float, absent: tuple[int, ...] = ()
) -> tuple[dict[int, float], list]:
    server = TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
    log: list[tuple[float, int]] = []
    returned: dict[int, float] = {}

    def rank_main(rank: int) -> None:
        client = TCPStore("127.0.0.1", server.port, world, is_master=False)
        time.sleep(delays.get(rank, 0.0))
        _runtime._leave_together(
            RecordingStore(client, rank, log), "t", rank, world, timeout=timedelta(seconds=timeout)
        )
        returned[rank] = time.monotonic()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(world) if r not in absent]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    return returned, log


def test_rank0_leaves_after_every_other_rank_made_its_last_store_call() -> None:
    returned, log = _meet(world=3, delays={2: 0.3}, timeout=20)
    assert sorted(returned) == [0, 1, 2]
    last_call_of_others = max(t for t, rank in log if rank != 0)
    assert returned[0] >= last_call_of_others


def test_a_peer_that_never_arrives_costs_a_bounded_wait() -> None:
    start = time.monotonic()
    returned, _ = _meet(world=3, delays={}, timeout=0.5, absent=(2,))
    assert 0 in returned and 1 in returned
    assert returned[0] - start < 10
