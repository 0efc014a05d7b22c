"""The worker's reads and checks in threads (gpuworker.runner.threads.in_threads)."""

from __future__ import annotations

import multiprocessing
import threading
import time

import pytest

from gpuworker.runner.threads import IO_THREADS, in_threads


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


def _in_a_forked_child(queue) -> None:
    from gpuworker.runner.pipeline import finisher

    queue.put((in_threads(lambda n: n + 1, list(range(20))), finisher._pool is None))


def test_a_process_forked_after_the_threads_ran_gets_threads_of_its_own():
    # given: this process's pools have threads (a worker that ran batches)
    # (slow enough items that every helper thread starts)
    assert in_threads(lambda n: time.sleep(0.01) or n, list(range(20))) == list(range(20))
    time.sleep(0.2)  # its threads back to idle, as between a worker's batches
    fork = multiprocessing.get_context("fork")
    queue = fork.Queue()

    # when: a process forked from it runs its own batch's reads
    child = fork.Process(target=_in_a_forked_child, args=(queue,))
    child.start()
    child.join(timeout=30)

    # then: it finishes (an inherited pool would take work no thread runs)
    if child.is_alive():
        child.kill()
        pytest.fail("the forked process hung on the threads it did not inherit")
    assert child.exitcode == 0
    assert queue.get(timeout=5) == (list(range(1, 21)), True)


def test_small_inputs_are_read_in_the_calling_thread():
    from gpuworker.runner.threads import THREADED_FROM_BYTES, worth_threads

    threads: set[str] = set()

    def note(n: int) -> int:
        threads.add(threading.current_thread().name)
        return n

    assert in_threads(note, list(range(50)), threaded=False) == list(range(50))
    assert threads == {threading.current_thread().name}
    assert not worth_threads([1000] * 50)
    assert worth_threads([THREADED_FROM_BYTES // 4] * 4)
    assert worth_threads([1000, None])  # a size not known counts as large
