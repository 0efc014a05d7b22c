"""The rental order's states and the transitions allowed between them: the one place.

Payment states follow BTCPay Server's invoice model: New → Processing → Settled,
or Expired / Invalid, with the exceptions paidLate, paidPartial and paidOver
(here `Order.exception`). Views and webhooks never decide a transition; they
call a service in portal/order_services.py, which checks this table.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Status(models.TextChoices):
    AWAITING_PAYMENT = "awaiting_payment", "Awaiting payment"
    PAYMENT_NOTIFIED = "payment_notified", "Payment notified"
    PAYMENT_SEEN = "payment_seen", "Payment seen"
    CONFIRMED = "confirmed", "Payment confirmed"
    PROVISIONING = "provisioning", "Provisioning"
    ACTIVE = "active", "Active"
    COMPLETED = "completed", "Completed"
    EXPIRED = "expired", "Expired"
    UNDERPAID = "underpaid", "Underpaid"
    REJECTED = "rejected", "Rejected"
    # "I paid" was pressed but no payment was seen within ORDER_NOTICE_HOLD_MINUTES:
    # the cards go back on sale and staff still look at the notice.
    HOLD_LAPSED = "hold_lapsed", "Not verified in time (cards released)"
    # A payment arrived for cards that are no longer free: staff provision once
    # capacity frees, or refund.
    AWAITING_CAPACITY = "awaiting_capacity", "Paid, awaiting capacity or refund"
    REFUNDED = "refunded", "Refunded"


class PaymentException(models.TextChoices):
    NONE = "", "none"
    PAID_LATE = "paid_late", "paid late (after the quote expired)"
    PAID_PARTIAL = "paid_partial", "paid partially"
    PAID_OVER = "paid_over", "paid more than the quote"


S = Status
# A payment that arrives while the order holds no cards (expired, hold lapsed)
# takes them again only if they are still free; otherwise the order goes to
# AWAITING_CAPACITY instead (order_services._admit), hence that target beside
# every payment outcome of a non-holding state.
ALLOWED: dict[str, frozenset[str]] = {
    S.AWAITING_PAYMENT: frozenset(
        {
            S.PAYMENT_NOTIFIED,
            S.PAYMENT_SEEN,
            S.CONFIRMED,
            S.UNDERPAID,
            S.EXPIRED,
            S.REJECTED,
            S.AWAITING_CAPACITY,
        }
    ),
    # A notice is the customer's word: it holds the cards for a window, then
    # the sweep releases them and the order waits for staff or the processor.
    S.PAYMENT_NOTIFIED: frozenset(
        {
            S.PAYMENT_SEEN,
            S.CONFIRMED,
            S.UNDERPAID,
            S.REJECTED,
            S.HOLD_LAPSED,
            S.AWAITING_CAPACITY,
        }
    ),
    S.HOLD_LAPSED: frozenset(
        {S.PAYMENT_SEEN, S.CONFIRMED, S.UNDERPAID, S.REJECTED, S.AWAITING_CAPACITY}
    ),
    S.PAYMENT_SEEN: frozenset({S.CONFIRMED, S.UNDERPAID, S.REJECTED}),
    # A payment after expiry (BTCPay's paidLate) is staff's call: confirm or reject.
    S.EXPIRED: frozenset(
        {S.PAYMENT_SEEN, S.CONFIRMED, S.UNDERPAID, S.REJECTED, S.AWAITING_CAPACITY}
    ),
    # The customer tops up the difference; staff confirm once it arrived. After
    # its window the order holds no cards, so a top-up may find them gone.
    S.UNDERPAID: frozenset({S.PAYMENT_SEEN, S.CONFIRMED, S.REJECTED, S.AWAITING_CAPACITY}),
    # Staff's to resolve: provision when the cards are free again, or refund.
    # A confirmation (the processor's settlement of a payment seen earlier)
    # leads to CONFIRMED only if the cards are free by then.
    S.AWAITING_CAPACITY: frozenset({S.CONFIRMED, S.PROVISIONING, S.REFUNDED}),
    S.CONFIRMED: frozenset({S.PROVISIONING}),
    S.PROVISIONING: frozenset({S.ACTIVE}),
    S.ACTIVE: frozenset({S.COMPLETED}),
    S.COMPLETED: frozenset(),
    S.REJECTED: frozenset(),
    S.REFUNDED: frozenset(),
}

# Orders in these states hold their cards until they move on.
HOLDS_STOCK = frozenset({S.PAYMENT_SEEN, S.CONFIRMED, S.PROVISIONING, S.ACTIVE})
# Orders not (fully) paid hold their cards until `Order.held_until` only: the
# quote's expiry, then ORDER_NOTICE_HOLD_MINUTES after "I paid", and
# ORDER_UNDERPAID_HOLD_HOURS after a partial payment. Nothing but a full
# payment holds cards for longer, so neither a quote nor a token payment keeps
# stock off sale for good.
HOLDS_STOCK_UNTIL = frozenset({S.AWAITING_PAYMENT, S.PAYMENT_NOTIFIED, S.UNDERPAID})


def holding(now) -> models.Q:
    """The orders whose cards are not for sale at `now` (a filter on Order)."""
    return models.Q(status__in=HOLDS_STOCK) | models.Q(
        status__in=HOLDS_STOCK_UNTIL, held_until__gt=now
    )


def holds_cards(order, now) -> bool:
    if order.status in HOLDS_STOCK:
        return True
    return (
        order.status in HOLDS_STOCK_UNTIL
        and order.held_until is not None
        and order.held_until > now
    )


# The customer may press "I paid" here (after expiry too: the order is flagged).
# A notice never holds cards again once its window lapsed.
ACCEPTS_NOTICE = frozenset(
    {S.AWAITING_PAYMENT, S.PAYMENT_NOTIFIED, S.PAYMENT_SEEN, S.EXPIRED, S.UNDERPAID, S.HOLD_LAPSED}
)
FINAL = frozenset({S.COMPLETED, S.REJECTED, S.REFUNDED})

# What the tracking page says under each state.
EXPLANATION: dict[str, str] = {
    S.AWAITING_PAYMENT: "Send the amount below to the address below before the quote expires.",
    S.PAYMENT_NOTIFIED: "Your notice was recorded. Verification is under way: we check the "
    "payment on the chain; a notice alone is not proof of payment.",
    S.PAYMENT_SEEN: "Your payment was seen on the network; it is waiting for confirmations.",
    S.CONFIRMED: "Payment confirmed. Your machines will be prepared next.",
    S.PROVISIONING: "Your machines are being prepared: credentials, export folders, batch list.",
    S.ACTIVE: "Your rental is running. Retrieve your results before it ends.",
    S.COMPLETED: "The rental has ended.",
    S.EXPIRED: "The quote expired before a payment was seen: do not pay it any more. Get a new "
    'quote for the same plan from your order page; if you had paid already, press "I paid" '
    "there and staff will look for your payment.",
    S.UNDERPAID: "Less than the quoted amount arrived. Send the difference to the same address "
    'and press "I paid" again, or write to {operator_email} quoting your order reference. '
    "Your cards stay reserved for a limited time (shown below); after it, your order goes "
    "ahead only if they are still free when the rest arrives, otherwise you are refunded.",
    S.REJECTED: "The order was rejected. The note below says why.",
    S.HOLD_LAPSED: "No payment was seen in time after your notice, so your cards went back on "
    "sale. Staff still check your notice: if your payment arrives and the cards are still "
    "free, your order goes ahead; otherwise you are refunded.",
    S.AWAITING_CAPACITY: "Your payment arrived, but the cards of your plan were taken in the "
    "meantime. Staff will prepare your machines as soon as cards are free, or refund you.",
    S.REFUNDED: "Your payment was refunded. The note below says how.",
}


def explanation(status: str) -> str:
    """What the tracking page and the e-mails say under `status`, with the
    operator's contact where the customer may need to write."""
    return EXPLANATION.get(status, "").format(operator_email=settings.OPERATOR_EMAIL)


class TransitionRefused(Exception):
    """An order was asked to move where the table does not allow."""

    def __init__(self, current: str, target: str, reason: str = ""):
        self.current, self.target = current, target
        super().__init__(
            reason
            or f"an order that is {Status(current).label.lower()} cannot become "
            f"{Status(target).label.lower()}"
        )


def check_transition(current: str, target: str) -> None:
    if target not in ALLOWED.get(current, frozenset()):
        raise TransitionRefused(current, target)
