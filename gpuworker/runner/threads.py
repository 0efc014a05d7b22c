"""The worker process's threads for file work: reads, decodes, checks.

File I/O and image decoding release the GIL, so a slow disk or a large image
does not serialise a batch.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

IO_THREADS = 4
#: A batch whose inputs add up to fewer bytes is read in the calling thread
#: alone: for short texts the threads' handing the GIL back and forth costs
#: more than the reads they overlap (bench/RESULTS.md, "Host work a unit
#: (2026-12-03)").
THREADED_FROM_BYTES = 1 << 20
_pool: ThreadPoolExecutor | None = None


def _io_pool() -> ThreadPoolExecutor:
    """One pool per worker process, made on first use (after the prefork fork)."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=IO_THREADS - 1, thread_name_prefix="unit-io")
    return _pool


def _forget_io_pool() -> None:
    # A forked child has none of the parent's threads: a pool it inherited
    # would take work that no thread ever runs.
    global _pool
    _pool = None


os.register_at_fork(after_in_child=_forget_io_pool)


def worth_threads(sizes: list[int | None]) -> bool:
    """Whether inputs of these sizes (None: not known) are read in threads."""
    return sum(THREADED_FROM_BYTES if s is None else s for s in sizes) >= THREADED_FROM_BYTES


def in_threads(fn: Callable[[T], Any], items: list[T], *, threaded: bool = True) -> list[Any]:
    """[fn(item) for item in items], by IO_THREADS threads (this one included)
    that each take the next item as they finish one; in this thread alone
    where not `threaded`.

    One task per thread, not per item: a future per item costs more than
    reading and checking a short text (bench/orchestration.py), and taking the
    next item keeps a few large images from holding up one thread's share.
    The first exception is raised once every thread has stopped.
    """
    if not threaded:
        return [fn(item) for item in items]
    results: list[Any] = [None] * len(items)
    # next() on a count is atomic under the GIL: no item is taken twice.
    taken = itertools.count()

    def work() -> None:
        for index in taken:
            if index >= len(items):
                return
            results[index] = fn(items[index])

    helpers = min(IO_THREADS, len(items)) - 1
    futures = [_io_pool().submit(work) for _ in range(helpers)]
    try:
        work()
    finally:
        for future in futures:
            future.exception()  # waits
    for future in futures:
        future.result()
    return results
