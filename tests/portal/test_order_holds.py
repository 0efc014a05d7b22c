"""Holds that cannot be abused, and payments that arrive when the cards are gone.

A quote holds its cards while it is live, a notice ("I paid") for a window
after it, a payment for good; a visitor has a capped number of unpaid orders.
A payment for cards sold meanwhile waits for capacity or a refund, never
oversells. Times are moved by creating orders "in the past" (the services take
`now`), so the sweep runs at the real present as beat runs it.
"""

from __future__ import annotations

import contextlib
import re
import threading
from datetime import timedelta

import pytest
from django.db import connection, connections
from django.db.models import Q, Sum
from django.utils import timezone

from portal import order_services as svc
from portal.models import CryptoCurrency, Environment, GpuModel, Order
from portal.order_states import Status
from portal.pricing import QuoteRefused
from portal.tasks import expire_unpaid_quotes
from tests.portal.test_order_views import _post_data

STAFF = "staff:tester"
A100 = "A100 SXM"  # stock 2 in the seeded catalog


def free_shown(client, gpu: str) -> int:
    """The free count the configurator shows a visitor for `gpu`."""
    page = client.get("/order/").content.decode()
    label = re.search(rf">{re.escape(gpu)} \([^<]*<", page).group(0)
    if "out of stock" in label:
        return 0
    match = re.search(r"(\d+) free", label)
    return int(match.group(1)) if match else GpuModel.objects.get(name=gpu).stock


def cards_held(gpu: str) -> int:
    """Cards promised to customers: paid orders', partly paid ones' within their
    window, and live quotes' (by the quote's own expiry, whatever the portal's
    hold rules say)."""
    paid = Q(status__in=["payment_seen", "confirmed", "provisioning", "active"]) | Q(
        status="underpaid", held_until__gt=timezone.now()
    )
    live = Q(
        status__in=["awaiting_payment", "payment_notified"], quote_expires_at__gt=timezone.now()
    )
    held = Order.objects.filter(paid | live, gpu__name=gpu)
    return held.aggregate(n=Sum("quantity"))["n"] or 0


@pytest.fixture(autouse=True)
def _whole_stock_quotes(settings):
    """The holds below are of a model's whole stock (A100: 2) by one order, as
    reported; the cap on one visitor's share of a model has its own tests, which
    set it back (test_one_visitor_...)."""
    settings.ORDER_MAX_HELD_SHARE = 1


# --- holds end -----------------------------------------------------------------------


def test_a_quote_past_its_expiry_holds_no_card_even_before_the_sweep(client, make_order):
    past = timezone.now() - timedelta(hours=2)
    order = make_order(gpu=A100, quantity=2, now=past)
    assert order.status == Status.AWAITING_PAYMENT  # the sweep has not come by
    assert free_shown(client, A100) == 2
    # And a new customer gets them.
    assert make_order(gpu=A100, quantity=2).status == Status.AWAITING_PAYMENT


def test_a_live_quote_holds_its_cards(client, make_order):
    make_order(gpu=A100, quantity=2)
    assert free_shown(client, A100) == 0


def test_i_paid_without_paying_holds_the_cards_for_the_window_then_the_sweep_releases_them(
    client, staff, make_order, settings
):
    settings.ORDER_NOTICE_HOLD_MINUTES = 120
    start = timezone.now() - timedelta(hours=3)
    order = make_order(gpu=A100, quantity=2, now=start)
    svc.order_record_notice(
        order=order, transaction_id="not-paid", now=start + timedelta(minutes=5)
    )
    order.refresh_from_db()
    assert order.status == Status.PAYMENT_NOTIFIED

    # Beat's sweep, at the present: the window (notice + 2 h) is over.
    done = expire_unpaid_quotes()
    order.refresh_from_db()
    assert done["released"] == [order.pk]
    assert order.status == Status.HOLD_LAPSED
    assert free_shown(client, A100) == 2
    assert "cards released" in order.events.last().note
    # It is staff's now, in a group of its own.
    client.force_login(staff)
    queue = client.get("/order/staff/").content.decode()
    group = queue.index("<h2>Notice not verified in time (cards released)</h2>")
    assert group < queue.index(f'data-order="{order.reference}"') < queue.index("<h2>", group + 1)
    # The customer reads what happened on the order's page.
    page = client.get(f"/order/t/{order.tracking_token}/").content.decode()
    assert "your cards went back on sale" in page


def test_within_the_window_a_notice_keeps_the_cards_held(client, make_order, settings):
    settings.ORDER_NOTICE_HOLD_MINUTES = 120
    start = timezone.now() - timedelta(minutes=70)  # the quote (60 min) is over
    order = make_order(gpu=A100, quantity=2, now=start)
    svc.order_record_notice(order=order, now=start + timedelta(minutes=50))
    assert expire_unpaid_quotes() == {"expired": [], "released": []}
    order.refresh_from_db()
    assert order.status == Status.PAYMENT_NOTIFIED
    assert free_shown(client, A100) == 0


def test_a_second_notice_after_the_window_does_not_hold_the_cards_again(client, make_order):
    start = timezone.now() - timedelta(hours=3)
    order = make_order(gpu=A100, quantity=2, now=start)
    svc.order_record_notice(order=order, transaction_id="tx1", now=start + timedelta(minutes=5))
    expire_unpaid_quotes()
    result = svc.order_record_notice(order=order, transaction_id="tx2")
    order.refresh_from_db()
    assert result.created  # kept for staff
    assert order.status == Status.HOLD_LAPSED
    assert free_shown(client, A100) == 2


def test_a_payment_seen_after_the_window_takes_the_cards_again_while_they_are_free(make_order):
    start = timezone.now() - timedelta(hours=3)
    order = make_order(gpu=A100, quantity=2, now=start)
    svc.order_record_notice(order=order, now=start + timedelta(minutes=5))
    expire_unpaid_quotes()
    svc.order_mark_payment_seen(order=order, actor=STAFF, note="in the mempool")
    order.refresh_from_db()
    assert order.status == Status.PAYMENT_SEEN
    assert cards_held(A100) == 2


def test_a_payment_seen_after_the_window_when_the_cards_are_gone_awaits_capacity(make_order):
    start = timezone.now() - timedelta(hours=3)
    order = make_order(gpu=A100, quantity=2, now=start)
    svc.order_record_notice(order=order, now=start + timedelta(minutes=5))
    expire_unpaid_quotes()
    make_order(gpu=A100, quantity=2)  # someone else's quote takes the free cards
    svc.order_mark_payment_seen(order=order, actor=STAFF, note="in the mempool")
    order.refresh_from_db()
    assert order.status == Status.AWAITING_CAPACITY
    assert cards_held(A100) == 2
    assert "only 0 A100 SXM card(s) free" in order.events.last().note


# --- caps on open unpaid orders ----------------------------------------------------------


def _order(client, *, email: str, gpu: str = "L40S", address: str = "203.0.113.7"):
    data = _post_data(quantity=1, email=email, gpu=GpuModel.objects.get(name=gpu).pk)
    return client.post("/order/", data, REMOTE_ADDR=address)


def test_one_e_mail_address_has_a_capped_number_of_unpaid_orders(
    client, fresh_rates, address_pool, settings
):
    settings.ORDER_OPEN_PER_EMAIL = 2
    assert _order(client, email="grace@example.org", address="192.0.2.1").status_code == 302
    assert _order(client, email="grace@example.org", address="192.0.2.2").status_code == 302
    refused = _order(client, email="Grace@Example.org", address="192.0.2.3")
    assert refused.status_code == 200
    page = refused.content.decode()
    assert "This e-mail address already has 2 unpaid order(s)" in page
    assert "wait until its quote expires" in page
    assert Order.objects.count() == 2
    # Paying one frees a place.
    svc.order_confirm_payment(order=Order.objects.first(), actor=STAFF, note="paid")
    assert _order(client, email="grace@example.org", address="192.0.2.4").status_code == 302


def test_one_client_address_has_a_capped_number_of_unpaid_orders(
    client, fresh_rates, address_pool, settings
):
    # As reported: six unpaid orders from one address, within the hourly rate
    # limit, held every free card. Now the fourth is refused.
    settings.ORDER_OPEN_PER_CLIENT = 3
    for n, gpu in enumerate(("L40S", "A40", "L4")):
        assert _order(client, email=f"v{n}@example.org", gpu=gpu).status_code == 302
    refused = _order(client, email="v9@example.org", gpu="RTX 4090")
    assert "Your connection already has 3 unpaid order(s)" in refused.content.decode()
    assert Order.objects.count() == 3
    # Another visitor is not affected.
    assert _order(client, email="w@example.org", address="198.51.100.9").status_code == 302
    # The order row keeps a keyed hash, never the address itself.
    assert "203.0.113.7" not in Order.objects.first().client_key


def test_an_expired_order_no_longer_counts_toward_the_cap(make_order, settings):
    settings.ORDER_OPEN_PER_EMAIL = 1
    make_order(email="grace@example.org", now=timezone.now() - timedelta(hours=2))
    assert make_order(email="grace@example.org").status == Status.AWAITING_PAYMENT


# --- late payments never oversell -----------------------------------------------------------


@pytest.fixture
def late_a100(make_order):
    """An A100 order whose quote expired unpaid, and the two free cards quoted to
    someone else since: the reported oversell (stock 2, open orders held 4)."""
    late = svc.order_expire(order=make_order(gpu=A100, quantity=2))
    other = make_order(gpu=A100, quantity=2)
    return late, other


def test_staff_confirming_a_late_payment_for_cards_now_taken_awaits_capacity(
    client, staff, late_a100
):
    late, _ = late_a100
    client.force_login(staff)
    client.post(f"/order/staff/{late.pk}/action/", {"action": "confirm", "note": "arrived"})
    late.refresh_from_db()
    assert late.status == Status.AWAITING_CAPACITY
    assert late.paid_late
    assert cards_held(A100) == 2  # never more than the stock
    queue = client.get("/order/staff/").content.decode()
    group = queue.index("<h2>Paid, awaiting capacity or refund</h2>")
    assert group < queue.index(f'data-order="{late.reference}"') < queue.index("<h2>", group + 1)


def test_the_staff_page_offers_provisioning_once_capacity_frees(client, staff, late_a100):
    late, other = late_a100
    svc.order_confirm_payment(order=late, actor=STAFF, note="arrived")
    client.force_login(staff)
    page = client.get(f"/order/staff/{late.pk}/").content.decode()
    assert "only 0 A100 SXM free, this order needs 2" in page
    assert 'value="refund"' in page
    assert 'value="provisioning"' not in page
    # Provisioning anyway is refused with the reason.
    refused = client.post(
        f"/order/staff/{late.pk}/action/",
        {"action": "provisioning", "note": "try"},
        follow=True,
    ).content.decode()
    assert "only 0 A100 SXM card(s) free" in refused
    late.refresh_from_db()
    assert late.status == Status.AWAITING_CAPACITY

    svc.order_reject(order=other, actor=STAFF, note="never paid")
    page = client.get(f"/order/staff/{late.pk}/").content.decode()
    assert 'value="provisioning"' in page
    client.post(f"/order/staff/{late.pk}/action/", {"action": "provisioning", "note": "freed"})
    late.refresh_from_db()
    assert late.status == Status.PROVISIONING
    assert cards_held(A100) == 2


def test_staff_can_mark_an_order_awaiting_capacity_refunded(
    client, staff, late_a100, django_capture_on_commit_callbacks, mailoutbox
):
    late, _ = late_a100
    svc.order_confirm_payment(order=late, actor=STAFF, note="arrived")
    client.force_login(staff)
    with django_capture_on_commit_callbacks(execute=True):
        client.post(
            f"/order/staff/{late.pk}/action/",
            {"action": "refund", "note": "refunded to the sending address"},
        )
    late.refresh_from_db()
    assert late.status == Status.REFUNDED
    assert mailoutbox[-1].subject == f"Your order {late.reference}: payment refunded"
    page = client.get(f"/order/t/{late.tracking_token}/").content.decode()
    assert "Your payment was refunded" in page


def test_a_late_payment_for_cards_still_free_is_confirmed(make_order):
    late = svc.order_expire(order=make_order(gpu=A100, quantity=2))
    svc.order_confirm_payment(order=late, actor=STAFF, note="arrived")
    late.refresh_from_db()
    assert (late.status, late.exception) == (Status.CONFIRMED, "paid_late")


def test_a_confirmation_while_awaiting_capacity_waits_until_the_cards_are_free(late_a100):
    late, other = late_a100
    svc.order_mark_payment_seen(order=late, actor=STAFF, note="in the mempool")
    late.refresh_from_db()
    assert late.status == Status.AWAITING_CAPACITY
    svc.order_confirm_payment(order=late, actor=STAFF, note="6 confirmations")
    late.refresh_from_db()
    assert late.status == Status.AWAITING_CAPACITY  # still no card: the news is on the timeline
    assert late.events.last().note.startswith("6 confirmations; only 0")
    svc.order_reject(order=other, actor=STAFF, note="never paid")
    svc.order_confirm_payment(order=late, actor=STAFF, note="cards free")
    late.refresh_from_db()
    assert late.status == Status.CONFIRMED


# --- a partial payment holds the cards for a window, no longer -------------------------------


def test_an_underpaid_order_holds_its_cards_for_the_window_then_releases_them(
    client, make_order, settings
):
    settings.ORDER_UNDERPAID_HOLD_HOURS = 48
    order = make_order(gpu=A100, quantity=2)
    svc.order_mark_underpaid(order=order, actor=STAFF, note="half arrived")
    order.refresh_from_db()
    assert order.status == Status.UNDERPAID
    assert free_shown(client, A100) == 0  # reserved while the difference is on its way
    page = client.get(f"/order/t/{order.tracking_token}/").content.decode()
    assert "Your cards stay reserved for a limited time" in page
    assert order.held_until - timezone.now() > timedelta(hours=47)

    # Two days on (the hold moved back rather than the clock forward), the
    # cards are for sale again: someone else can quote them.
    Order.objects.filter(pk=order.pk).update(held_until=timezone.now() - timedelta(minutes=1))
    assert free_shown(client, A100) == 2
    assert make_order(gpu=A100, quantity=2).status == Status.AWAITING_PAYMENT

    # The difference arrives now: the cards are gone, so the order waits for
    # capacity or a refund instead of selling them twice.
    svc.order_confirm_payment(order=order, actor=STAFF, note="the rest arrived")
    order.refresh_from_db()
    assert order.status == Status.AWAITING_CAPACITY
    assert cards_held(A100) == 2


def test_a_partial_payment_on_an_expired_quote_takes_the_cards_only_if_free(make_order):
    order = svc.order_expire(order=make_order(gpu=A100, quantity=2))
    svc.order_mark_underpaid(order=order, actor=STAFF, note="half arrived, late")
    order.refresh_from_db()
    assert order.status == Status.UNDERPAID
    assert cards_held(A100) == 2


# --- the caps hold under concurrent quotes for different cards -------------------------------


@pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's row locks between two connections"
)
@pytest.mark.django_db(transaction=True)
def test_two_quotes_at_once_for_two_cards_cannot_pass_the_cap_twice(
    catalog, fresh_rates, address_pool, settings, monkeypatch
):
    """Both requests count the visitor's open orders before either has made
    one: without a lock common to both cards both would pass a cap of 1. Each
    request waits (briefly) for the other after its count, so the race is not
    left to chance; with the lock the second counts after the first commits."""
    settings.ORDER_OPEN_PER_EMAIL = 1
    after_count = threading.Barrier(2)
    counted = svc._check_open_orders

    def count_then_wait(**kwargs):
        counted(**kwargs)
        # Broken when the other request waits for the lock: go on alone.
        with contextlib.suppress(threading.BrokenBarrierError):
            after_count.wait(timeout=3)

    monkeypatch.setattr(svc, "_check_open_orders", count_then_wait)
    outcomes: list[str] = []

    def quote(card: str) -> None:
        try:
            plan = svc.Plan(
                gpu=GpuModel.objects.get(name=card),
                quantity=1,
                days=7,
                environment=Environment.objects.first(),
                currency=CryptoCurrency.objects.get(code="BTC"),
            )
            svc.order_create(plan=plan, first_name="Eve", last_name="X", email="eve@example.org")
            outcomes.append("quoted")
        except QuoteRefused as exc:
            outcomes.append(str(exc))
        finally:
            connections.close_all()

    threads = [threading.Thread(target=quote, args=(card,)) for card in ("L4", "A40")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(outcomes)[-1] == "quoted"
    assert "already has 1 unpaid order(s)" in sorted(outcomes)[0]
    assert Order.objects.filter(email="eve@example.org").count() == 1


def test_ipv6_addresses_of_one_64_share_the_cap_on_unpaid_orders(
    client, fresh_rates, address_pool, settings
):
    # An IPv6 line or cloud machine holds a whole /64: rotating the low 64 bits
    # is not a new visitor.
    settings.ORDER_OPEN_PER_CLIENT = 3
    one_64 = ["2001:db8:1:2::1", "2001:db8:1:2::2", "2001:db8:1:2:abcd::9", "2001:db8:1:2:ffff::"]
    for n, (gpu, address) in enumerate(zip(("L40S", "A40", "L4"), one_64, strict=False)):
        assert (
            _order(client, email=f"v{n}@example.org", gpu=gpu, address=address).status_code == 302
        )
    refused = _order(client, email="v9@example.org", gpu="RTX 4090", address=one_64[3])
    assert "Your connection already has 3 unpaid order(s)" in refused.content.decode()
    assert Order.objects.count() == 3
    # the next /64 is another visitor
    other = _order(client, email="w@example.org", gpu="RTX 4090", address="2001:db8:1:3::1")
    assert other.status_code == 302


# --- one visitor's share of a model's stock ---------------------------------------------


def test_one_visitor_cannot_quote_a_whole_model_s_stock(
    client, fresh_rates, address_pool, settings
):
    # As reported: one order for every A100 held them all for hours, unpaid.
    settings.ORDER_MAX_HELD_SHARE = 0.5
    data = _post_data(quantity=2, gpu=GpuModel.objects.get(name=A100).pk)
    refused = client.post("/order/", data, REMOTE_ADDR="203.0.113.7")
    assert refused.status_code == 200
    page = refused.content.decode()
    assert "You can order 1 more A100 SXM card(s) right now." in page
    assert "one customer&#x27;s orders hold at most 1 of our 2 A100 SXM cards" in page
    assert Order.objects.count() == 0
    assert free_shown(client, A100) == 2
    # what the message says can be ordered, can
    data["quantity"] = 1
    assert client.post("/order/", data, REMOTE_ADDR="203.0.113.7").status_code == 302
    assert free_shown(client, A100) == 1


def test_a_visitor_s_unpaid_cards_count_toward_the_share_by_e_mail_and_by_client(
    client, fresh_rates, address_pool, settings
):
    settings.ORDER_MAX_HELD_SHARE = 0.5  # L40S: 4 in stock, 2 per visitor
    settings.ORDER_OPEN_PER_EMAIL = 5  # the count of orders is not what this is about
    assert _order(client, email="eve@example.org", address="203.0.113.7").status_code == 302
    assert _order(client, email="eve@example.org", address="198.51.100.1").status_code == 302
    # the same e-mail from a third address
    page = _order(client, email="Eve@Example.org", address="192.0.2.9").content.decode()
    assert "You can order 0 more L40S card(s) right now." in page
    assert "your unpaid orders hold 2 already" in page
    assert "Pay your open order first" in page
    # another e-mail from an address that holds 1 card may take 1 more, not 2
    data = _post_data(quantity=2, email="mallory@example.org")
    page = client.post("/order/", data, REMOTE_ADDR="203.0.113.7").content.decode()
    assert "You can order 1 more L40S card(s) right now." in page
    assert Order.objects.count() == 2
    # once paid, the cards no longer count: the visitor may order the rest
    for order in Order.objects.all():
        svc.order_confirm_payment(order=order, actor=STAFF, note="paid")
    assert client.post("/order/", data, REMOTE_ADDR="203.0.113.7").status_code == 302
    assert free_shown(client, "L40S") == 0
