"""The tracking page in every order state: it shows what applies there, and only that.

A payment is asked for (QR code, payment link, "Pay before", "Press I paid after
sending") only while the quote is live; an expired quote offers a new quote for
the same plan instead; paid orders never show where or before when to pay; an
underpaid order asks for the missing amount, with its currency.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from decimal import Decimal
from html import unescape
from urllib.parse import parse_qs, urlsplit

import pytest
from django.utils import timezone

from portal import order_services as svc
from portal.models import Order, RentalDuration
from portal.order_states import ACCEPTS_NOTICE, Status

S = Status
STAFF = "staff:tester"

# What asks for a payment on the page.
ASKS_PAYMENT = ("qr", "payment-uri", "countdown", "expiry")
ASK_WORDS = ("Pay before", 'Press "I paid" after sending')


@dataclass(frozen=True)
class Shows:
    asks_payment: bool = False
    notice_form: bool = False
    requote: bool = False
    address: bool = True
    rental: bool = False


EXPECTED: dict[str, Shows] = {
    S.AWAITING_PAYMENT: Shows(asks_payment=True, notice_form=True),
    S.PAYMENT_NOTIFIED: Shows(notice_form=True),
    S.HOLD_LAPSED: Shows(notice_form=True),
    S.PAYMENT_SEEN: Shows(),
    S.CONFIRMED: Shows(),
    S.PROVISIONING: Shows(),
    S.ACTIVE: Shows(rental=True),
    S.COMPLETED: Shows(requote=True, rental=True),
    S.EXPIRED: Shows(notice_form=True, requote=True, address=False),
    # With the amount that arrived: the missing amount is asked for (below).
    S.UNDERPAID: Shows(notice_form=True),
    S.REJECTED: Shows(requote=True, address=False),
    S.AWAITING_CAPACITY: Shows(),
    S.REFUNDED: Shows(requote=True),
}


def test_every_state_has_its_expectations():
    assert set(EXPECTED) == set(Status.values)


def ids(html: str) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', html))


def text(html: str) -> str:
    return unescape(re.sub(r"<[^>]+>", " ", html))


def in_state(order: Order, status: str, **fields) -> Order:
    now = timezone.now()
    if status in (S.ACTIVE, S.COMPLETED):
        fields = {"starts_at": now - timedelta(days=1), "ends_at": now + timedelta(days=6)} | fields
    Order.objects.filter(pk=order.pk).update(status=status, **fields)
    order.refresh_from_db()
    return order


def track(client, order: Order, **headers) -> str:
    response = client.get(f"/order/t/{order.tracking_token}/", **headers)
    assert response.status_code == 200
    return response.content.decode()


@pytest.mark.parametrize("status", Status.values)
def test_the_page_shows_only_what_applies_to_the_state(client, make_order, status):
    order = make_order()
    fields = {"paid_amount": order.crypto_amount / 2} if status == S.UNDERPAID else {}
    order = in_state(order, status, **fields)
    expected = EXPECTED[status]

    html = track(client, order)
    found, words = ids(html), text(html)

    asks = {"qr", "payment-uri"} if status == S.UNDERPAID else set(ASKS_PAYMENT)
    if expected.asks_payment or status == S.UNDERPAID:
        assert asks <= found, f"{status}: the payment request is missing"
    else:
        assert not found & set(ASKS_PAYMENT), f"{status} asks for a payment"
    for phrase in ASK_WORDS:
        assert (phrase in words) == expected.asks_payment, f"{status}: {phrase!r}"
    assert ("i-paid" in found) == expected.notice_form, status
    assert ("requote" in found) == expected.requote, status
    assert ("address" in found) == expected.address, status
    assert ("rental" in found) == expected.rental, status
    assert ("rental-countdown" in found) == (status == S.ACTIVE), status
    # The status named once, in the same partial as everything it governs.
    assert words.count(Status(status).label) >= 1
    assert html.count('id="order-state"') == 1


def test_the_notice_form_is_offered_only_where_a_notice_is_taken():
    # A form the service would refuse is a dead end for the customer.
    from portal.order_page import NOTICE_HEADINGS

    assert set(NOTICE_HEADINGS) <= ACCEPTS_NOTICE


def test_a_quote_past_its_expiry_asks_for_nothing_before_the_sweep_comes(client, make_order):
    # given: the quote ran out a minute ago; the sweep has not moved the order yet
    order = make_order()
    Order.objects.filter(pk=order.pk).update(quote_expires_at=timezone.now() - timedelta(minutes=1))
    order.refresh_from_db()
    assert order.status == S.AWAITING_PAYMENT

    html = track(client, order)

    # then: it reads as expired, with no payment request and a new quote offered
    found, words = ids(html), text(html)
    assert 'data-status="expired"' in html
    assert not found & set(ASKS_PAYMENT)
    assert order.payment_address.address not in words
    assert "Pay before" not in words and 'Press "I paid" after sending' not in words
    assert "requote" in found
    assert "Paid before the quote expired?" in words
    assert "do not pay it any more" in words


def test_a_new_quote_for_the_plan_opens_the_form_with_the_same_plan(client, make_order):
    order = svc.order_expire(order=make_order(gpu="L40S", quantity=2, days=30, currency="LTC"))
    html = track(client, order)
    href = unescape(re.search(r'id="requote" href="([^"]+)"', html).group(1))

    query = parse_qs(urlsplit(href).query)
    duration = RentalDuration.objects.get(days=30)
    assert urlsplit(href).path == "/order/"
    assert query == {
        "gpu": [str(order.gpu_id)],
        "quantity": ["2"],
        "duration": [str(duration.pk)],
        "environment": [str(order.environment_id)],
        "currency": [str(order.currency_id)],
    }
    form = client.get(href).content.decode()
    assert re.search(rf'<option value="{order.gpu_id}" selected>', form)
    assert re.search(r'name="quantity" value="2"', form)
    assert re.search(rf'value="{duration.pk}"[^>]*checked', form)
    assert re.search(rf'<option value="{order.currency_id}" selected>', form)
    # and nothing of the old quote comes along
    assert order.payment_address.address not in form


def test_an_underpaid_order_says_how_much_is_missing_with_its_currency(
    client, staff, make_order, settings
):
    settings.OPERATOR_EMAIL = "help@gpu-rentals.example"
    order = make_order()
    paid = (order.crypto_amount / 2).quantize(Decimal("0.00000001"))
    client.force_login(staff)
    client.post(
        f"/order/staff/{order.pk}/action/",
        {"action": "partial", "note": "part arrived", "paid_amount": str(paid)},
    )
    order.refresh_from_db()
    assert (order.status, order.paid_amount) == (S.UNDERPAID, paid)
    client.logout()

    html = track(client, order)

    missing = order.crypto_amount - paid
    assert re.search(rf'id="missing">{missing.normalize():f} BTC<', html)
    assert re.search(rf'id="paid-amount">{paid.normalize():f} BTC<', html)
    uri = unescape(re.search(r'id="payment-uri"[^>]*>([^<]+)<', html).group(1))
    assert uri.endswith(f"amount={missing.normalize():f}")
    # how to reach the operator, not "contact us"
    assert "help@gpu-rentals.example" in text(html)
    assert "contact us" not in text(html)


def test_an_underpaid_order_without_the_amount_names_whom_to_ask(client, make_order, settings):
    settings.OPERATOR_EMAIL = "help@gpu-rentals.example"
    order = svc.order_mark_underpaid(order=make_order(), actor=STAFF, note="short")
    html = track(client, order)
    assert "missing-unknown" in ids(html)
    assert 'href="mailto:help@gpu-rentals.example"' in html
    assert not ids(html) & {"qr", "payment-uri"}


def test_an_underpaid_order_that_holds_its_cards_for_a_window_says_until_when(
    client, make_order, monkeypatch
):
    # Where a partial payment holds the cards until `held_until` only, the
    # customer reads until when they can top up.
    monkeypatch.setattr("portal.order_page.HOLDS_STOCK_UNTIL", ACCEPTS_NOTICE | {S.UNDERPAID})
    order = svc.order_mark_underpaid(order=make_order(), actor=STAFF, note="short")
    until = timezone.now() + timedelta(hours=20)
    Order.objects.filter(pk=order.pk).update(held_until=until)
    html = track(client, order)
    assert {"reserved-until", "reserved-countdown"} <= ids(html)
    assert until.strftime("%Y-%m-%d %H:%M UTC") in text(html)


def test_marking_partially_paid_needs_the_amount_that_arrived(client, staff, make_order):
    order = make_order()
    client.force_login(staff)
    url = f"/order/staff/{order.pk}/action/"
    page = client.post(url, {"action": "partial", "note": "short"}, follow=True).content.decode()
    assert "Nothing changed" in page and "how much arrived" in page
    order.refresh_from_db()
    assert order.status == S.AWAITING_PAYMENT


def test_an_amount_not_short_of_the_quote_is_no_underpayment(client, staff, make_order):
    order = make_order()
    client.force_login(staff)
    url = f"/order/staff/{order.pk}/action/"
    amount = str(order.crypto_amount)
    page = client.post(
        url, {"action": "partial", "note": "short", "paid_amount": amount}, follow=True
    ).content.decode()
    assert "Nothing changed" in page and "confirm instead" in page
    order.refresh_from_db()
    assert order.status == S.AWAITING_PAYMENT


# --- the auto-refresh ----------------------------------------------------------


def refresh(client, order: Order, version: str = ""):
    return client.get(
        f"/order/t/{order.tracking_token}/",
        {"v": version} if version else {},
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="order-state",
    )


def test_the_refresh_brings_the_status_and_what_it_asks_as_one(client, make_order):
    # given: the customer's page, with its "I paid" form
    order = make_order()
    first = track(client, order)
    assert "i-paid" in ids(first)

    # when staff confirm the payment, the next refresh carries the whole state
    svc.order_confirm_payment(order=order, actor=STAFF, note="seen")
    response = refresh(client, order, re.search(r'"v": "(\w+)"', first).group(1))

    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<div id="order-state"')
    assert "Payment confirmed" in text(html)
    assert not ids(html) & ({"i-paid", "paid-form"} | set(ASKS_PAYMENT))


def test_an_unchanged_order_swaps_nothing_so_a_half_typed_notice_stays(client, make_order):
    order = make_order()
    version = re.search(r'"v": "(\w+)"', track(client, order)).group(1)
    assert refresh(client, order, version).status_code == 204
    # a notice changes the page: the next refresh brings it
    svc.order_record_notice(order=order, transaction_id="tx1")
    assert refresh(client, order, version).status_code == 200


def test_the_refresh_stops_at_a_final_state(client, make_order):
    order = in_state(make_order(), S.COMPLETED)
    response = refresh(client, order, "whatever")
    assert response.status_code == 286
    assert "hx-trigger" not in response.content.decode()
