"""The review queue's page draws its list first and loads the first item's
pane after it; the reviewer sees the item and decides as before, with the
mouse or the keyboard, and without JavaScript through the pane's link."""

from __future__ import annotations

import pytest

from campaigns.models import ReviewItem
from tests.campaigns.test_review_views import pending_items  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e


def _log_in(page, url: str) -> None:
    page.goto(url)
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url(lambda now: "/review/" in now and "login" not in now)


def test_the_first_items_pane_loads_after_the_page_and_reviewing_works(
    page,
    live_server,
    owner,
    pending_items,  # noqa: F811 (the imported fixture)
    transactional_db,
):
    first, second = pending_items
    pane_requests = []
    page.on(
        "request",
        lambda request: (
            request.headers.get("hx-target") == "review-item" and pane_requests.append(request.url)
        ),
    )
    _log_in(page, f"{live_server.url}/review/?campaign=texts")

    # the item's content arrives in the pane, fetched after the page
    pane = page.locator("#review-item")
    pane.locator("#decide-form").wait_for()
    assert pane_requests and pane_requests[0].endswith(f"item={first.pk}")
    assert page.locator("#review-uid").inner_text() == "news/solar-farm.txt"
    assert "flagged for the test" in pane.inner_text()
    assert page.locator("#input-excerpt").inner_text().strip()
    assert pane.get_attribute("aria-busy") is None

    # a: accepted, and the next item is shown
    page.keyboard.press("a")
    page.locator("#review-notice", has_text="Accepted news/solar-farm.txt").wait_for()
    assert ReviewItem.objects.get(pk=first.pk).state == "accepted"
    assert page.locator(f"#row-{first.pk}").get_attribute("data-state") == "accepted"
    assert int(pane.get_attribute("data-item")) == second.pk

    # the Reject button with a note: rejected
    pane.locator("input[name=note]").fill("not what the campaign is for")
    pane.locator("button[value=rejected]").click()
    page.locator("#review-notice", has_text="Rejected recipes/bread.txt").wait_for()
    rejected = ReviewItem.objects.get(pk=second.pk)
    assert (rejected.state, rejected.note) == ("rejected", "not what the campaign is for")


def test_without_javascript_the_pane_opens_from_its_link_and_decisions_go_on(
    new_page,
    live_server,
    owner,
    pending_items,  # noqa: F811 (the imported fixture)
    transactional_db,
):
    first, second = pending_items
    page = new_page(java_script_enabled=False)
    _log_in(page, f"{live_server.url}/review/?campaign=texts")
    assert page.locator("#decide-form").count() == 0

    page.locator("#review-loading a", has_text="news/solar-farm.txt").click()
    page.locator("#decide-form").wait_for()
    assert page.locator("#review-uid").inner_text() == "news/solar-farm.txt"
    page.locator("#decide-form button[value=accepted]").click()

    # the form posts, the page comes back with the next item in it
    page.locator("main .message", has_text="Accepted news/solar-farm.txt").wait_for()
    assert page.locator("#review-uid").inner_text() == "recipes/bread.txt"
    assert ReviewItem.objects.get(pk=first.pk).state == "accepted"
    assert ReviewItem.objects.get(pk=second.pk).state == "open"


def test_a_pane_that_cannot_load_says_so_and_keeps_its_link(
    page,
    live_server,
    owner,
    pending_items,  # noqa: F811 (the imported fixture)
    transactional_db,
):
    # given: the pane's own request answers 404, as for an item deleted after
    # the list was drawn
    def pane_gone(route):
        if route.request.headers.get("hx-request"):
            route.fulfill(status=404, body="No such review item.")
        else:
            route.continue_()

    page.route("**/review/?*item=*", pane_gone)

    # when
    _log_in(page, f"{live_server.url}/review/?campaign=texts")

    # then: not "Loading …" for good, and the item's link is still there
    loading = page.locator("#review-loading")
    loading.filter(has_text="could not be loaded (404)").wait_for()
    assert page.locator("#review-item").get_attribute("aria-busy") is None
    assert loading.locator("a", has_text="news/solar-farm.txt").count() == 1
