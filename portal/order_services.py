"""Every write to an order: creation with its locked quote, notices, and transitions.

Each transition locks the order row, checks the table in order_states, records
an OrderEvent and schedules the customer's e-mail after commit. Views, the
admin, the webhook and the beat tasks all come through here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from portal import btcpay_client, emails, payment_addresses
from portal.models import (
    CryptoCurrency,
    Environment,
    GpuModel,
    Order,
    OrderEvent,
    PaymentAddress,
    PaymentNotice,
)
from portal.order_caps import check_open_orders as _check_open_orders
from portal.order_states import (
    ACCEPTS_NOTICE,
    HOLDS_STOCK,
    PaymentException,
    Status,
    TransitionRefused,
    check_transition,
    holds_cards,
)
from portal.pricing import QuoteRefused, cards_available, crypto_amount, fresh_rate, plan_price

log = logging.getLogger(__name__)

CUSTOMER = "customer"
SYSTEM = "system"
BTCPAY = "btcpay"


def staff_actor(user) -> str:
    return f"staff:{user.get_username()}"


@dataclass(frozen=True)
class Plan:
    gpu: GpuModel
    quantity: int
    days: int
    environment: Environment
    currency: CryptoCurrency


def order_create(
    *,
    plan: Plan,
    first_name: str,
    last_name: str,
    email: str,
    campaign=None,
    profile=None,
    campaigns: Sequence = (),
    ssh_public_keys: Sequence[str] = (),
    export_folders: Sequence[str] = (),
    client_key: str = "",
    now: datetime | None = None,
) -> Order:
    """The order with its locked quote and an address of its own, or QuoteRefused.

    Without BTCPay the address is derived from the merchant's extended public
    key or taken from the pool (portal/payment_addresses.py) and the amount
    comes from the staff's rate; with BTCPay configured both come from a new BTCPay invoice
    (docs/btcpay.md), and a BTCPay failure refuses the quote, creating nothing.
    `client_key` (portal/client_ip.py) counts toward the caps on open unpaid
    orders and the cards they hold per client, as `email` does per e-mail
    address (portal/order_caps.py).
    `campaigns` is the rental's batch list (`campaign` is put in it), the keys
    and folders what its machines are set up with (portal/access.py).
    """
    now = now or timezone.now()
    if campaign is None and campaigns:
        # The dossier carries one campaign's files: the batch list's first.
        campaign = min(campaigns, key=lambda c: c.name)
    try:
        processor = btcpay_client.client_from_settings()
    except btcpay_client.BTCPayError as exc:
        log.error("BTCPay: %s", exc)
        raise QuoteRefused(_PROCESSOR_DOWN) from exc
    with transaction.atomic():
        # Every card's row is locked, in one order: quotes are serialised, so
        # two customers cannot both take a card's last units, and one visitor
        # cannot pass the open-order caps twice by quoting two cards at once.
        # Quotes are rare next to the time a lock is held (a few queries).
        cards = {card.pk: card for card in GpuModel.objects.select_for_update().order_by("pk")}
        gpu = cards[plan.gpu.pk]
        if not gpu.active:
            raise QuoteRefused(f"{gpu.name} is no longer offered.")
        _check_open_orders(
            email=email, client_key=client_key, gpu=gpu, quantity=plan.quantity, now=now
        )
        available = cards_available(gpu=gpu, now=now)
        if plan.quantity > available:
            raise QuoteRefused(
                f"Only {available} {gpu.name} card(s) are free at the moment; "
                f"you asked for {plan.quantity}."
            )
        price = plan_price(gpu=gpu, quantity=plan.quantity, days=plan.days)
        expires_at = now + timedelta(minutes=settings.ORDER_QUOTE_MINUTES)
        if processor is None:
            rate = fresh_rate(currency=plan.currency, now=now)
            quote = {
                "crypto_amount": crypto_amount(
                    fiat=price.total, rate=rate, decimals=plan.currency.decimals
                ),
                "rate": rate.fiat_per_unit,
                "rate_recorded_at": rate.recorded_at,
            }
        else:
            # BTCPay prices the invoice at its own rate; filled in below.
            quote = {"crypto_amount": Decimal(0), "rate": Decimal(0), "rate_recorded_at": now}
        order = Order.objects.create(
            gpu=gpu,
            quantity=plan.quantity,
            duration_days=plan.days,
            environment=plan.environment,
            price_per_day=price.price_per_day,
            fiat_total=price.total,
            fiat_currency=settings.FIAT_CURRENCY,
            currency=plan.currency,
            quote_expires_at=expires_at,
            held_until=expires_at,
            client_key=client_key,
            first_name=first_name,
            last_name=last_name,
            email=email,
            campaign=campaign,
            # Only a profile of the linked campaign: the dossier reads it.
            profile=profile
            if campaign is not None and profile is not None and profile.campaign_id == campaign.pk
            else None,
            ssh_public_keys=list(ssh_public_keys),
            export_folders=list(export_folders),
            **quote,
        )
        batch = {c.pk: c for c in (*campaigns, *([campaign] if campaign is not None else []))}
        if batch:
            order.campaigns.set(batch.values())
        if processor is None:
            payment_addresses.assign(order=order, now=now)
            _quote_locked(order=order, note="")
    if processor is not None:
        order = _quote_from_btcpay(order=order, client=processor, now=now)
    log.info("order quoted", extra={"order": order.reference})
    return order


_PROCESSOR_DOWN = (
    "Our payment processor is not answering right now, so no quote could be made. "
    "Nothing was ordered; please try again in a few minutes."
)


def _quote_from_btcpay(
    *, order: Order, client: btcpay_client.GreenfieldClient, now: datetime
) -> Order:
    """Fill the order's quote from a new BTCPay invoice, or delete the order.

    The invoice needs the order's reference, so the order exists first; the
    HTTP calls run outside any transaction (a slow BTCPay must not hold the
    card's row lock, or SQLite's write lock, for its timeout), and the order
    holds its cards meanwhile. It is deleted again if BTCPay fails: the
    customer never got its link. An invoice left behind expires in BTCPay and
    names no order (a deleted reference is never issued again).
    """
    try:
        invoice = client.invoice_create(
            amount=order.fiat_total,
            currency=order.fiat_currency,
            order_id=order.reference,
            crypto_code=order.currency.code,
            description=f"{order.cards}, {order.duration_days} days",
            expiration_minutes=settings.ORDER_QUOTE_MINUTES,
        )
    except btcpay_client.BTCPayError as exc:
        Order.objects.filter(pk=order.pk).delete()
        log.error("BTCPay invoice not created, quote refused: %s", exc)
        raise QuoteRefused(_PROCESSOR_DOWN) from exc
    currency = order.currency
    link = invoice.payment_link
    if not link.startswith(f"{currency.uri_scheme}:"):
        link = ""  # not a payment URI of this currency: we build our own
    try:
        with transaction.atomic():
            locked = Order.objects.select_for_update().get(pk=order.pk)
            locked.crypto_amount = invoice.amount_due
            locked.rate = invoice.rate if invoice.rate else (order.fiat_total / invoice.amount_due)
            locked.rate_recorded_at = now
            locked.quote_expires_at = invoice.expires_at or locked.quote_expires_at
            locked.held_until = locked.quote_expires_at
            locked.btcpay_invoice_id = invoice.invoice_id
            locked.payment_link = link[: Order._meta.get_field("payment_link").max_length]
            locked.save(
                update_fields=[
                    "crypto_amount",
                    "rate",
                    "rate_recorded_at",
                    "quote_expires_at",
                    "held_until",
                    "btcpay_invoice_id",
                    "payment_link",
                    "updated_at",
                ]
            )
            # A row of the address list, so "never given to two orders" is the
            # same unique constraint as for the pool's addresses.
            PaymentAddress.objects.create(
                currency=currency, address=invoice.destination, order=locked, assigned_at=now
            )
            _quote_locked(order=locked, note=f"; BTCPay invoice {invoice.invoice_id}")
    except IntegrityError as exc:
        Order.objects.filter(pk=order.pk).delete()
        log.error(
            "BTCPay invoice %s: its address or id is already another order's; quote refused",
            invoice.invoice_id,
        )
        raise QuoteRefused(
            "The payment processor gave an address already in use. Nothing was ordered; "
            "please submit again."
        ) from exc
    order.refresh_from_db()
    return order


def _quote_locked(*, order: Order, note: str) -> None:
    OrderEvent.objects.create(
        order=order,
        from_status="",
        to_status=order.status,
        actor=CUSTOMER,
        note=f"quote locked: {order.crypto_amount.normalize():f} {order.currency.code} "
        f"for {order.fiat_total} {order.fiat_currency}{note}",
    )
    transaction.on_commit(lambda: emails.send_order_email(order_id=order.pk, kind="created"))


# Where a payment that arrives on an expired quote can take the order: it is
# late whatever else it is (BTCPay's paidLate comes with paidOver or paidPartial).
PAYMENT_ARRIVED = frozenset({Status.PAYMENT_SEEN, Status.CONFIRMED, Status.UNDERPAID})
LATE_NOTE = "paid late (after the quote expired)"


def _admit(*, locked: Order, to: str, note: str, now: datetime) -> tuple[str, str]:
    """Where a move that takes cards leads, and its note.

    An order that holds its cards keeps them. One that does not (expired, hold
    lapsed, awaiting capacity) takes them again only if they are still free;
    a payment without them goes to AWAITING_CAPACITY, for staff to provision
    later or refund, and provisioning without them is refused: selling a card
    twice is never an outcome.
    """
    # A partial payment takes the cards too, for its window (_transition).
    if (to not in HOLDS_STOCK and to != Status.UNDERPAID) or holds_cards(locked, now):
        return to, note
    # The card's row lock, as in order_create: no quote takes the cards while
    # they are counted here.
    gpu = GpuModel.objects.select_for_update().get(pk=locked.gpu_id)
    free = cards_available(gpu=gpu, now=now)
    if locked.quantity <= free:
        return to, note
    short = f"only {free} {gpu.name} card(s) free, the order needs {locked.quantity}"
    if to not in PAYMENT_ARRIVED:
        raise TransitionRefused(locked.status, to, f"{short}; provision once enough are free")
    return Status.AWAITING_CAPACITY, f"{note}; {short}" if note else short


def _transition(
    *,
    order: Order,
    to: str,
    actor: str,
    note: str = "",
    exception: str | Callable[[Order], str] | None = None,
    fields: dict | None = None,
    now: datetime | None = None,
) -> Order:
    now = now or timezone.now()
    with transaction.atomic():
        locked = Order.objects.select_for_update().get(pk=order.pk)
        check_transition(locked.status, to)
        previous = locked.status
        admitted, note = _admit(locked=locked, to=to, note=note, now=now)
        if admitted == previous:
            # Still awaiting capacity: the payment news goes on the timeline.
            OrderEvent.objects.create(
                order=locked, from_status=previous, to_status=previous, actor=actor, note=note
            )
            order.refresh_from_db()
            return order
        if admitted != to:
            to = admitted
            check_transition(previous, to)
        update = ["status", "updated_at"]
        if exception is not None:
            # Decided on the locked row, before it moves: another request may
            # have changed it since the caller read it.
            locked.exception = exception(locked) if callable(exception) else exception
            update.append("exception")
        if previous == Status.EXPIRED and (to in PAYMENT_ARRIVED or to == Status.AWAITING_CAPACITY):
            locked.paid_late = True
            update.append("paid_late")
            note = f"{note}; {LATE_NOTE}" if note else LATE_NOTE
        locked.status = to
        if to == Status.UNDERPAID:
            # Time to send the difference, no longer: a token payment cannot
            # keep the cards off sale for good. A top-up after it is admitted
            # as any late payment (_admit).
            fields = {
                **(fields or {}),
                "held_until": now + timedelta(hours=settings.ORDER_UNDERPAID_HOLD_HOURS),
            }
        for name, value in (fields or {}).items():
            setattr(locked, name, value)
            update.append(name)
        locked.save(update_fields=update)
        OrderEvent.objects.create(
            order=locked, from_status=previous, to_status=to, actor=actor, note=note
        )
        transaction.on_commit(lambda: emails.send_order_email(order_id=locked.pk, kind=to))
    # The reference only: the customer's name and address stay out of the logs.
    log.info("order %s → %s", previous, to, extra={"order": order.reference})
    order.refresh_from_db()
    return order


# --- the customer -------------------------------------------------------------


@dataclass(frozen=True)
class NoticeResult:
    notice: PaymentNotice
    created: bool


def order_record_notice(
    *,
    order: Order,
    transaction_id: str = "",
    claimed_amount: Decimal | None = None,
    now: datetime | None = None,
) -> NoticeResult:
    """Record "I paid". The same notice twice is one notice; after expiry it is
    kept too, and the order is flagged for staff."""
    now = now or timezone.now()
    transaction_id = transaction_id.strip()
    with transaction.atomic():
        locked = Order.objects.select_for_update().get(pk=order.pk)
        if locked.status not in ACCEPTS_NOTICE:
            raise TransitionRefused(locked.status, Status.PAYMENT_NOTIFIED)
        existing = PaymentNotice.objects.filter(order=locked, transaction_id=transaction_id).first()
        if existing is not None:
            return NoticeResult(existing, created=False)
        late = now > locked.quote_expires_at
        try:
            with transaction.atomic():
                notice = PaymentNotice.objects.create(
                    order=locked,
                    transaction_id=transaction_id,
                    claimed_amount=claimed_amount,
                    after_expiry=late,
                )
        except IntegrityError:  # the same press, raced in from another request
            return NoticeResult(
                PaymentNotice.objects.get(order=locked, transaction_id=transaction_id), False
            )
        note = "customer says they paid" + (
            f" (transaction {transaction_id})" if transaction_id else ""
        )
        if late:
            note += "; after the quote expired: paid late?"
        if late and locked.status == Status.AWAITING_PAYMENT:
            # The expiry sweep had not come by yet: expire now, as the sweep
            # would (event, e-mail), so the notice lands in staff's "expired
            # with a notice" group at once. Same transaction, row still locked.
            locked = order_expire(order=locked)
        if late and not locked.paid_late_claim:
            locked.paid_late_claim = True
            locked.save(update_fields=["paid_late_claim", "updated_at"])
        if locked.status == Status.AWAITING_PAYMENT:
            # The cards stay held for a window after the notice, no longer:
            # a notice costs nothing, so it cannot keep them off sale for good.
            window = now + timedelta(minutes=settings.ORDER_NOTICE_HOLD_MINUTES)
            locked = _transition(
                order=locked,
                to=Status.PAYMENT_NOTIFIED,
                actor=CUSTOMER,
                note=note,
                fields={"held_until": max(window, locked.held_until or window)},
                now=now,
            )
        else:
            # Status unchanged (already notified, seen, underpaid or expired):
            # the notice still goes on the timeline for staff.
            OrderEvent.objects.create(
                order=locked,
                from_status=locked.status,
                to_status=locked.status,
                actor=CUSTOMER,
                note=note,
            )
        # Each press with a new transaction id is a notice; only the first few
        # are answered by e-mail, so "I paid" cannot mail the address on file
        # again and again.
        if locked.notices.count() <= settings.ORDER_NOTICE_EMAILS_MAX:
            transaction.on_commit(
                lambda: emails.send_order_email(order_id=locked.pk, kind="notice")
            )
    order.refresh_from_db()
    return NoticeResult(notice, created=True)


# --- payment outcomes (staff or BTCPay) -----------------------------------------


def _late_or(other: str | None) -> Callable[[Order], str | None]:
    def decide(locked: Order):
        if (
            locked.status == Status.EXPIRED
            or locked.paid_late
            or locked.exception == PaymentException.PAID_LATE
        ):
            return PaymentException.PAID_LATE
        return other if other is not None else locked.exception

    return decide


def order_mark_payment_seen(*, order: Order, actor: str, note: str = "") -> Order:
    exception = _late_or(None)
    return _transition(
        order=order, to=Status.PAYMENT_SEEN, actor=actor, note=note, exception=exception
    )


def order_confirm_payment(
    *,
    order: Order,
    actor: str,
    note: str,
    overpaid: bool = False,
    paid_amount: Decimal | None = None,
) -> Order:
    # Overpaid wins the `exception` field; lateness stays in `paid_late` (_transition).
    exception = PaymentException.PAID_OVER if overpaid else _late_or(PaymentException.NONE)
    fields = {"paid_amount": paid_amount} if paid_amount is not None else None
    return _transition(
        order=order,
        to=Status.CONFIRMED,
        actor=actor,
        note=note,
        exception=exception,
        fields=fields,
    )


def order_mark_underpaid(
    *, order: Order, actor: str, note: str, paid_amount: Decimal | None = None
) -> Order:
    """`paid_amount` is what arrived, in the order's currency: the customer's
    page says how much is missing. Without it the page says to ask."""
    if paid_amount is not None and not 0 <= paid_amount < order.crypto_amount:
        raise TransitionRefused(
            order.status,
            Status.UNDERPAID,
            f"{paid_amount.normalize():f} {order.currency.code} is not less than the quote "
            f"({order.crypto_amount.normalize():f} {order.currency.code}): confirm instead",
        )
    return _transition(
        order=order,
        to=Status.UNDERPAID,
        actor=actor,
        note=note,
        exception=PaymentException.PAID_PARTIAL,
        fields={"paid_amount": paid_amount},
    )


def order_reject(*, order: Order, actor: str, note: str) -> Order:
    return _transition(order=order, to=Status.REJECTED, actor=actor, note=note)


def order_refund(*, order: Order, actor: str, note: str) -> Order:
    return _transition(order=order, to=Status.REFUNDED, actor=actor, note=note)


def order_expire(*, order: Order, actor: str = SYSTEM, note: str = "") -> Order:
    return _transition(
        order=order, to=Status.EXPIRED, actor=actor, note=note or "quote expired unpaid"
    )


# --- the rental ------------------------------------------------------------------


def order_start_provisioning(*, order: Order, actor: str, note: str = "") -> Order:
    return _transition(order=order, to=Status.PROVISIONING, actor=actor, note=note)


def order_mark_provisioned(
    *, order: Order, actor: str, note: str = "", now: datetime | None = None
) -> Order:
    now = now or timezone.now()
    return _transition(
        order=order,
        to=Status.ACTIVE,
        actor=actor,
        note=note,
        fields={"starts_at": now, "ends_at": now + timedelta(days=order.duration_days)},
    )


def order_complete(*, order: Order, actor: str = SYSTEM, note: str = "") -> Order:
    return _transition(
        order=order, to=Status.COMPLETED, actor=actor, note=note or "rental period ended"
    )


# --- sweeps run by Celery beat ---------------------------------------------------


def orders_expire_unpaid(*, now: datetime | None = None) -> list[int]:
    """Unpaid quotes past their expiry become expired (notified orders wait for staff)."""
    now = now or timezone.now()
    expired = []
    due = Order.objects.filter(status=Status.AWAITING_PAYMENT, quote_expires_at__lt=now)
    for order in due.only("pk", "status").iterator():
        try:
            order_expire(order=order)
        except TransitionRefused:
            continue  # paid or notified meanwhile: the lock saw the newer state
        expired.append(order.pk)
    return expired


def orders_release_lapsed_holds(*, now: datetime | None = None) -> list[int]:
    """Notified orders with no payment seen within their window release their
    cards and wait for staff (HOLD_LAPSED); a payment seen later takes the
    cards again only if they are still free."""
    now = now or timezone.now()
    released = []
    due = Order.objects.filter(status=Status.PAYMENT_NOTIFIED, held_until__lte=now)
    note = (
        f"no payment seen within {settings.ORDER_NOTICE_HOLD_MINUTES} minutes of the notice: "
        "cards released, staff check the notice"
    )
    for order in due.only("pk", "status").iterator():
        try:
            _transition(order=order, to=Status.HOLD_LAPSED, actor=SYSTEM, note=note, now=now)
        except TransitionRefused:
            continue  # seen or decided meanwhile: the lock saw the newer state
        released.append(order.pk)
    return released


def orders_rental_end_sweep(*, now: datetime | None = None) -> dict[str, list[int]]:
    """Remind customers before the end, then complete rentals whose period is over."""
    now = now or timezone.now()
    reminded, completed = [], []
    soon = now + timedelta(hours=settings.ORDER_END_REMINDER_HOURS)
    for order in Order.objects.filter(
        status=Status.ACTIVE, ends_at__lte=soon, ends_at__gt=now, end_reminder_sent_at=None
    ):
        # Claim by update: one reminder even if two sweeps overlap.
        if Order.objects.filter(pk=order.pk, end_reminder_sent_at=None).update(
            end_reminder_sent_at=now
        ):
            transaction.on_commit(
                lambda pk=order.pk: emails.send_order_email(order_id=pk, kind="ending")
            )
            reminded.append(order.pk)
    for order in Order.objects.filter(status=Status.ACTIVE, ends_at__lte=now):
        try:
            order_complete(order=order)
        except TransitionRefused:
            continue
        completed.append(order.pk)
    return {"reminded": reminded, "completed": completed}
