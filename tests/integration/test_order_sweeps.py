"""The order sweeps run in a real worker process, from a message on the real broker."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.conf import settings
from django.utils import timezone

from portal import order_services as svc
from portal.celery import app as celery_app
from portal.models import Order
from portal.order_states import Status
from tests.worker import wait_until

pytestmark = pytest.mark.integration


def test_a_worker_expires_unpaid_quotes_and_completes_ended_rentals(start_worker, make_order):
    # given: an unpaid quote past its expiry, a notified one, a notice whose hold
    # window is over with no payment seen, and a rental that ended
    unpaid, notified, rental = make_order(), make_order(), make_order()
    svc.order_record_notice(order=notified)
    start = timezone.now() - timedelta(hours=3)
    lapsed = make_order(now=start)
    svc.order_record_notice(order=lapsed, now=start + timedelta(minutes=5))
    Order.objects.filter(pk__in=[unpaid.pk, notified.pk]).update(
        quote_expires_at=timezone.now() - timedelta(minutes=1)
    )
    svc.order_confirm_payment(order=rental, actor="staff:t", note="ok")
    svc.order_start_provisioning(order=rental, actor="staff:t")
    svc.order_mark_provisioned(
        order=rental, actor="staff:t", now=timezone.now() - timedelta(days=8)
    )

    # when: beat's messages reach a worker (sent here rather than waiting a minute)
    worker = start_worker()
    for entry in ("expire-unpaid-quotes", "rental-end-sweep"):
        celery_app.send_task(settings.CELERY_BEAT_SCHEDULE[entry]["task"])

    # then
    def settled() -> bool:
        statuses = dict(Order.objects.values_list("pk", "status"))
        return (
            statuses[unpaid.pk] == Status.EXPIRED
            and statuses[lapsed.pk] == Status.HOLD_LAPSED
            and statuses[rental.pk] == Status.COMPLETED
        )

    wait_until(settled, timeout=120, worker=worker)
    assert Order.objects.get(pk=notified.pk).status == Status.PAYMENT_NOTIFIED
    assert unpaid.events.last().actor == "system"
