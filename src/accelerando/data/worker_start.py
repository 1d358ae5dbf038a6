"""A forked DataLoader worker that never starts is forked again, not waited on forever.

CPython before its gh-112275 fix (3.12.1 has it; 3.11.7 and 3.10.13, for example, do not) can
deadlock a child of `os.fork()` in its after-fork code when, at that instant, another thread of the
parent was creating a Python thread state. torch.distributed's gloo threads do so now and then, so
a rank that forks its DataLoader workers can get a worker that never runs, and torch then waits for
its first batch forever (a DataLoader's `timeout` is 0 unless set). This suite met it beside a CPU
hog, in one of Accelerate's data-loading scripts.

So a prepared loader that forks its workers has each of them say, first thing, that it started,
and waits for that once the last one is forked, before torch (or torchdata, which waits for its
workers' first message in the iterator's constructor) reads anything from them. One silent for
`ACCELERANDO_DATALOADER_WORKER_START_TIMEOUT` seconds (default 60; 0 turns the watch off) is killed
and the same process object forked again with the same arguments: it reads the same index queue with
the same seed, so the pass yields the batches it would have. After `ATTEMPTS` tries it raises instead.
"""

from __future__ import annotations

import multiprocessing
import os
import select
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from accelerando.config import env

TIMEOUT_VARIABLE = "DATALOADER_WORKER_START_TIMEOUT"
DEFAULT_TIMEOUT = 60
ATTEMPTS = 3
_ID_BYTES = 4


class _SayStarted:
    """The workers' `worker_init_fn`: write this worker's id on the pipe, then run the user's."""

    def __init__(self, fd: int, user_fn: Callable[[int], None] | None) -> None:
        self.fd = fd
        self.user_fn = user_fn

    def __call__(self, worker_id: int) -> None:
        os.write(self.fd, worker_id.to_bytes(_ID_BYTES, "little"))
        if self.user_fn is not None:
            self.user_fn(worker_id)


class _Watch:
    """One opening of a loader: the pipe its workers report on and the processes forked so far."""

    def __init__(self, expected: int, timeout: float) -> None:
        self.expected = expected
        self.timeout = timeout
        self.read_fd, self.write_fd = os.pipe()
        self.processes: list[_WatchedProcess] = []

    def close(self) -> None:
        os.close(self.read_fd)
        os.close(self.write_fd)

    def started(self, process: _WatchedProcess) -> None:
        """Called as each worker is forked (in worker-id order); the last one waits for them all."""
        self.processes.append(process)
        if len(self.processes) == self.expected:
            self._await_all()

    def _await_all(self) -> None:
        pending = set(range(self.expected))
        for attempt in range(1, ATTEMPTS + 1):
            pending = self._listen(pending)
            if not pending:
                return
            named = ", ".join(f"worker {i} (pid {self.processes[i].pid})" for i in sorted(pending))
            if attempt == ATTEMPTS:
                for process in self.processes:
                    process.kill()
                    process.join(timeout=10)
                raise RuntimeError(
                    f"DataLoader {named} did not start within {self.timeout} s of being forked, {ATTEMPTS} "
                    f"times in a row. A known cause is CPython's after-fork deadlock (gh-112275, fixed in "
                    f"3.12.1 and later): upgrade Python, or pass multiprocessing_context='forkserver' to the "
                    f"DataLoader. {env.PREFIX}{TIMEOUT_VARIABLE} sets the wait in seconds (0: no watch)."
                )
            warnings.warn(
                f"DataLoader {named} did not start within {self.timeout} s of being forked; forked it again "
                f"(it reads the same indices with the same seed). A known cause is CPython's after-fork "
                f"deadlock (gh-112275, fixed in 3.12.1 and later).",
                RuntimeWarning,
                stacklevel=2,
            )
            for i in pending:
                self.processes[i].refork()

    def _listen(self, pending: set[int]) -> set[int]:
        """The workers of `pending` neither heard from within the timeout nor dead (torch reports those)."""
        pending = set(pending)
        deadline = time.monotonic() + self.timeout
        unread = b""
        while pending:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if select.select([self.read_fd], [], [], min(left, 0.2))[0]:
                unread += os.read(self.read_fd, 4096)
                whole = len(unread) - len(unread) % _ID_BYTES
                pending -= {
                    int.from_bytes(unread[k : k + _ID_BYTES], "little") for k in range(0, whole, _ID_BYTES)
                }
                unread = unread[whole:]
            pending -= {i for i in pending if self.processes[i].exitcode is not None}
        return pending


class _WatchedProcess(multiprocessing.context.ForkProcess):
    """A forked worker that reports to its watch once forked, and can be forked again in place
    (torch keeps this object; it reads its pid only once all workers are started)."""

    def __init__(
        self, watch: _Watch, target: Any = None, args: Any = (), kwargs: Any = None, **rest: Any
    ) -> None:
        super().__init__(target=target, args=args, kwargs=kwargs or {}, **rest)
        self._watch = watch
        self._recipe = {
            "_target": target,
            "_args": tuple(args),
            "_kwargs": dict(kwargs or {}),
        }  # start drops them

    def start(self) -> None:
        super().start()
        self._watch.started(self)

    def refork(self) -> None:
        self.kill()
        self.join(timeout=10)
        self._popen = None
        vars(self).update(self._recipe)
        super().start()


class _WatchingForkContext(multiprocessing.context.ForkContext):
    """The fork context (the user's, or the default one on Linux), its processes under a watch."""

    def __init__(self, watch: _Watch) -> None:
        self._watch = watch

    def Process(self, *args: Any, **kwargs: Any) -> _WatchedProcess:  # type: ignore[override]  # noqa: N802
        return _WatchedProcess(self._watch, *args, **kwargs)


def _forks(loader: Any) -> bool:
    """Whether the loader's workers are forked (the default start method on Linux before 3.14)."""
    ctx = loader.multiprocessing_context
    if ctx is not None:
        return ctx.get_start_method() == "fork"
    method = multiprocessing.get_start_method(allow_none=True)  # None: not chosen yet (never fix it here)
    return (method or multiprocessing.get_all_start_methods()[0]) == "fork"


def open_watched(loader: Any, open_pass: Callable[[], Iterator[Any]]) -> Iterator[Any]:
    """`open_pass()`, under which every worker forked for `loader` must say it started (see the
    module docstring); workers already running (persistent ones) are not watched again."""
    timeout = env.integer(TIMEOUT_VARIABLE, DEFAULT_TIMEOUT) or 0
    if timeout <= 0 or not loader.num_workers or not _forks(loader):
        return open_pass()
    watch = _Watch(loader.num_workers, timeout)
    user_fn, user_ctx = loader.worker_init_fn, loader.multiprocessing_context
    loader.worker_init_fn = _SayStarted(watch.write_fd, user_fn)
    loader.multiprocessing_context = _WatchingForkContext(watch)
    try:
        return open_pass()
    finally:
        loader.worker_init_fn, loader.multiprocessing_context = user_fn, user_ctx
        watch.close()
