"""A person logs in, starts the campaign and watches the counts move without reloading."""

from __future__ import annotations

import pytest

from campaigns.models import Unit, UnitState
from tests.conftest import DEMO_BAD, DEMO_GOOD
from tests.worker import Worker, purge_queue

pytestmark = pytest.mark.e2e


@pytest.fixture
def worker_factory(transactional_db, output_root, tmp_path):
    purge_queue()
    started: list[Worker] = []

    def start() -> Worker:
        started.append(Worker(tmp_path / "worker.log"))
        return started[-1]

    yield start
    for worker in started:
        worker.stop()


def _count(page, name: str) -> int:
    return int(page.locator(f'#counts [data-count="{name}"]').inner_text().replace(",", ""))


def test_counts_and_progress_move_live_while_the_worker_embeds(
    page, live_server, worker_factory, make_campaign, owner
):
    campaign = make_campaign("live", batch_size=2)
    total = DEMO_GOOD + DEMO_BAD

    # given: logged in, on the campaign page, nothing done yet
    page.goto(f"{live_server.url}/campaigns/live/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/campaigns/live/")
    assert _count(page, "pending") == total
    assert page.locator("#counts").get_attribute("data-active") == "false"
    assert "No batch finished yet." in page.locator("#batches").inner_text()

    # when: the user presses Run while no worker runs yet, the units wait queued
    page.click("text=Run remaining units")
    page.wait_for_url("**/campaigns/live/")
    assert _count(page, "queued") == total
    assert _count(page, "succeeded") == 0
    page.evaluate("window.__notReloaded = true")

    # and a worker starts taking batches
    worker = worker_factory()
    seen: list[int] = []

    def progressed(target: int) -> bool:
        if worker.proc.poll() is not None:
            raise AssertionError(worker.output()[-3000:])
        value = _count(page, "succeeded")
        if not seen or seen[-1] != value:
            seen.append(value)
        return value >= target

    page.wait_for_function("() => 1", timeout=1000)
    deadline_checks = 0
    while not progressed(DEMO_GOOD):
        page.wait_for_timeout(300)
        deadline_checks += 1
        assert deadline_checks < 600, f"counts stuck at {seen}; worker log:\n{worker.output()}"

    # then: the counts changed in place, and polling stopped once the campaign went idle
    page.wait_for_selector('#counts[data-active="false"]')
    assert page.evaluate("window.__notReloaded") is True
    assert seen[0] == 0 and seen[-1] == DEMO_GOOD and len(seen) >= 2
    assert _count(page, "failed") == DEMO_BAD
    assert _count(page, "queued") == 0 and _count(page, "running") == 0
    assert page.locator("#progress").get_attribute("value") == str(total)
    # and the batches' table and memory chart came in too, still without a reload
    page.wait_for_selector('#run-panels[data-active="false"]')
    row = page.locator("#batches table.policies tbody tr")
    assert row.count() == 1
    assert row.locator("td").nth(3).inner_text() == str(total)  # items: every unit, once
    assert page.locator("#batches figure.memory-chart polyline").count() >= 1
    assert page.evaluate("window.__notReloaded") is True
    assert Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).count() == DEMO_GOOD

    # and the failures with their reasons, and the unit table's final states
    failures = page.locator("#failures table.failures").inner_text()
    assert "empty file" in failures and "not valid UTF-8" in failures
    page.wait_for_selector("#unit-rows:not([hx-trigger])")
    states = page.locator("#units tbody tr td:nth-child(2)").all_inner_texts()
    assert len(states) == min(total, 50)
    assert set(states) <= {"succeeded", "failed"} and "failed" in states
    assert page.evaluate("window.__notReloaded") is True
