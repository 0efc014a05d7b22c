"""An active rental's pages in Chromium: the customer's tracking page names each
element once (its dates card and its access block both show the end), and the
staff page shows the rental's end in the viewer's zone beside UTC, as every
other time on the site."""

from __future__ import annotations

from zoneinfo import ZoneInfo

import pytest

from tests.portal.test_rental_access import _active

pytestmark = pytest.mark.e2e


def _utc(moment) -> str:
    return moment.astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%d %H:%M UTC")


def _local(moment, zone: str) -> str:
    return f"({moment.astimezone(ZoneInfo(zone)).strftime('%Y-%m-%d %H:%M')} your time, {zone})"


def test_an_active_rental_s_tracking_page_names_each_element_once(
    page, live_server, make_order, transactional_db
):
    # given: an active rental with its access recorded
    order = _active(make_order)
    page.goto(f"{live_server.url}/order/t/{order.tracking_token}/")
    assert page.locator("[data-status]").inner_text() == "Active"

    # then: no id is used twice on the page
    ids = page.evaluate("() => Array.from(document.querySelectorAll('[id]'), (e) => e.id)")
    assert sorted({i for i in ids if ids.count(i) > 1}) == []
    # the end of the rental, in the dates card and beside how to connect
    assert page.locator("#rental #rental-end").inner_text() == _utc(order.ends_at)
    assert (
        page.locator("#rental-access #rental-access-end")
        .inner_text()
        .startswith(f"The rental ends on {_utc(order.ends_at)}")
    )
    # and the access block's script still finds its copy buttons (hidden without it)
    assert page.locator('#rental-access button[data-copy="ssh-command"]').is_visible()


def test_the_staff_page_shows_the_rental_s_end_in_the_viewer_s_zone_beside_utc(
    new_page, live_server, staff, make_order, transactional_db
):
    order = _active(make_order)
    page = new_page(timezone_id="Asia/Tokyo")
    page.goto(f"{live_server.url}/order/staff/{order.pk}/")
    page.fill("input[name=username]", "staff")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("[type=submit]")
    page.wait_for_url(f"**/order/staff/{order.pk}/")

    ends = page.locator("#access-given #staff-rental-end")
    assert ends.inner_text() == _utc(order.ends_at)
    local = page.locator("#staff-rental-end + .local-time").inner_text().strip()
    assert local == _local(order.ends_at, "Asia/Tokyo")
    # as every other time on the staff page
    assert page.locator("time[datetime]").count() == page.locator("time + .local-time").count()
