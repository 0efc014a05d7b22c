"""The campaign page's header says what the campaign is doing: Paused once the
user pauses it, "Waiting at checkpoint N" (a link to it) while the spot check waits."""

from __future__ import annotations

import pytest

from tests.conftest import waiting_at_checkpoint

pytestmark = pytest.mark.e2e


def _log_in(page, url: str) -> None:
    page.goto(url)
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url(url)


def test_the_header_says_paused_and_waiting_at_the_checkpoint(
    page, live_server, owner, make_campaign
):
    make_campaign("paused")
    waiting = make_campaign("waiting")
    checkpoint = waiting_at_checkpoint(waiting)

    # given: on an idle campaign's page
    url = f"{live_server.url}/campaigns/paused/"
    _log_in(page, url)
    label = page.locator("h1 #run-state")
    assert label.inner_text() == "Idle"

    # when: the user pauses it
    with page.expect_navigation():
        page.click("button:text-is('Pause')")

    # then: the header says so, and the status line what is left
    assert label.inner_text() == "Paused"
    assert "Resume goes on" in page.locator("#run-status").inner_text()

    # and a campaign at its checkpoint says which, and the label opens it
    page.goto(f"{live_server.url}/campaigns/waiting/")
    assert label.inner_text() == f"Waiting at checkpoint {checkpoint.pk} (v1)"
    label.locator("a").click()
    page.wait_for_url(f"**/checkpoint/{checkpoint.pk}/")
