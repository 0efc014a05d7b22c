"""The rental order's states and the transitions allowed between them: the one place.

Payment states follow BTCPay Server's invoice model: New → Processing → Settled,
or Expired / Invalid, with the exceptions paidLate, paidPartial and paidOver
(here `Order.exception`). Views and webhooks never decide a transition; they
call a service in portal/order_services.py, which checks this table.
"""

from __future__ import annotations

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


class PaymentException(models.TextChoices):
    NONE = "", "none"
    PAID_LATE = "paid_late", "paid late (after the quote expired)"
    PAID_PARTIAL = "paid_partial", "paid partially"
    PAID_OVER = "paid_over", "paid more than the quote"


S = Status
ALLOWED: dict[str, frozenset[str]] = {
    # A notice is the customer's word, so a notified order waits for staff or
    # the payment processor; it never expires by itself.
    S.AWAITING_PAYMENT: frozenset(
        {S.PAYMENT_NOTIFIED, S.PAYMENT_SEEN, S.CONFIRMED, S.UNDERPAID, S.EXPIRED, S.REJECTED}
    ),
    S.PAYMENT_NOTIFIED: frozenset({S.PAYMENT_SEEN, S.CONFIRMED, S.UNDERPAID, S.REJECTED}),
    S.PAYMENT_SEEN: frozenset({S.CONFIRMED, S.UNDERPAID, S.REJECTED}),
    # A payment after expiry (BTCPay's paidLate) is staff's call: confirm or reject.
    S.EXPIRED: frozenset({S.PAYMENT_SEEN, S.CONFIRMED, S.UNDERPAID, S.REJECTED}),
    # The customer tops up the difference; staff confirm once it arrived.
    S.UNDERPAID: frozenset({S.PAYMENT_SEEN, S.CONFIRMED, S.REJECTED}),
    S.CONFIRMED: frozenset({S.PROVISIONING}),
    S.PROVISIONING: frozenset({S.ACTIVE}),
    S.ACTIVE: frozenset({S.COMPLETED}),
    S.COMPLETED: frozenset(),
    S.REJECTED: frozenset(),
}

# Orders in these states hold their cards: the stock shown is what is left.
HOLDS_STOCK = frozenset(
    {
        S.AWAITING_PAYMENT,
        S.PAYMENT_NOTIFIED,
        S.PAYMENT_SEEN,
        S.CONFIRMED,
        S.PROVISIONING,
        S.ACTIVE,
        S.UNDERPAID,
    }
)
# The customer may press "I paid" here (after expiry too: the order is flagged).
ACCEPTS_NOTICE = frozenset(
    {S.AWAITING_PAYMENT, S.PAYMENT_NOTIFIED, S.PAYMENT_SEEN, S.EXPIRED, S.UNDERPAID}
)

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
    S.EXPIRED: 'The quote expired before a payment was seen. If you paid, press "I paid": '
    "staff will look at it.",
    S.UNDERPAID: "Less than the quoted amount arrived. Send the difference to the same address "
    'and press "I paid" again, or contact us.',
    S.REJECTED: "The order was rejected. The note below says why.",
}


class TransitionRefused(Exception):
    """An order was asked to move where the table does not allow."""

    def __init__(self, current: str, target: str):
        self.current, self.target = current, target
        super().__init__(
            f"an order that is {Status(current).label.lower()} cannot become "
            f"{Status(target).label.lower()}"
        )


def check_transition(current: str, target: str) -> None:
    if target not in ALLOWED.get(current, frozenset()):
        raise TransitionRefused(current, target)
