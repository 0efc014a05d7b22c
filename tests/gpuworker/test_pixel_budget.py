"""The image processors' pixel budgets: images worked on wait for room (a
larger one goes alone), images kept count until they are let go of, and
never wait."""

from __future__ import annotations

import threading
import time

import pytest

from gpuworker.processors.pixel_budget import PixelBudget


class Kept:  # anything that can be let go of
    pass


@pytest.fixture
def budget(settings) -> PixelBudget:
    settings.IMAGE_PIXEL_BUDGET = 100
    return PixelBudget()


def test_an_image_larger_than_the_budget_goes_alone_and_work_without_pixels_never_waits(budget):
    with budget.hold(1000):
        assert budget.used == 1000
        with budget.hold(0):  # an output made already, only encoded
            assert budget.used == 1000
    assert budget.used == 0


def test_an_image_worked_on_waits_until_the_others_leave_room(budget):
    order: list[str] = []
    entered = threading.Event()

    def second():
        with budget.hold(60):
            order.append("second in")
            entered.set()

    with budget.hold(60):
        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.1)  # room for it to start (it must wait: 60 + 60 > 100)
        order.append("first out")
    assert entered.wait(10)
    thread.join()
    assert order == ["first out", "second in"]
    assert budget.used == 0


def test_a_kept_image_counts_until_it_is_let_go_of_and_one_that_does_not_fit_is_refused(budget):
    first, second = Kept(), Kept()
    assert budget.keep(first, 70)
    assert not budget.keep(second, 40)  # refused at once, nothing counted
    assert budget.used == 70
    del first
    assert budget.used == 0
    assert budget.keep(second, 40)
