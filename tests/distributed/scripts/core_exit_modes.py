"""Ways a 2-rank script ends; each must exit 0 and print nothing from C++ (issue 17).

Modes: `noprep` (an Accelerator, never `prepare`), `reset` (the runtime reset and rebuilt, as tests
and notebooks do, then DDP), `user_group` (the user created the process group before the
Accelerator), `end` (`end_training()`), `again` (`end_training()`, then the runtime reset and a
new `Accelerator` in the same processes, twice, as one launch running several scripts does, with
rank 0 a second slow to close the store it hosted: a peer that joined that store instead of a new
one failed with "Gloo connectFullMesh failed", or printed a C++ trace from TCPStore). A hook
registered before accelerando is imported runs after the library's exit teardown and reports
whether the group is gone by then.
"""

import atexit
import sys

import torch.distributed as dist


def _report() -> None:
    print(f"EXIT group_alive={dist.is_initialized()}", flush=True)


atexit.register(_report)  # registered first, so it runs last

import torch  # noqa: E402

from accelerando import Accelerator  # noqa: E402
from accelerando.state import reset_runtime  # noqa: E402

mode = sys.argv[1]
if mode == "user_group":
    dist.init_process_group("gloo")
acc = Accelerator(cpu=True)
if mode == "reset":
    reset_runtime()
    acc = Accelerator(cpu=True)
if mode != "noprep":
    model = acc.prepare(torch.nn.Linear(2, 2))
    acc.backward(model(torch.ones(3, 2)).sum())
print(f"rank {acc.process_index} {mode}", acc.gather(torch.tensor([acc.process_index])).tolist(), flush=True)
if mode in ("end", "again"):
    acc.end_training()
if mode == "again":
    import time

    try:  # before, the stale runtime answered locally: [rank] on each rank, no error
        acc.gather(torch.tensor([acc.process_index]))
    except RuntimeError as err:
        assert "end_training()" in str(err) and "reset_runtime()" in str(err), err
    else:
        raise AssertionError("gather after end_training() did not raise")

    from accelerando import _runtime

    leave = _runtime._leave_together

    def rank_0_slow_to_close(*args, **kwargs):
        leave(*args, **kwargs)
        if args[2] == 0:  # the rank argument
            time.sleep(1)

    _runtime._leave_together = rank_0_slow_to_close
    for _ in range(2):
        reset_runtime()
        acc = Accelerator(cpu=True)
        print(
            f"rank {acc.process_index} again",
            acc.gather(torch.tensor([acc.process_index])).tolist(),
            flush=True,
        )
        acc.end_training()
