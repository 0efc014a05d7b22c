"""The storefront as a customer sees it in Chromium: an expired quote asks for no
payment and offers a new quote for the same plan, the quote's countdown ticks,
times show in the viewer's zone beside UTC, the operator's pages are one click
away, an underpaid order says what is missing, and a phone never scrolls sideways."""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from portal import order_services as svc
from portal.models import Order, PaymentAddress
from portal.order_states import Status
from tests.conftest import SSH_KEY

pytestmark = pytest.mark.e2e

PHONE = {"width": 375, "height": 812}
# A real address's length (BIP-173's P2WSH example): the test pool's are short.
LONG_ADDRESS = "bc1qrp33g0q5c5txsp9arysrx4k6zdkfs4nce4xj0gdcccefvpysxf3qccfmv3"


def tracking(live_server, order: Order) -> str:
    return f"{live_server.url}/order/t/{order.tracking_token}/"


def test_an_expired_quote_asks_for_no_payment_and_quotes_the_same_plan_again(
    page, live_server, make_order, transactional_db
):
    # given: a quote for 2 × L40S, 30 days, in LTC, that expired
    old = svc.order_expire(order=make_order(gpu="L40S", quantity=2, days=30, currency="LTC"))
    page.goto(tracking(live_server, old))

    # then: nothing on the page asks to be paid
    main = page.locator("main").inner_text()
    assert page.locator("[data-status]").inner_text() == "Expired"
    for gone in ("#qr", "#payment-uri", "#countdown", "#expiry", "#address"):
        assert page.locator(gone).count() == 0, gone
    assert "Pay before" not in main and 'Press "I paid" after sending' not in main
    assert old.payment_address.address not in main

    # when: "Get a new quote for this plan"
    page.click("#requote")
    page.wait_for_url(re.compile(r".*/order/\?.*"))

    # then: the form holds the same plan, and the contact is the customer's to give
    assert page.locator("select[name=gpu]").input_value() == str(old.gpu_id)
    assert page.locator("input[name=quantity]").input_value() == "2"
    checked = page.locator("input[name=duration]:checked").get_attribute("value")
    label = page.locator(f"label.duration:has(input[value='{checked}'])").inner_text()
    assert label.strip().startswith("30 days")
    assert page.locator("select[name=environment]").input_value() == str(old.environment_id)
    assert page.locator("select[name=currency]").input_value() == str(old.currency_id)
    assert page.locator("#total").inner_text().startswith("1440.00 EUR")  # 24 × 2 × 30
    assert page.locator("input[name=email]").input_value() == ""

    # and ordering it makes a new quote with an address of its own
    page.fill("input[name=first_name]", "Ada")
    page.fill("input[name=last_name]", "Lovelace")
    page.fill("input[name=email]", "ada.again@example.org")
    page.fill("textarea[name=ssh_keys]", SSH_KEY)  # keys are the customer's own, never carried over
    page.click("#order-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/order/t/[\w-]{32,}/$"))
    new = Order.objects.exclude(pk=old.pk).get()
    assert (new.gpu_id, new.quantity, new.duration_days, new.currency_id) == (
        old.gpu_id,
        2,
        30,
        old.currency_id,
    )
    assert new.payment_address.address != old.payment_address.address
    assert page.locator("#qr svg").count() == 1


def test_the_quote_s_countdown_ticks(page, live_server, make_order, transactional_db):
    order = make_order()
    page.goto(tracking(live_server, order))
    countdown = page.locator("#countdown")
    first = countdown.inner_text()
    assert re.fullmatch(r"\d+ min \d\d s left", first), first
    page.wait_for_function(
        "(first) => document.querySelector('#countdown').innerText !== first", arg=first
    )
    assert re.fullmatch(r"\d+ min \d\d s left", countdown.inner_text())


def test_times_show_in_the_viewer_s_zone_beside_utc(
    new_page, live_server, make_order, transactional_db
):
    order = make_order()
    page = new_page(timezone_id="Asia/Tokyo")
    page.goto(tracking(live_server, order))

    expiry = order.quote_expires_at
    utc_text = expiry.astimezone(ZoneInfo("UTC")).strftime("%Y-%m-%d %H:%M UTC")
    tokyo_text = expiry.astimezone(ZoneInfo("Asia/Tokyo")).strftime("%Y-%m-%d %H:%M")
    assert page.locator("#expiry").inner_text() == utc_text
    local = page.locator("#expiry + .local-time").inner_text().strip()
    assert local == f"({tokyo_text} your time, Asia/Tokyo)"
    # every time on the page, the timeline's included
    assert page.locator("time[datetime]").count() == page.locator("time + .local-time").count()


def test_the_footer_leads_to_terms_refunds_and_contact(
    page, live_server, catalog, transactional_db
):
    page.goto(f"{live_server.url}/order/")
    for link, heading in (
        ("#footer-terms", "Terms of service"),
        ("#footer-refunds", "Refund policy"),
        ("#footer-contact", "Contact"),
    ):
        page.click(link)
        assert page.locator("h1").inner_text() == heading
    assert "@" in page.locator("#operator-email").inner_text()
    page.click("#footer-recover")
    assert page.locator("h1").inner_text() == "Lost your order link?"


def test_an_underpaid_order_shows_the_missing_amount_with_its_currency(
    page, new_page, live_server, staff, make_order, transactional_db, settings
):
    order = make_order()
    half = (order.crypto_amount / 2).quantize(Decimal("0.00000001"))

    # given: staff mark it partially paid, with what arrived, on the staff page
    staff_page = new_page()
    staff_page.goto(f"{live_server.url}/order/staff/{order.pk}/")
    staff_page.fill("input[name=username]", "staff")
    staff_page.fill("input[name=password]", "pw-for-tests")
    staff_page.click("[type=submit]")
    staff_page.wait_for_url(f"**/order/staff/{order.pk}/")
    staff_page.select_option("select[name=action]", "partial")
    staff_page.fill("input[name=paid_amount]", str(half))
    staff_page.fill("textarea[name=note]", "half arrived in block 800000")
    staff_page.click("#staff-action button[type=submit]")
    staff_page.wait_for_url("**/order/staff/")

    # then: the customer reads what is missing, in BTC, and whom to write to
    page.goto(tracking(live_server, order))
    missing = order.crypto_amount - half
    assert page.locator("#missing").inner_text() == f"{missing.normalize():f} BTC"
    assert page.locator("#paid-amount").inner_text() == f"{half.normalize():f} BTC"
    assert (
        page.locator("#payment-uri")
        .get_attribute("href")
        .endswith(f"amount={missing.normalize():f}")
    )
    explanation = page.locator("#explanation").inner_text()
    assert settings.OPERATOR_EMAIL in explanation and "contact us" not in explanation


def test_the_refresh_never_leaves_i_paid_under_a_confirmed_status(
    page, live_server, make_order, transactional_db
):
    order = make_order()
    page.goto(tracking(live_server, order))
    assert page.locator("#i-paid").count() == 1

    svc.order_confirm_payment(order=order, actor="staff:t", note="seen on chain")
    # The refresh comes every 15 s; this event is the one it also listens to.
    page.dispatch_event("#order-state", "countdown-over")
    page.wait_for_function(
        "() => document.querySelector('[data-status]').innerText === 'Payment confirmed'"
    )
    for gone in ("#i-paid", "#paid-form", "#qr", "#payment-uri", "#countdown"):
        assert page.locator(gone).count() == 0, gone
    assert "seen on chain" in page.locator("ol.timeline").inner_text()


def test_a_phone_never_scrolls_sideways(new_page, live_server, make_order, transactional_db):
    live = make_order()
    PaymentAddress.objects.filter(order=live).update(address=LONG_ADDRESS)
    underpaid = make_order()
    svc.order_mark_underpaid(
        order=underpaid,
        actor="staff:t",
        note="short",
        paid_amount=(underpaid.crypto_amount / 3).quantize(Decimal("0.00000001")),
    )
    active = make_order()
    Order.objects.filter(pk=active.pk).update(
        status=Status.ACTIVE,
        starts_at=timezone.now(),
        ends_at=timezone.now() + timedelta(days=7),
    )
    page = new_page(viewport=PHONE, is_mobile=True, has_touch=True)
    paths = [
        "/order/",
        f"/order/t/{live.tracking_token}/",
        f"/order/t/{underpaid.tracking_token}/",
        f"/order/t/{active.tracking_token}/",
        "/order/recover/",
        "/terms/",
        "/refunds/",
        "/contact/",
    ]
    for path in paths:
        page.goto(f"{live_server.url}{path}")
        widths = page.evaluate(
            "() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]"
        )
        assert widths[0] <= widths[1], (path, widths)
