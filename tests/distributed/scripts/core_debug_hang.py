"""Debug mode, 2 ranks: a collective called on some ranks only ends in an error naming each rank's
call site, at once when the other rank calls a different collective, within the debug timeout when
it calls none. Both ranks catch the errors and go on, so one launch checks both cases."""

import time
from pathlib import Path

import torch
import torch.distributed as dist

from accelerando import Accelerator
from accelerando.ops.errors import CollectiveMismatchError

LINES = {tag: i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1) for tag in ("SITE-A", "SITE-B") if line.endswith(f"# {tag}")}  # fmt: skip
acc = Accelerator(cpu=True)
assert acc.state.debug, "run with ACCELERANDO_DEBUG_MODE=1"
rank, t = acc.process_index, torch.tensor([1.0])
assert acc.gather(t).tolist() == [1.0, 1.0]  # matched collectives still work

start = time.monotonic()
try:
    if rank == 0:
        acc.gather(t)  # SITE-A
    else:
        acc.wait_for_everyone()  # SITE-B
except CollectiveMismatchError as err:
    message = str(err)
else:
    raise AssertionError("different collectives on the two ranks did not raise")
assert time.monotonic() - start < 10, "the mismatch was not reported at once"
assert f"rank 0 called gather (collective #1) at {__file__}:{LINES['SITE-A']}" in message, message
assert f"rank 1 called wait_for_everyone (collective #1) at {__file__}:{LINES['SITE-B']}" in message, message

if rank == 0:
    start = time.monotonic()
    try:
        acc.gather(t)
    except CollectiveMismatchError as err:
        message = str(err)
    else:
        raise AssertionError("a gather on rank 0 only did not raise")
    elapsed = time.monotonic() - start
    assert 2.5 < elapsed < 30, elapsed
    assert "rank 0 called gather (collective #2)" in message, message
    assert "rank 1 did not call it within 3s" in message, message
    assert (
        f"its last collective was wait_for_everyone (collective #1) at {__file__}:{LINES['SITE-B']}"
        in message
    )
dist.barrier()  # rank 1 waits here, outside any checked collective, until rank 0 has its error
acc.state.debug = False
acc.print("DEBUG HANGS ok")
