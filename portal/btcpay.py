"""BTCPay Server (Greenfield) webhook deliveries, applied to orders through the services.

A delivery is authenticated by its `BTCPay-Sig` header, recorded once in
WebhookDelivery (a redelivery carries the first delivery's id) and mapped onto
a service of portal/order_services.py, which alone decides whether the order
may move. Whatever happens to a signed delivery is answered 2xx or 400: BTCPay
retries anything else, and retrying a refused transition never helps.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from django.conf import settings
from django.db import IntegrityError, transaction

from portal import order_services
from portal.models import Order, WebhookDelivery
from portal.order_states import Status, TransitionRefused

log = logging.getLogger(__name__)

SIGNATURE_SCHEME = "sha256"
REFERENCE = re.compile(r"BG-(\d{6,})")


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

    try:
        with transaction.atomic():
            # The row goes in first: of two concurrent deliveries of one event,
            # the second waits on the unique delivery_id and then fails here,
            # before it touches the order.
            delivery = WebhookDelivery.objects.create(
                delivery_id=key, event_type=event_type, invoice_id=invoice_id, outcome="received"
            )
            delivery.order = _find_order(invoice_id=invoice_id, metadata=payload.get("metadata"))
            delivery.outcome = _apply(
                order=delivery.order, event_type=event_type, invoice_id=invoice_id, payload=payload
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


def _find_order(*, invoice_id: str, metadata: object) -> Order | None:
    """The order whose quote is this invoice (made by order_create), else the
    order named by `metadata.orderId` (an invoice staff created by hand)."""
    if invoice_id:
        order = Order.objects.filter(btcpay_invoice_id=invoice_id).first()
        if order is not None:
            return order
    reference = metadata.get("orderId") if isinstance(metadata, dict) else None
    match = REFERENCE.fullmatch(reference) if isinstance(reference, str) else None
    if match is None:
        return None
    order = Order.objects.filter(pk=int(match.group(1))).first()
    # "BG-0000001" is not BG-000001: the reference must be the one we issued.
    if order is None or order.reference != reference:
        return None
    # An order quoted from an invoice of its own listens to that invoice only:
    # another invoice naming it (a stray, a copy) must not move it.
    return None if order.btcpay_invoice_id else order


Action = Callable[..., Order]


def _plan(*, event_type: str, payload: dict) -> tuple[str, Action, str, dict] | None:
    """The target status, the service, a note suffix and the service's extra arguments."""

    def flag(name: str) -> bool:
        return payload.get(name) is True  # JSON true only: "false" is not true

    marked = "; marked by hand in BTCPay" if flag("manuallyMarked") else ""
    if event_type == "InvoiceReceivedPayment":
        late = "; after the invoice expired" if flag("afterExpiration") else ""
        return Status.PAYMENT_SEEN, order_services.order_mark_payment_seen, late, {}
    if event_type == "InvoiceProcessing":
        over = "; overpaid" if flag("overPaid") else ""
        return Status.PAYMENT_SEEN, order_services.order_mark_payment_seen, over, {}
    if event_type == "InvoiceSettled":
        over = flag("overPaid")
        suffix = ("; overpaid" if over else "") + marked
        return Status.CONFIRMED, order_services.order_confirm_payment, suffix, {"overpaid": over}
    if event_type == "InvoiceExpired":
        if flag("partiallyPaid"):
            return Status.UNDERPAID, order_services.order_mark_underpaid, "; partially paid", {}
        return Status.EXPIRED, order_services.order_expire, "", {}
    if event_type == "InvoiceInvalid":
        return Status.REJECTED, order_services.order_reject, marked, {}
    return None


def _apply(*, order: Order | None, event_type: str, invoice_id: str, payload: dict) -> str:
    plan = _plan(event_type=event_type, payload=payload)
    if plan is None:
        return "ignored"
    if order is None:
        # Answered 200 all the same: BTCPay retrying would not make the order exist.
        return "no such order"
    target, action, suffix, extra = plan
    label = Status(target).label.lower()
    if order.status == target:
        # Common: our own sweep expired the order before BTCPay said so.
        return f"already {label}"
    note = f"BTCPay {event_type}, invoice {invoice_id or '(none)'}{suffix}"
    try:
        action(order=order, actor=order_services.BTCPAY, note=note, **extra)
    except TransitionRefused as refused:
        return f"refused: {refused}"
    return f"applied: {label}"
