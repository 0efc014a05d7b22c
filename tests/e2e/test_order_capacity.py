"""A late payment for cards sold meanwhile: staff see it wait for capacity, then provision."""

from __future__ import annotations

import pytest

from portal import order_services as svc
from portal.order_states import Status

pytestmark = pytest.mark.e2e


def _sign_in(page, url: str) -> None:
    page.goto(f"{url}/order/staff/")
    page.fill("input[name=username]", "staff")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("[type=submit]")
    page.wait_for_url("**/order/staff/")


def test_a_late_payment_waits_for_capacity_and_is_provisioned_once_cards_free(
    page, new_page, live_server, staff, make_order, transactional_db, settings
):
    # given: an A100 order (stock 2) expired unpaid, its cards quoted to someone else
    settings.ORDER_MAX_HELD_SHARE = 1  # one customer may quote the whole stock
    late = svc.order_expire(order=make_order(gpu="A100 SXM", quantity=2))
    other = make_order(gpu="A100 SXM", quantity=2)

    # when staff confirm the late payment
    _sign_in(page, live_server.url)
    page.goto(f"{live_server.url}/order/staff/{late.pk}/")
    page.select_option("select[name=action]", "confirm")
    page.fill("textarea[name=note]", "arrived 2 hours late")
    page.click("#staff-action button[type=submit]")
    page.wait_for_url("**/order/staff/")

    # then it waits for capacity, in a group of its own, and nothing is oversold
    assert "is now paid, awaiting capacity or refund" in page.locator("main").inner_text()
    page.click(f"tr[data-order={late.reference}] a")
    assert "only 0 A100 SXM free, this order needs 2" in page.locator("#capacity").inner_text()
    options = page.locator("select[name=action] option").all_inner_texts()
    assert "Mark refunded" in options and "Start provisioning" not in options

    customer = new_page()
    customer.goto(f"{live_server.url}/order/t/{late.tracking_token}/")
    assert customer.locator("[data-status]").inner_text() == "Paid, awaiting capacity or refund"
    assert "the cards of your plan were taken" in customer.locator("main").inner_text()

    # once the other order is rejected the cards are free: provisioning is offered
    svc.order_reject(order=other, actor="staff:staff", note="never paid")
    page.reload()
    assert "2 A100 SXM free: enough for this order" in page.locator("#capacity").inner_text()
    page.select_option("select[name=action]", "provisioning")
    page.fill("textarea[name=note]", "cards freed")
    page.click("#staff-action button[type=submit]")
    page.wait_for_url("**/order/staff/")
    late.refresh_from_db()
    assert late.status == Status.PROVISIONING
