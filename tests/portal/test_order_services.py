"""Quotes, notices, expiry and the payment exceptions, as staff and customers see them."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from unittest import mock

import pytest
from django.utils import timezone

from portal import order_services as svc
from portal.models import ExchangeRate, GpuModel, Order, PaymentAddress, PaymentNotice
from portal.order_states import Status, TransitionRefused
from portal.pricing import QuoteRefused

STAFF = "staff:tester"


def test_second_paid_notice_records_nothing(make_order):
    order = make_order()
    first = svc.order_record_notice(order=order)
    second = svc.order_record_notice(order=order)
    assert first.created and not second.created
    assert PaymentNotice.objects.filter(order=order).count() == 1
    order.refresh_from_db()
    assert order.status == Status.PAYMENT_NOTIFIED
    assert order.events.filter(to_status=Status.PAYMENT_NOTIFIED).count() == 1


def test_a_notice_with_a_new_transaction_is_a_new_notice(make_order):
    order = make_order()
    svc.order_record_notice(order=order, transaction_id="abc123")
    again = svc.order_record_notice(order=order, transaction_id="abc123")
    other = svc.order_record_notice(order=order, transaction_id="def456")
    assert not again.created and other.created
    assert order.notices.count() == 2


def test_notice_after_expiry_is_kept_and_flags_paid_late(make_order):
    order = make_order()
    later = order.quote_expires_at + timedelta(minutes=5)
    result = svc.order_record_notice(order=order, transaction_id="tx1", now=later)
    order.refresh_from_db()
    assert result.created and result.notice.after_expiry
    assert order.status == Status.EXPIRED
    assert order.paid_late_claim
    assert "paid late?" in order.events.last().note


def test_unpaid_quotes_expire_but_notified_ones_wait_for_staff(make_order):
    unpaid, notified, fresh = make_order(), make_order(), make_order()
    svc.order_record_notice(order=notified)
    Order.objects.filter(pk__in=[unpaid.pk, notified.pk]).update(
        quote_expires_at=timezone.now() - timedelta(minutes=1)
    )
    expired = svc.orders_expire_unpaid()
    assert expired == [unpaid.pk]
    statuses = dict(Order.objects.values_list("pk", "status"))
    assert statuses[unpaid.pk] == Status.EXPIRED
    assert statuses[notified.pk] == Status.PAYMENT_NOTIFIED
    assert statuses[fresh.pk] == Status.AWAITING_PAYMENT


def test_paid_late_confirmed_keeps_its_exception(make_order):
    order = svc.order_expire(order=make_order())
    svc.order_confirm_payment(order=order, actor=STAFF, note="arrived 10 min late")
    order.refresh_from_db()
    assert (order.status, order.exception) == (Status.CONFIRMED, "paid_late")


def test_partial_payment_then_top_up(make_order):
    order = svc.order_mark_underpaid(order=make_order(), actor=STAFF, note="half arrived")
    assert (order.status, order.exception) == (Status.UNDERPAID, "paid_partial")
    svc.order_record_notice(order=order, transaction_id="topup")
    svc.order_confirm_payment(order=order, actor=STAFF, note="rest arrived")
    order.refresh_from_db()
    assert order.status == Status.CONFIRMED


def test_over_payment_is_confirmed_with_its_exception(make_order):
    order = svc.order_confirm_payment(
        order=make_order(), actor=STAFF, note="too much", overpaid=True
    )
    assert (order.status, order.exception) == (Status.CONFIRMED, "paid_over")


def test_stale_rate_refuses_new_quotes(make_order, settings):
    ExchangeRate.objects.update(recorded_at=timezone.now() - timedelta(hours=2))
    settings.EXCHANGE_RATE_MAX_AGE_MINUTES = 30
    with pytest.raises(QuoteRefused, match="No current BTC rate"):
        make_order()
    assert not Order.objects.exists()


def test_exhausted_address_pool_refuses_and_creates_nothing(make_order):
    for _ in range(5):
        make_order(currency="LTC")
    with pytest.raises(QuoteRefused, match="No LTC payment address is free"):
        make_order(currency="LTC")
    assert Order.objects.filter(currency__code="LTC").count() == 5
    assert not PaymentAddress.objects.filter(currency__code="LTC", order__isnull=True).exists()


def test_an_address_is_never_given_twice(make_order):
    orders = [make_order() for _ in range(5)]
    addresses = {o.payment_address.address for o in orders}
    assert len(addresses) == 5


def test_out_of_stock_is_refused_before_payment(make_order):
    a100 = GpuModel.objects.get(name="A100 SXM")  # 2 in stock
    make_order(gpu=a100.name, quantity=1)  # two customers, one card each
    make_order(gpu=a100.name, quantity=1)
    with pytest.raises(QuoteRefused, match="Only 0 A100 SXM"):
        make_order(gpu=a100.name, quantity=1)


def test_a_rejected_order_gives_its_cards_back(make_order):
    order = make_order(gpu="A100 SXM", quantity=1)
    make_order(gpu="A100 SXM", quantity=1)  # the other card
    svc.order_reject(order=order, actor=STAFF, note="never paid")
    assert make_order(gpu="A100 SXM", quantity=1).quantity == 1


def test_rental_runs_its_days_then_reminds_then_completes(
    make_order, mailoutbox, django_capture_on_commit_callbacks
):
    order = svc.order_confirm_payment(order=make_order(days=3), actor=STAFF, note="ok")
    svc.order_start_provisioning(order=order, actor=STAFF)
    start = timezone.now()
    order = svc.order_mark_provisioned(order=order, actor=STAFF, now=start)
    assert order.ends_at - order.starts_at == timedelta(days=3)
    mailoutbox.clear()  # only the sweeps' mails from here on

    with django_capture_on_commit_callbacks(execute=True):
        swept = svc.orders_rental_end_sweep(now=start + timedelta(days=2, hours=1))
    assert swept == {"reminded": [order.pk], "completed": []}
    [reminder] = mailoutbox
    assert reminder.to == ["ada@example.org"]
    assert reminder.subject == (
        f"Your order {order.reference}: the rental ends soon, collect your results"
    )
    assert f"ends on {order.ends_at:%Y-%m-%d %H:%M} UTC" in reminder.body
    assert "Collect your results" in reminder.body
    assert f"/order/t/{order.tracking_token}/" in reminder.body

    with django_capture_on_commit_callbacks(execute=True):
        again = svc.orders_rental_end_sweep(now=start + timedelta(days=2, hours=2))
    assert again["reminded"] == []
    assert len(mailoutbox) == 1  # one reminder, however often the sweep runs

    with django_capture_on_commit_callbacks(execute=True):
        done = svc.orders_rental_end_sweep(now=start + timedelta(days=3, minutes=1))
    assert done["completed"] == [order.pk]
    order.refresh_from_db()
    assert order.status == Status.COMPLETED
    assert mailoutbox[-1].subject == f"Your order {order.reference}: rental completed"


def test_quote_amount_is_rounded_up_to_the_currency_unit(make_order):
    order = make_order(currency="XMR", days=3)  # 14.00 × 3 = 42.00 EUR at 150 EUR/XMR
    assert order.crypto_amount == Decimal("0.28")
    assert order.payment_uri().endswith("?tx_amount=0.28")


# --- a late payment that is also an over- or underpayment ---------------------------


def test_a_late_overpayment_keeps_both_facts(make_order):
    # given: the quote expired, then more than the quote arrived
    order = svc.order_expire(order=make_order())
    # when
    svc.order_confirm_payment(order=order, actor=STAFF, note="too much, and late", overpaid=True)
    # then: paid over in the exception, paid late in its flag and on the timeline
    order.refresh_from_db()
    assert (order.status, order.exception, order.paid_late) == (
        Status.CONFIRMED,
        "paid_over",
        True,
    )
    assert order.events.last().note == "too much, and late; paid late (after the quote expired)"


def test_a_late_payment_seen_then_overpaid_stays_late(make_order):
    order = svc.order_expire(order=make_order())
    svc.order_mark_payment_seen(order=order, actor="btcpay", note="in the mempool")
    svc.order_confirm_payment(order=order, actor=STAFF, note="6 confirmations", overpaid=True)
    order.refresh_from_db()
    assert (order.exception, order.paid_late) == ("paid_over", True)
    notes = list(order.events.values_list("note", flat=True))
    assert "in the mempool; paid late (after the quote expired)" in notes


def test_a_late_partial_payment_stays_late_after_the_top_up(make_order):
    order = svc.order_expire(order=make_order())
    svc.order_mark_underpaid(order=order, actor=STAFF, note="half arrived")
    order.refresh_from_db()
    assert (order.exception, order.paid_late) == ("paid_partial", True)
    svc.order_confirm_payment(order=order, actor=STAFF, note="rest arrived")
    order.refresh_from_db()
    assert (order.exception, order.paid_late) == ("paid_late", True)


def test_an_on_time_overpayment_is_not_late(make_order):
    order = svc.order_confirm_payment(
        order=make_order(), actor=STAFF, note="too much", overpaid=True
    )
    assert (order.exception, order.paid_late) == ("paid_over", False)


def test_staff_see_a_late_overpayment_as_both(client, staff, make_order):
    order = svc.order_expire(order=make_order())
    svc.order_confirm_payment(order=order, actor=STAFF, note="late and too much", overpaid=True)
    client.force_login(staff)
    page = client.get(f"/order/staff/{order.pk}/").content.decode()
    assert 'id="paid-late"' in page
    assert "paid more than the quote; paid late (after the quote expired)" in page
    queue = client.get("/order/staff/").content.decode()
    assert "<strong>paid late</strong>" in queue and "(paid more than the quote)" in queue


# --- "I paid" goes through the one transition service ---------------------------------


def test_i_paid_moves_the_order_through_the_transition_table(make_order):
    order = make_order()
    with mock.patch.object(svc, "check_transition", wraps=svc.check_transition) as checked:
        svc.order_record_notice(order=order, transaction_id="tx1")
    checked.assert_called_once_with(Status.AWAITING_PAYMENT, Status.PAYMENT_NOTIFIED)
    [event] = order.events.filter(to_status=Status.PAYMENT_NOTIFIED)
    assert (event.from_status, event.actor) == (Status.AWAITING_PAYMENT, "customer")
    assert event.note == "customer says they paid (transaction tx1)"


def test_a_late_i_paid_expires_the_quote_through_the_transition_table_and_mails_both(
    make_order, mailoutbox, django_capture_on_commit_callbacks
):
    order = make_order()
    later = order.quote_expires_at + timedelta(minutes=5)
    mailoutbox.clear()

    with (
        mock.patch.object(svc, "check_transition", wraps=svc.check_transition) as checked,
        django_capture_on_commit_callbacks(execute=True),
    ):
        svc.order_record_notice(order=order, transaction_id="tx1", now=later)

    checked.assert_called_once_with(Status.AWAITING_PAYMENT, Status.EXPIRED)
    order.refresh_from_db()
    assert (order.status, order.paid_late_claim) == (Status.EXPIRED, True)
    assert [(e.from_status, e.to_status, e.actor) for e in order.events.all()][1:] == [
        (Status.AWAITING_PAYMENT, Status.EXPIRED, "system"),
        (Status.EXPIRED, Status.EXPIRED, "customer"),
    ]
    assert [m.subject for m in mailoutbox] == [
        f"Your order {order.reference}: quote expired",
        f"Your order {order.reference}: we received your payment notice",
    ]


@pytest.mark.parametrize("final", ["confirmed", "rejected", "completed"])
def test_i_paid_on_a_settled_order_is_refused_and_records_nothing(make_order, final):
    order = make_order()
    if final == "rejected":
        svc.order_reject(order=order, actor=STAFF, note="never paid")
    else:
        svc.order_confirm_payment(order=order, actor=STAFF, note="ok")
    if final == "completed":
        svc.order_start_provisioning(order=order, actor=STAFF)
        svc.order_mark_provisioned(order=order, actor=STAFF)
        svc.order_complete(order=order)
    events = order.events.count()

    with pytest.raises(TransitionRefused, match="cannot become payment notified"):
        svc.order_record_notice(order=order, transaction_id="tx1")

    order.refresh_from_db()
    assert order.status == final
    assert order.notices.count() == 0
    assert order.events.count() == events
