"""BTCPay Server webhook deliveries, as BTCPay signs and sends them.

Orders are quoted from invoices of a small Greenfield server on 127.0.0.1
(tests/portal/test_btcpay_invoices.py), which the webhook asks what each invoice
asks and what arrived on it, as it asks BTCPay.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import uuid
from decimal import Decimal

import pytest
from django.test import Client, RequestFactory
from django.urls import path

from portal import order_services
from portal.models import Order, OrderEvent, WebhookDelivery
from portal.webhook_views import btcpay_webhook
from tests.portal.test_btcpay_invoices import WEBHOOK_SECRET as SECRET
from tests.portal.test_btcpay_invoices import FakeBTCPay, btcpay_server  # noqa: F401 — a fixture

FULL = "full"
URL = "/order/btcpay/webhook/"

# Only for the test that goes through the middleware (CSRF): the project's
# route is added in portal/urls.py.
urlpatterns = [path(URL.lstrip("/"), btcpay_webhook, name="btcpay_webhook")]


_store: FakeBTCPay | None = None


@pytest.fixture(autouse=True)
def store(btcpay_server):  # noqa: F811 — the fixture imported above
    """BTCPay configured, its webhook secret SECRET: every order's quote is an invoice."""
    global _store
    _store = btcpay_server
    yield btcpay_server
    _store = None


def sign(body: bytes, secret: str = SECRET) -> str:
    # As BTCPay Server does: sha256=HMAC256(UTF8(secret), body), lowercase hex.
    return "sha256=" + hmac.new(secret.encode("utf-8"), body, hashlib.sha256).hexdigest()


def event(order, type_: str, paid: Decimal | str | None = FULL, **fields) -> dict:
    """BTCPay's delivery for `order`'s invoice; a payment event first pays the
    invoice in the store (`paid`: the quote in full by default, None for nothing)."""
    invoice_id = order.btcpay_invoice_id if order is not None else "inv-unknown"
    if order is not None and type_ in (
        "InvoiceReceivedPayment",
        "InvoiceProcessing",
        "InvoiceSettled",
    ):
        amount = order.crypto_amount if paid == FULL else paid
        invoice = _store.invoices[invoice_id]
        if amount is not None and Decimal(invoice.get("paid", "0")) < Decimal(amount):
            invoice["paid"] = str(amount)
    return {
        "deliveryId": uuid.uuid4().hex,
        "webhookId": "wh-1",
        "originalDeliveryId": None,
        "isRedelivery": False,
        "type": type_,
        "timestamp": 1700000000,
        "storeId": "store-1",
        "invoiceId": invoice_id,
        "metadata": {"orderId": order.reference if order is not None else "BG-999999"},
        **fields,
    }


def deliver(payload: dict | None = None, *, body: bytes | None = None, signature: str | None = ""):
    """POST like BTCPay: raw JSON body, BTCPay-Sig header (None: no header at all)."""
    body = body if body is not None else json.dumps(payload).encode()
    headers = {}
    if signature is not None:
        headers["HTTP_BTCPAY_SIG"] = signature or sign(body)
    request = RequestFactory().post(URL, data=body, content_type="application/json", **headers)
    response = btcpay_webhook(request)
    return response.status_code, json.loads(response.content)["detail"]


def btcpay_events(order):
    return list(OrderEvent.objects.filter(order=order, actor=order_services.BTCPAY))


# --- authentication --------------------------------------------------------------


def test_a_signed_invoice_settled_confirms_the_order_on_behalf_of_btcpay(make_order):
    order = make_order()
    status, detail = deliver(event(order, "InvoiceSettled"))
    order.refresh_from_db()
    assert (status, detail) == (200, "applied: payment confirmed")
    assert order.status == "confirmed"
    assert order.exception == ""
    [logged] = btcpay_events(order)
    assert (logged.from_status, logged.to_status) == ("awaiting_payment", "confirmed")
    assert "InvoiceSettled" in logged.note and order.btcpay_invoice_id in logged.note


def test_a_bad_signature_is_refused_changes_nothing_and_is_logged_without_the_payload(
    make_order, caplog
):
    order = make_order()
    payload = event(order, "InvoiceSettled")
    with caplog.at_level(logging.WARNING, logger="portal.btcpay"):
        status, _ = deliver(payload, signature=sign(b"another body"))
    order.refresh_from_db()
    assert status == 401
    assert order.status == "awaiting_payment"
    assert not WebhookDelivery.objects.exists()
    assert not btcpay_events(order)
    assert "signature" in caplog.text
    assert order.reference not in caplog.text and order.email not in caplog.text


def test_a_signature_made_with_another_secret_is_refused(make_order):
    order = make_order()
    body = json.dumps(event(order, "InvoiceSettled")).encode()
    assert deliver(body=body, signature=sign(body, "guessed"))[0] == 401
    order.refresh_from_db()
    assert order.status == "awaiting_payment"


def test_a_delivery_without_the_signature_header_is_refused(make_order):
    order = make_order()
    assert deliver(event(order, "InvoiceSettled"), signature=None)[0] == 401
    order.refresh_from_db()
    assert order.status == "awaiting_payment"


def test_with_no_secret_configured_even_a_correctly_signed_delivery_is_refused(
    make_order, settings, caplog
):
    settings.BTCPAY_WEBHOOK_SECRET = ""
    order = make_order()
    body = json.dumps(event(order, "InvoiceSettled")).encode()
    with caplog.at_level(logging.WARNING, logger="portal.btcpay"):
        status, _ = deliver(body=body, signature=sign(body, ""))
    order.refresh_from_db()
    assert status == 401
    assert order.status == "awaiting_payment"
    assert "BTCPAY_WEBHOOK_SECRET" in caplog.text


def test_a_signed_body_that_is_not_json_is_a_bad_request(db):
    assert deliver(body=b"not json{")[0] == 400
    assert not WebhookDelivery.objects.exists()


@pytest.mark.urls(__name__)
def test_the_endpoint_takes_posts_from_btcpay_without_a_csrf_token(make_order):
    order = make_order()
    body = json.dumps(event(order, "InvoiceSettled")).encode()
    client = Client(enforce_csrf_checks=True)
    response = client.post(URL, body, content_type="application/json", HTTP_BTCPAY_SIG=sign(body))
    assert response.status_code == 200
    assert client.get(URL).status_code == 405


# --- redeliveries ---------------------------------------------------------------


def test_the_same_delivery_twice_is_applied_once(make_order):
    order = make_order()
    payload = event(order, "InvoiceSettled")
    assert deliver(payload) == (200, "applied: payment confirmed")
    assert deliver(payload) == (200, "already applied")
    assert len(btcpay_events(order)) == 1
    assert WebhookDelivery.objects.count() == 1


def test_a_redelivery_is_recognised_by_its_original_delivery_id(make_order):
    order = make_order()
    first = event(order, "InvoiceSettled")
    again = {
        **first,
        "deliveryId": uuid.uuid4().hex,
        "isRedelivery": True,
        "originalDeliveryId": first["deliveryId"],
    }
    deliver(first)
    assert deliver(again) == (200, "already applied")
    assert len(btcpay_events(order)) == 1
    [delivery] = WebhookDelivery.objects.all()
    assert delivery.delivery_id == first["deliveryId"]
    assert (delivery.order, delivery.event_type, delivery.invoice_id) == (
        order,
        "InvoiceSettled",
        order.btcpay_invoice_id,
    )


# --- what each event does ------------------------------------------------------------


def test_an_overpaid_settlement_confirms_with_the_paid_over_exception(make_order):
    order = make_order()
    deliver(event(order, "InvoiceSettled", paid=order.crypto_amount * 2, overPaid=True))
    order.refresh_from_db()
    assert (order.status, order.exception) == ("confirmed", "paid_over")


def test_a_payment_received_marks_the_payment_seen(make_order):
    order = make_order()
    assert deliver(event(order, "InvoiceReceivedPayment", afterExpiration=False))[0] == 200
    order.refresh_from_db()
    assert (order.status, order.exception) == ("payment_seen", "")


def test_an_invoice_processing_marks_the_payment_seen_and_notes_an_overpayment(make_order):
    order = make_order()
    deliver(event(order, "InvoiceProcessing", paid=order.crypto_amount * 2, overPaid=True))
    order.refresh_from_db()
    assert order.status == "payment_seen"
    assert "overpaid" in btcpay_events(order)[0].note


def test_an_invoice_expired_partially_paid_makes_the_order_underpaid(make_order):
    order = make_order()
    deliver(event(order, "InvoiceExpired", partiallyPaid=True))
    order.refresh_from_db()
    assert (order.status, order.exception) == ("underpaid", "paid_partial")


def test_an_invoice_expired_unpaid_expires_the_order(make_order):
    order = make_order()
    deliver(event(order, "InvoiceExpired", partiallyPaid=False))
    order.refresh_from_db()
    assert order.status == "expired"
    assert btcpay_events(order)[0].to_status == "expired"


def test_an_invoice_expired_after_our_own_expiry_is_recorded_as_already_expired(make_order):
    order = order_services.order_expire(order=make_order())
    assert deliver(event(order, "InvoiceExpired")) == (200, "already expired")
    assert not btcpay_events(order)


def test_a_payment_after_expiry_marks_an_expired_order_seen_and_paid_late(make_order):
    order = order_services.order_expire(order=make_order())
    deliver(event(order, "InvoiceReceivedPayment", afterExpiration=True))
    order.refresh_from_db()
    assert (order.status, order.exception) == ("payment_seen", "paid_late")
    assert "after the invoice expired" in btcpay_events(order)[0].note


def test_an_invalid_invoice_rejects_the_order(make_order):
    order = make_order()
    deliver(event(order, "InvoiceInvalid"))
    order.refresh_from_db()
    assert order.status == "rejected"


def test_an_unknown_order_is_answered_200_and_recorded(db):
    assert deliver(event(None, "InvoiceSettled")) == (200, "no such order")
    [delivery] = WebhookDelivery.objects.all()
    assert (delivery.outcome, delivery.order) == ("no such order", None)


def test_an_event_we_do_not_handle_is_recorded_as_ignored(make_order):
    order = make_order()
    assert deliver(event(order, "InvoiceCreated")) == (200, "ignored")
    order.refresh_from_db()
    assert order.status == "awaiting_payment"
    assert WebhookDelivery.objects.get().outcome == "ignored"


def test_an_event_arriving_out_of_order_is_refused_with_200_and_changes_nothing(make_order):
    order = make_order()
    deliver(event(order, "InvoiceSettled"))
    status, detail = deliver(event(order, "InvoiceProcessing"))
    order.refresh_from_db()
    assert status == 200
    assert detail.startswith("refused: ")
    assert order.status == "confirmed"
    assert len(btcpay_events(order)) == 1
    assert WebhookDelivery.objects.filter(outcome=detail).count() == 1


def test_a_second_settlement_of_a_confirmed_order_changes_nothing(make_order):
    order = make_order()
    deliver(event(order, "InvoiceSettled"))
    assert deliver(event(order, "InvoiceSettled")) == (200, "already payment confirmed")
    assert len(btcpay_events(order)) == 1


# --- the customer's e-mail -------------------------------------------------------


def test_the_customer_is_e_mailed_once_the_settlement_is_committed(
    make_order, django_capture_on_commit_callbacks, mailoutbox
):
    order = make_order()
    with django_capture_on_commit_callbacks(execute=True):
        deliver(event(order, "InvoiceSettled"))
    [mail] = mailoutbox
    assert mail.to == [order.email]
    assert mail.subject == f"Your order {order.reference}: payment confirmed"


def test_a_replayed_delivery_sends_no_second_e_mail(
    make_order, django_capture_on_commit_callbacks, mailoutbox
):
    order = make_order()
    payload = event(order, "InvoiceSettled")
    with django_capture_on_commit_callbacks(execute=True):
        deliver(payload)
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        deliver(payload)
    assert callbacks == []
    assert len(mailoutbox) == 1


# --- the invoice is checked against the order's quote ------------------------------------


def _pool_order(make_order, settings):
    """An order quoted from the address pool (BTCPay not configured at the time)."""
    saved = (settings.BTCPAY_URL, settings.BTCPAY_STORE_ID, settings.BTCPAY_API_KEY)
    settings.BTCPAY_URL = settings.BTCPAY_STORE_ID = settings.BTCPAY_API_KEY = ""
    order = make_order()
    settings.BTCPAY_URL, settings.BTCPAY_STORE_ID, settings.BTCPAY_API_KEY = saved
    return order


def test_an_invoice_the_portal_did_not_create_moves_no_order(make_order, settings, caplog):
    # Anyone who can make an invoice in the store (a pay button) can name any
    # order in its metadata and pay a cent.
    order = _pool_order(make_order, settings)
    payload = {**event(None, "InvoiceSettled"), "metadata": {"orderId": order.reference}}
    payload["invoiceId"] = "paybutton-invoice-1"
    assert deliver(payload) == (200, "no such order")
    order.refresh_from_db()
    assert order.status == "awaiting_payment"


def test_a_settlement_short_of_the_quote_makes_the_order_underpaid(make_order):
    # BTCPay settles within the store's payment tolerance; the quote was not paid.
    order = make_order()
    half = (order.crypto_amount / 2).quantize(Decimal("0.00000001"))
    status, detail = deliver(event(order, "InvoiceSettled", paid=half))
    order.refresh_from_db()
    assert (status, detail) == (200, "applied: underpaid")
    assert (order.status, order.exception) == ("underpaid", "paid_partial")
    [logged] = btcpay_events(order)
    assert "0.00081666 BTC received of 0.00163333 BTC quoted, short by 0.00081667 BTC" in (
        logged.note
    )


def test_a_settlement_short_of_the_quote_records_what_arrived_for_the_customer(make_order):
    # The tracking page says how much is missing: it needs what arrived.
    order = make_order()
    half = (order.crypto_amount / 2).quantize(Decimal("0.00000001"))
    deliver(event(order, "InvoiceSettled", paid=half))
    order.refresh_from_db()
    assert order.paid_amount == half


def test_an_expiry_partially_paid_records_what_btcpay_says_arrived(make_order):
    order = make_order()
    _store.invoices[order.btcpay_invoice_id]["paid"] = "0.0001"
    status, detail = deliver(event(order, "InvoiceExpired", partiallyPaid=True))
    order.refresh_from_db()
    assert (status, detail) == (200, "applied: underpaid")
    assert (order.status, order.paid_amount) == ("underpaid", Decimal("0.0001"))
    assert "0.0001 BTC received of" in btcpay_events(order)[0].note


def test_an_overpayment_records_what_arrived(make_order):
    order = make_order()
    deliver(event(order, "InvoiceSettled", paid=order.crypto_amount + Decimal("0.01")))
    order.refresh_from_db()
    assert order.paid_amount == order.crypto_amount + Decimal("0.01")


def test_a_processing_invoice_short_of_the_quote_makes_the_order_underpaid(make_order):
    order = make_order()
    deliver(event(order, "InvoiceProcessing", paid=Decimal("0.00000001")))
    order.refresh_from_db()
    assert order.status == "underpaid"


def test_a_partial_payment_so_far_is_recorded_and_moves_nothing(make_order):
    order = make_order()
    status, detail = deliver(event(order, "InvoiceReceivedPayment", paid=Decimal("0.0001")))
    order.refresh_from_db()
    assert status == 200 and detail.startswith("recorded: partial payment; 0.0001 BTC received")
    assert order.status == "awaiting_payment"


def test_an_overpayment_is_confirmed_as_paid_over_whatever_the_flag_says(make_order):
    order = make_order()
    deliver(event(order, "InvoiceSettled", paid=order.crypto_amount + Decimal("0.01")))
    order.refresh_from_db()
    assert (order.status, order.exception) == ("confirmed", "paid_over")


@pytest.mark.parametrize(
    "change", [{"amount": "1.00"}, {"currency": "USD"}, {"metadata": {"orderId": "BG-999999"}}]
)
def test_an_invoice_whose_price_is_not_the_quote_moves_nothing(make_order, store, change, caplog):
    order = make_order()
    payload = event(order, "InvoiceSettled")
    store.invoices[order.btcpay_invoice_id].update(change)
    with caplog.at_level(logging.WARNING, logger="portal.btcpay"):
        status, detail = deliver(payload)
    order.refresh_from_db()
    assert status == 200 and detail.startswith(f"refused: invoice {order.btcpay_invoice_id} ")
    assert order.status == "awaiting_payment"
    assert not btcpay_events(order)
    assert WebhookDelivery.objects.get().outcome == detail
    assert "not applied" in caplog.text


def test_when_btcpay_cannot_be_asked_the_delivery_is_retried_and_then_applied(make_order, store):
    order = make_order()
    payload = event(order, "InvoiceSettled")
    store.fail_with = 502
    assert deliver(payload)[0] == 503
    assert not WebhookDelivery.objects.exists()  # so BTCPay's retry is not "already applied"
    order.refresh_from_db()
    assert order.status == "awaiting_payment"
    store.fail_with = None
    assert deliver(payload) == (200, "applied: payment confirmed")


def test_a_late_settlement_for_cards_sold_meanwhile_awaits_capacity(make_order, store, settings):
    # A100 stock 2: the late order's cards were quoted again after it expired.
    settings.ORDER_MAX_HELD_SHARE = 1  # one customer may quote the whole stock
    late = order_services.order_expire(order=make_order(gpu="A100 SXM", quantity=2))
    store.destination = "bc1qanothercustomersaddress00000000000000"
    make_order(gpu="A100 SXM", quantity=2)
    status, detail = deliver(event(late, "InvoiceSettled", afterExpiration=True))
    late.refresh_from_db()
    assert (status, detail) == (200, "applied: paid, awaiting capacity or refund")
    assert (late.status, late.paid_late) == ("awaiting_capacity", True)
    holding = Order.objects.exclude(status__in=["expired", "awaiting_capacity"])
    assert sum(holding.values_list("quantity", flat=True)) == 2
