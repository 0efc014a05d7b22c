"""The customer's e-mails: one per customer-visible change, sent after commit."""

from __future__ import annotations

import logging

from django.conf import settings
from django.core.mail import send_mail
from django.template.loader import render_to_string

from portal.order_page import missing_amount
from portal.order_states import Status, explanation

log = logging.getLogger(__name__)

SUBJECTS = {
    "created": "Your order {ref}: payment instructions",
    "notice": "Your order {ref}: we received your payment notice",
    "ending": "Your order {ref}: the rental ends soon, collect your results",
    "access_changed": "Your order {ref}: your access details changed",
    Status.PAYMENT_SEEN: "Your order {ref}: payment seen",
    Status.CONFIRMED: "Your order {ref}: payment confirmed",
    Status.PROVISIONING: "Your order {ref}: machines being prepared",
    Status.ACTIVE: "Your order {ref}: your rental is active",
    Status.COMPLETED: "Your order {ref}: rental completed",
    Status.EXPIRED: "Your order {ref}: quote expired",
    Status.UNDERPAID: "Your order {ref}: payment incomplete",
    Status.REJECTED: "Your order {ref}: order rejected",
    Status.HOLD_LAPSED: "Your order {ref}: payment not seen yet, cards released",
    Status.AWAITING_CAPACITY: "Your order {ref}: payment received, waiting for free cards",
    Status.REFUNDED: "Your order {ref}: payment refunded",
}


def failure_class(exc: BaseException) -> str:
    """What a failed send is logged as: the exception's class, never its text
    or traceback. smtplib's refusals carry the recipients' addresses
    (SMTPRecipientsRefused({'ada@example.org': (550, ...)})), and a server's
    answer may quote them; the order's reference says which mail it was."""
    return type(exc).__name__


def tracking_url(order) -> str:
    return f"{settings.SITE_URL.rstrip('/')}/order/t/{order.tracking_token}/"


def send_order_email(*, order_id: int, kind: str) -> bool:
    """Sent after the transaction committed; a mail failure never undoes an order change."""
    from portal.models import Order

    order = Order.objects.filter(pk=order_id).select_related("gpu", "currency").first()
    if order is None or kind not in SUBJECTS:
        return False  # payment_notified is answered by the "notice" mail
    # A move's e-mail carries the note of the event that made it (a rejection's
    # reason, say): the page's explanation promises it ("the note below"). An
    # access change is an event that keeps the status; its note names the
    # fields changed (portal/access.py), never their values.
    if kind == "access_changed":
        event = order.events.filter(to_status=order.status).last()
    else:
        event = order.events.filter(to_status=kind).last() if kind in Status.values else None
    context = {
        "note": event.note if event is not None else "",
        "order": order,
        "kind": kind,
        "status_label": order.get_status_display(),
        "explanation": explanation(order.status),
        "operator_name": settings.OPERATOR_NAME,
        "operator_email": settings.OPERATOR_EMAIL,
        "missing": missing_amount(order),
        "tracking_url": tracking_url(order),
    }
    try:
        send_mail(
            SUBJECTS[kind].format(ref=order.reference),
            render_to_string("orders/email/order.txt", context),
            None,
            [order.email],
        )
    except Exception as exc:  # noqa: BLE001 — a mail failure never undoes an order change
        log.warning("order %s: %s e-mail not sent (%s)", order.reference, kind, failure_class(exc))
        return False
    return True


# The most recent orders a recovery e-mail lists: enough for any customer, and
# a bounded e-mail whatever one address ordered.
RECOVERY_MAX_ORDERS = 20


def send_tracking_links(*, email: str) -> bool:
    """The tracking links of the orders placed with `email`, to that address only.

    Nothing is sent when no order uses it: the page the visitor sees is the
    same either way (portal/recovery_views.py).
    """
    from portal.models import Order

    orders = list(
        Order.objects.filter(email__iexact=email)
        .select_related("gpu")
        .order_by("-created_at")[:RECOVERY_MAX_ORDERS]
    )
    if not orders:
        return False
    links = [(order, tracking_url(order)) for order in orders]
    try:
        send_mail(
            "Your BriefGPU order links",
            render_to_string("orders/email/recover.txt", {"links": links}),
            None,
            [orders[0].email],
        )
    except Exception as exc:  # noqa: BLE001 — the page answers the same either way
        log.warning(
            "tracking links e-mail not sent (%d order(s), %s)", len(orders), failure_class(exc)
        )
        return False
    return True
