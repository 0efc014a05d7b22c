"""A reviewer works through a checkpoint's spot check, rejecting with a reason
from the campaign's list; the checkpoint page then shows what the review cost."""

from __future__ import annotations

import pytest

from campaigns.models import ReviewDecision, ReviewItem
from tests.campaigns.test_review_effort_pages import (  # noqa: F401 (fixtures)
    campaign,
    checkpoint,
)

pytestmark = pytest.mark.e2e


def test_a_rejection_with_a_listed_reason_shows_in_the_checkpoints_effort(
    page,
    live_server,
    owner,
    checkpoint,  # noqa: F811 (the imported fixture)
    transactional_db,
):
    # given: the reviewer signed in on the checkpoint page
    url = f"{live_server.url}/review/checkpoint/{checkpoint.pk}/"
    page.goto(url)
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url(url)
    assert page.locator('#review-effort [data-effort="decisions"]').inner_text() == "0"

    # when: from the sample to the queue; the first spot check rejected with a
    # reason picked from the list, the next accepted with the keyboard
    page.click("#checkpoint-decide a")
    pane = page.locator("#review-item")
    first = int(pane.get_attribute("data-item"))
    pane.locator("select[name=reject_reason]").select_option("input unusable")
    pane.locator("button[value=rejected]").click()
    page.locator("#review-notice", has_text="Rejected").wait_for()
    second = int(pane.get_attribute("data-item"))
    assert second != first
    page.keyboard.press("a")
    page.locator("#review-notice", has_text="Accepted").wait_for()

    # then: both decisions are timed, the rejection counts under its reason
    rejected = ReviewItem.objects.get(pk=first)
    assert (rejected.state, rejected.reject_reason) == ("rejected", "input unusable")
    assert ReviewDecision.objects.filter(seconds__isnull=False).count() == 2
    page.goto(url)
    effort = page.locator("#review-effort")
    assert effort.locator('[data-effort="decisions"]').inner_text() == "2"
    assert effort.locator('[data-effort="mean-seconds"]').inner_text().endswith(" s")
    assert effort.locator('[data-effort="per-hour"]').inner_text().endswith("items/h")
    assert effort.locator('[data-effort="backlog"]').inner_text() == "1 open"
    row = effort.locator('tr[data-reject-reason="input unusable"]')
    assert row.locator("td").all_inner_texts() == ["1", "100%"]
    spot = effort.locator('table.effort-reasons tr[data-reason="spot_check"]')
    assert spot.locator("td").all_inner_texts() == ["3", "1", "1 (50%)", "1 (50%)", "0 (0%)"]
    assert effort.locator("#effort-keeps-up").get_attribute("data-keeps-up") == "yes"
