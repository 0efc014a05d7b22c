"""The worker's reads and checks in threads (gpuworker.batch_runner.in_threads)."""

from __future__ import annotations

import threading
import time

import pytest

from gpuworker.batch_runner import IO_THREADS, in_threads


def test_each_item_once_results_in_order_on_several_threads():
    calls: list[int] = []
    threads: set[str] = set()

    def slow_square(n: int) -> int:
        calls.append(n)
        threads.add(threading.current_thread().name)
        time.sleep(0.002 * (n % 3))  # uneven work: threads take items in turn
        return n * n

    assert in_threads(slow_square, list(range(50))) == [n * n for n in range(50)]
    assert sorted(calls) == list(range(50))
    assert 1 < len(threads) <= IO_THREADS


def test_a_failing_item_raises_once_every_thread_has_stopped_and_the_rest_ran():
    calls: list[int] = []

    def work(n: int) -> int:
        if n == 3:
            raise ValueError("item 3 is bad")
        time.sleep(0.001)
        calls.append(n)
        return n

    with pytest.raises(ValueError, match="item 3"):
        in_threads(work, list(range(40)))
    settled = len(calls)
    time.sleep(0.05)
    assert len(calls) == settled  # no thread still at work after the raise
    # The other threads took the items the failed one would have taken.
    assert sorted(calls) == [n for n in range(40) if n != 3]


def test_no_items_and_one_item():
    assert in_threads(lambda n: n + 1, []) == []
    assert in_threads(lambda n: n + 1, [41]) == [42]
