"""What the tracking page shows of an order at a given moment: the one place.

Each state shows only what applies to it. A payment is asked for (amount,
address, payment link, QR code, "Pay before" and its countdown) only while the
quote is live; an underpaid order asks for the missing amount only; an expired
quote asks for nothing and offers a new quote for the same plan instead; paid
orders show what was paid, never where to pay. The template renders these
facts and decides nothing (templates/orders/order_track.html).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from urllib.parse import urlencode

import segno
from django.urls import reverse
from django.utils.safestring import SafeString, mark_safe

from portal.models import Order, RentalDuration
from portal.order_states import FINAL, HOLDS_STOCK_UNTIL, Status, explanation

S = Status

# The customer may press "I paid" on the page here, under a heading of its own.
# (order_states.ACCEPTS_NOTICE also takes a notice on a payment already seen:
# the page does not ask for one there, it adds nothing.)
NOTICE_HEADINGS: dict[str, tuple[str, str]] = {
    S.AWAITING_PAYMENT: (
        "Paid already?",
        'Press "I paid" after sending the amount. It tells our staff to look for your '
        "payment; the order is confirmed once the payment is seen.",
    ),
    S.PAYMENT_NOTIFIED: (
        "Another transaction to add?",
        "Your notice is recorded. Add a transaction id here if you sent more than one "
        "payment, or did not give it before.",
    ),
    S.HOLD_LAPSED: (
        "Another transaction to add?",
        "Your notice is recorded and staff will check it. Add a transaction id here if you "
        "did not give it before.",
    ),
    S.EXPIRED: (
        "Paid before the quote expired?",
        "Tell us, and staff will look for your payment. Do not send a payment now: this "
        "quote has expired; get a new quote instead.",
    ),
    S.UNDERPAID: (
        "Sent the difference?",
        'Press "I paid" once you sent the missing amount; staff confirm the order when it is seen.',
    ),
}

# Where a new quote for the same plan is offered: nothing is owed or pending.
REQUOTE = frozenset({S.EXPIRED, S.REJECTED, S.REFUNDED, S.COMPLETED})
# The address is the customer's to check a payment they made; after expiry or a
# rejection it is not shown, so nobody sends money to a quote that is over.
NO_ADDRESS = frozenset({S.EXPIRED, S.REJECTED})
# A payment arrived (or was refunded): the page says what was paid, not where to pay.
PAID = frozenset(
    {S.PAYMENT_SEEN, S.CONFIRMED, S.PROVISIONING, S.ACTIVE, S.COMPLETED, S.AWAITING_CAPACITY}
)


@dataclass(frozen=True)
class PaymentRequest:
    """What the customer is asked to send, and where: shown with a QR code."""

    amount: Decimal
    uri: str
    qr_svg: SafeString


@dataclass(frozen=True)
class TrackPage:
    status: str
    status_label: str
    explanation: str
    # The quote is live: "Pay before", its countdown and the payment request.
    quote_live: bool
    request: PaymentRequest | None
    # Underpaid: what arrived and what is missing, when staff or BTCPay said.
    paid_amount: Decimal | None
    missing: Decimal | None
    # Until when the cards stay reserved for a top-up, where a partial payment
    # holds them for a window only (order_states.HOLDS_STOCK_UNTIL).
    reserved_until: datetime | None
    show_address: bool
    paid: bool
    notice_heading: tuple[str, str] | None
    requote_url: str
    final: bool
    # Changes whenever anything on the page would: the auto-refresh swaps the
    # page's state only then, so a half-typed "I paid" form is never replaced
    # by the same form.
    version: str


def effective_status(order: Order, now: datetime) -> str:
    """The order's status as the customer should read it: a quote past its
    expiry is expired, even before the sweep (a minute at most) moves it."""
    if order.status == S.AWAITING_PAYMENT and now >= order.quote_expires_at:
        return S.EXPIRED
    return order.status


def missing_amount(order: Order) -> Decimal | None:
    """What an underpaid order still lacks, when what arrived is known."""
    if order.status != S.UNDERPAID or order.paid_amount is None:
        return None
    return max(Decimal(0), order.crypto_amount - order.paid_amount)


def _request(order: Order, amount: Decimal) -> PaymentRequest:
    uri = order.payment_uri(amount)
    svg = segno.make(uri, error="m").svg_inline(scale=4, title="Payment QR code")
    return PaymentRequest(amount=amount, uri=uri, qr_svg=mark_safe(svg))  # noqa: S308 — segno's SVG of our URI


def requote_url(order: Order) -> str:
    """The order form with this order's plan chosen: cards, quantity, duration,
    software, currency (and the campaign it was for). A new order, with its
    own quote and address, comes from it; nothing of this one is reused."""
    params: dict[str, object] = {
        "gpu": order.gpu_id,
        "quantity": order.quantity,
        "environment": order.environment_id,
        "currency": order.currency_id,
    }
    duration = (
        RentalDuration.objects.filter(days=order.duration_days, active=True)
        .values_list("pk", flat=True)
        .first()
    )
    if duration is not None:
        params["duration"] = duration
    campaign = order.campaign
    if campaign is not None:
        params["campaign"] = campaign.name
        if order.profile_id is not None:
            params["profile"] = order.profile_id
    return f"{reverse('order_new')}?{urlencode(params)}"


def track_page(*, order: Order, now: datetime, events: int, notices: int) -> TrackPage:
    """`events` and `notices`: how many the order has (they change the page too)."""
    status = effective_status(order, now)
    has_address = hasattr(order, "payment_address")
    quote_live = status == S.AWAITING_PAYMENT
    missing = missing_amount(order)
    request = None
    if has_address and quote_live:
        request = _request(order, order.crypto_amount)
    elif has_address and missing:
        request = _request(order, missing)
    facts = (
        status,
        order.exception,
        order.paid_late,
        order.paid_amount,
        order.updated_at.isoformat(),
        events,
        notices,
    )
    version = hashlib.sha256("|".join(map(str, facts)).encode()).hexdigest()[:16]
    return TrackPage(
        status=status,
        status_label=S(status).label,
        explanation=explanation(status),
        quote_live=quote_live,
        request=request,
        paid_amount=order.paid_amount if status == S.UNDERPAID else None,
        missing=missing,
        reserved_until=order.held_until
        if status == S.UNDERPAID and S.UNDERPAID in HOLDS_STOCK_UNTIL and order.held_until
        else None,
        show_address=has_address and status not in NO_ADDRESS,
        paid=status in PAID,
        notice_heading=NOTICE_HEADINGS.get(status),
        requote_url=requote_url(order) if status in REQUOTE else "",
        final=order.status in FINAL,
        version=version,
    )
