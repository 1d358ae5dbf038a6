"""Debug mode: every rank announces each collective before running it, so a collective called on
some ranks only, or a different one on each, ends in an error naming every rank's call site.

Each checked collective gets the next sequence number; a rank writes `(operation, call site,
shapes)` under that number in the process group's key-value store and waits, with a deadline, for
every other rank's entry. Entries that name different operations raise at once on every rank; a
rank that never arrives raises on the others after `ACCELERANDO_DEBUG_COLLECTIVE_TIMEOUT` seconds
(20 by default) naming where the missing rank last announced a collective, instead of hanging until
the process group's timeout (30 minutes for gloo). Outside debug mode nothing here runs.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from accelerando.config import env
from accelerando.ops.errors import CollectiveMismatchError

PREFIX = "accelerando_debug"
DEFAULT_TIMEOUT = 20
# accelerando's and torch's own frames are skipped when naming the call site
_SKIP = tuple(
    os.path.dirname(os.path.dirname(os.path.abspath(p))) + os.sep for p in (__file__, dist.__file__)
)
_next = {"seq": 0}


def call_site() -> str:
    """The innermost frame outside accelerando, torch and contextlib: the user's line."""
    frame = sys._getframe(1)
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not name.startswith(_SKIP) and not name.endswith("contextlib.py") and not name.startswith("<"):
            return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>"


def _store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no store (e.g. a custom init): the caller falls back
        return None


def _describe(entry: dict[str, Any]) -> str:
    return f"{entry['op']} (collective #{entry['seq']}) at {entry['site']}"


def announce(operation: str, shapes: Any) -> list[dict[str, Any]] | None:
    """Post this rank's next collective and wait for every rank's; their entries, rank by rank.

    Only for the default (world) group. Returns None when no store is available.
    """
    store = _store()
    if store is None:
        return None
    seq = _next["seq"]
    _next["seq"] += 1
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = {"seq": seq, "op": operation, "site": call_site(), "shapes": shapes}
    payload = json.dumps(mine)
    store.set(f"{PREFIX}/{seq}/{rank}", payload)
    store.set(f"{PREFIX}/last/{rank}", payload)
    keys = [f"{PREFIX}/{seq}/{r}" for r in range(world)]
    timeout = env.integer("DEBUG_COLLECTIVE_TIMEOUT", DEFAULT_TIMEOUT) or DEFAULT_TIMEOUT
    try:
        store.wait(keys, timedelta(seconds=timeout))
    except Exception:  # noqa: BLE001 - a timeout, or a peer (or the store's host) that is gone
        raise CollectiveMismatchError(_missing(store, mine, rank, world, timeout)) from None
    entries = [json.loads(store.get(k)) for k in keys]
    if seq > 0:  # every rank has posted `seq`, so all have read `seq - 1`
        store.delete_key(f"{PREFIX}/{seq - 1}/{rank}")
    if len({e["op"] for e in entries}) > 1:
        listing = "; ".join(f"rank {r} called {_describe(e)}" for r, e in enumerate(entries))
        raise CollectiveMismatchError(
            f"ranks called different collectives at the same point: {listing}. Every rank must call the "
            "same collectives in the same order (a collective inside `if accelerator.is_main_process:` "
            "is the usual cause)"
        )
    return entries


def _missing(store: Any, mine: dict[str, Any], rank: int, world: int, timeout: int) -> str:
    parts = [f"rank {rank} called {_describe(mine)}"]
    for other in range(world):
        if other == rank:
            continue
        try:
            if store.check([f"{PREFIX}/{mine['seq']}/{other}"]):
                parts.append(f"rank {other} called it too")
                continue
            last = f"{PREFIX}/last/{other}"
            seen = json.loads(store.get(last)) if store.check([last]) else None
        except Exception:  # noqa: BLE001 - the store's host (rank 0) may be gone
            seen = None
        where = (
            f"its last collective was {_describe(seen)}" if seen else "it has called no checked collective"
        )
        parts.append(f"rank {other} did not call it within {timeout}s: {where}")
    return (
        "a collective was called on some ranks only: "
        + "; ".join(parts)
        + ". (debug mode; ACCELERANDO_DEBUG_COLLECTIVE_TIMEOUT sets the wait)"
    )
