"""Every transition of the order state table, allowed and refused, through the services."""

from __future__ import annotations

import pytest

from portal import order_services as svc
from portal.models import Order
from portal.order_states import ALLOWED, Status, TransitionRefused

STAFF = "staff:tester"

# The service that moves an order into each state.
MOVE = {
    Status.PAYMENT_SEEN: lambda o: svc.order_mark_payment_seen(order=o, actor=STAFF, note="seen"),
    Status.CONFIRMED: lambda o: svc.order_confirm_payment(order=o, actor=STAFF, note="ok"),
    Status.UNDERPAID: lambda o: svc.order_mark_underpaid(order=o, actor=STAFF, note="short"),
    Status.REJECTED: lambda o: svc.order_reject(order=o, actor=STAFF, note="no payment"),
    Status.EXPIRED: lambda o: svc.order_expire(order=o),
    Status.PROVISIONING: lambda o: svc.order_start_provisioning(order=o, actor=STAFF),
    Status.ACTIVE: lambda o: svc.order_mark_provisioned(order=o, actor=STAFF),
    Status.COMPLETED: lambda o: svc.order_complete(order=o),
}


def _in_state(order: Order, status: str) -> Order:
    Order.objects.filter(pk=order.pk).update(status=status)
    order.refresh_from_db()
    return order


CASES = [
    (source, target, target in ALLOWED[source])
    for source in Status.values
    for target in MOVE
    if source != Status.PAYMENT_NOTIFIED or target != Status.PAYMENT_NOTIFIED
]


@pytest.mark.parametrize(("source", "target", "allowed"), CASES)
def test_transition_follows_the_table(make_order, source, target, allowed):
    order = _in_state(make_order(), source)
    events_before = order.events.count()
    if allowed:
        MOVE[target](order)
        order.refresh_from_db()
        assert order.status == target
        last = order.events.last()
        assert (last.from_status, last.to_status) == (source, target)
    else:
        with pytest.raises(TransitionRefused, match="cannot become"):
            MOVE[target](order)
        order.refresh_from_db()
        assert order.status == source
        assert order.events.count() == events_before


def test_a_refusal_reads_as_a_sentence(make_order):
    order = _in_state(make_order(), Status.COMPLETED)
    with pytest.raises(TransitionRefused) as info:
        svc.order_confirm_payment(order=order, actor=STAFF, note="x")
    assert str(info.value) == "an order that is completed cannot become payment confirmed"


def test_each_transition_mails_the_customer_after_commit(
    make_order, mailoutbox, django_capture_on_commit_callbacks
):
    order = make_order()
    mailoutbox.clear()
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        svc.order_confirm_payment(order=order, actor=STAFF, note="seen on chain")
    assert len(callbacks) == 1
    assert len(mailoutbox) == 1
    mail = mailoutbox[0]
    assert mail.to == ["ada@example.org"]
    assert "payment confirmed" in mail.subject
    assert f"/order/t/{order.tracking_token}/" in mail.body
