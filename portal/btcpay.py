"""BTCPay Server (Greenfield) webhook deliveries, applied to orders through the services.

A delivery is authenticated by its `BTCPay-Sig` header, recorded once in
WebhookDelivery (a redelivery carries the first delivery's id) and mapped onto
a service of portal/order_services.py, which alone decides whether the order
may move. It moves an order only for the invoice recorded on that order (the
quote order_create made), and a payment event only after BTCPay itself said
what the invoice asks and what arrived: a webhook carries no amount, and a
store's settlement may accept less than the quote (payment tolerance).

A signed delivery is answered 2xx or 400, since retrying a refused transition
never helps; the one exception is a payment BTCPay could not be asked about
(503, nothing recorded), so that BTCPay's retry applies it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction

from portal import btcpay_client, order_services
from portal.models import Order, WebhookDelivery, format_amount
from portal.order_states import Status, TransitionRefused

log = logging.getLogger(__name__)

SIGNATURE_SCHEME = "sha256"
# Events that say money arrived: checked against the invoice before they move an order.
PAYMENT_EVENTS = frozenset({"InvoiceReceivedPayment", "InvoiceProcessing", "InvoiceSettled"})


@dataclass(frozen=True)
class WebhookResult:
    status: int
    message: str


def verify_signature(*, body: bytes, header: str, secret: str) -> bool:
    """`header` is `sha256=<hex HMAC-SHA256 of the raw body>`; no secret, no delivery."""
    if not secret or not header:
        return False
    scheme, _, received = header.strip().partition("=")
    if scheme.strip().lower() != SIGNATURE_SCHEME or not received:
        return False
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    # Bytes, so a header with non-ASCII characters is a mismatch, not a TypeError.
    return hmac.compare_digest(expected.encode(), received.strip().lower().encode())


def handle_delivery(*, body: bytes, signature_header: str) -> WebhookResult:
    secret = settings.BTCPAY_WEBHOOK_SECRET
    if not verify_signature(body=body, header=signature_header, secret=secret):
        # Nothing from the body: an unsigned request is anyone's, and may carry
        # customer data we must not copy into logs.
        reason = "missing or bad signature" if secret else "BTCPAY_WEBHOOK_SECRET is not set"
        log.warning("BTCPay webhook refused: %s", reason)
        return WebhookResult(401, "invalid signature")
    try:
        payload = json.loads(body)
    except ValueError:
        return WebhookResult(400, "body is not JSON")
    if not isinstance(payload, dict):
        return WebhookResult(400, "body is not a JSON object")

    # A redelivery gets a new deliveryId; only originalDeliveryId names the event.
    key = payload.get("originalDeliveryId") or payload.get("deliveryId")
    max_key = WebhookDelivery._meta.get_field("delivery_id").max_length
    if not isinstance(key, str) or not 0 < len(key) <= max_key:
        return WebhookResult(400, "no usable deliveryId")
    event_type = str(payload.get("type") or "")[:50]
    invoice_id = str(payload.get("invoiceId") or "")[:100]
    if WebhookDelivery.objects.filter(delivery_id=key).exists():
        return WebhookResult(200, "already applied")  # before asking BTCPay anything
    order = _find_order(invoice_id=invoice_id)
    payment: btcpay_client.InvoicePayment | str | None = None
    if order is not None and _asks_payment(event_type, payload):
        try:
            payment = _invoice_payment(order=order, invoice_id=invoice_id)
        except btcpay_client.BTCPayError as exc:
            log.warning("BTCPay %s for invoice %s not checked: %s", event_type, invoice_id, exc)
            return WebhookResult(503, "the invoice could not be checked with BTCPay; retry later")

    try:
        with transaction.atomic():
            # The row goes in first: of two concurrent deliveries of one event,
            # the second waits on the unique delivery_id and then fails here,
            # before it touches the order.
            delivery = WebhookDelivery.objects.create(
                delivery_id=key, event_type=event_type, invoice_id=invoice_id, outcome="received"
            )
            delivery.order = order
            delivery.outcome = _apply(
                order=order,
                event_type=event_type,
                invoice_id=invoice_id,
                payload=payload,
                payment=payment,
            )[:300]
            delivery.save(update_fields=["order", "outcome"])
    except IntegrityError:
        if not WebhookDelivery.objects.filter(delivery_id=key).exists():
            raise  # not the dedupe key: a real fault, let it surface
        return WebhookResult(200, "already applied")
    log.info(
        "BTCPay %s for invoice %s (%s): %s",
        event_type,
        invoice_id,
        delivery.order.reference if delivery.order else "no order",
        delivery.outcome,
    )
    return WebhookResult(200, delivery.outcome)


def _asks_payment(event_type: str, payload: dict) -> bool:
    """Whether the event is applied only after BTCPay said what arrived: the
    payment events, and an expiry with a partial payment (the customer's page
    says how much is missing)."""
    if event_type in PAYMENT_EVENTS:
        return True
    return event_type == "InvoiceExpired" and payload.get("partiallyPaid") is True


def _find_order(*, invoice_id: str) -> Order | None:
    """The order whose quote is this invoice (order_create recorded its id).

    Never the order an invoice's metadata names: anyone who can make an invoice
    in the store (a pay button, a point of sale) can write any orderId there
    and pay a cent.
    """
    if not invoice_id:
        return None
    return Order.objects.filter(btcpay_invoice_id=invoice_id).first()


def _invoice_payment(*, order: Order, invoice_id: str) -> btcpay_client.InvoicePayment | str:
    """BTCPay's view of the invoice, or why it can never be had (a str);
    BTCPayError when BTCPay did not answer (worth a retry)."""
    client = btcpay_client.client_from_settings()
    if client is None:
        return "BTCPay is not configured, so the invoice cannot be checked; staff decide"
    return client.invoice_payment(invoice_id=invoice_id, crypto_code=order.currency.code)


def _amount(value, order: Order) -> str:
    return f"{format_amount(value, order.currency.decimals)} {order.currency.code}"


def _mismatch(*, order: Order, payment: btcpay_client.InvoicePayment) -> str:
    """Why this invoice is not the order's quote; empty when it is."""
    if payment.order_id != order.reference:
        return f"invoice {payment.invoice_id} names order {payment.order_id or '(none)'}"
    same_currency = payment.currency.upper() == order.fiat_currency.upper()
    if not same_currency or payment.amount != order.fiat_total:
        return (
            f"invoice {payment.invoice_id} is for {payment.amount} {payment.currency}, "
            f"the order's quote is {order.fiat_total} {order.fiat_currency}"
        )
    if payment.paid is None:
        return f"invoice {payment.invoice_id} has no {order.currency.code} payment method"
    return ""


Action = Callable[..., Order]


def _plan(
    *, event_type: str, payload: dict, order: Order, paid: Decimal | None
) -> tuple[str, Action, str, dict] | str | None:
    """The target status, the service, a note suffix and the service's extra
    arguments; or an outcome when the event moves nothing (a partial payment
    so far). `paid` is what BTCPay says arrived, for payment events."""

    def flag(name: str) -> bool:
        return payload.get(name) is True  # JSON true only: "false" is not true

    marked = "; marked by hand in BTCPay" if flag("manuallyMarked") else ""
    if event_type in PAYMENT_EVENTS and paid is not None:
        quoted = order.crypto_amount
        received = f"; {_amount(paid, order)} received of {_amount(quoted, order)} quoted"
        over = paid > quoted
        if paid < quoted:
            if event_type == "InvoiceReceivedPayment":
                # The customer may still send the rest; BTCPay says when the invoice ends.
                return f"recorded: partial payment{received}"
            # BTCPay counts it paid (its payment tolerance, or marked by hand):
            # short of the quote, it is underpaid for staff, as they would mark it.
            return (
                Status.UNDERPAID,
                order_services.order_mark_underpaid,
                f"{received}, short by {_amount(quoted - paid, order)}{marked}",
                {"paid_amount": paid},
            )
        if event_type == "InvoiceReceivedPayment":
            late = "; after the invoice expired" if flag("afterExpiration") else ""
            return Status.PAYMENT_SEEN, order_services.order_mark_payment_seen, late + received, {}
        if event_type == "InvoiceProcessing":
            suffix = ("; overpaid" if over else "") + received
            return Status.PAYMENT_SEEN, order_services.order_mark_payment_seen, suffix, {}
        suffix = ("; overpaid" if over else "") + received + marked
        extra = {"overpaid": over, "paid_amount": paid}
        return Status.CONFIRMED, order_services.order_confirm_payment, suffix, extra
    if event_type == "InvoiceExpired":
        if flag("partiallyPaid"):
            if paid is not None and paid < order.crypto_amount:
                quote = _amount(order.crypto_amount, order)
                received = f"; {_amount(paid, order)} received of {quote}"
                extra = {"paid_amount": paid}
            else:
                received, extra = "", {}
            suffix = f"; partially paid{received}"
            return Status.UNDERPAID, order_services.order_mark_underpaid, suffix, extra
        return Status.EXPIRED, order_services.order_expire, "", {}
    if event_type == "InvoiceInvalid":
        return Status.REJECTED, order_services.order_reject, marked, {}
    return None


def _apply(
    *,
    order: Order | None,
    event_type: str,
    invoice_id: str,
    payload: dict,
    payment: btcpay_client.InvoicePayment | str | None,
) -> str:
    known = event_type in PAYMENT_EVENTS or event_type in ("InvoiceExpired", "InvoiceInvalid")
    if not known:
        return "ignored"
    if order is None:
        # Answered 200 all the same: BTCPay retrying would not make the order exist.
        return "no such order"
    paid = None
    if isinstance(payment, str):
        log.warning("BTCPay %s for %s not applied: %s", event_type, order.reference, payment)
        return f"refused: {payment}"
    if payment is not None:
        mismatch = _mismatch(order=order, payment=payment)
        if mismatch:
            log.warning("BTCPay %s for %s not applied: %s", event_type, order.reference, mismatch)
            return f"refused: {mismatch}"
        paid = payment.paid
    plan = _plan(event_type=event_type, payload=payload, order=order, paid=paid)
    if plan is None:
        return "ignored"
    if isinstance(plan, str):
        return plan
    target, action, suffix, extra = plan
    label = Status(target).label.lower()
    if order.status == target:
        # Common: our own sweep expired the order before BTCPay said so.
        return f"already {label}"
    note = f"BTCPay {event_type}, invoice {invoice_id or '(none)'}{suffix}"
    try:
        moved = action(order=order, actor=order_services.BTCPAY, note=note, **extra)
    except TransitionRefused as refused:
        return f"refused: {refused}"
    # Not always `target`: a payment for cards sold meanwhile awaits capacity.
    return f"applied: {moved.get_status_display().lower()}"
