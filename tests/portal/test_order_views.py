"""The ordering pages as a customer and as staff use them."""

from __future__ import annotations

from decimal import Decimal

from django.test import Client

from portal.models import Environment, GpuModel, Order, RentalDuration
from portal.order_states import Status


def _post_data(**overrides) -> dict:
    from portal.models import CryptoCurrency

    data = {
        "gpu": GpuModel.objects.get(name="L40S").pk,
        "quantity": 2,
        "duration": RentalDuration.objects.get(days=7).pk,
        "environment": Environment.objects.first().pk,
        "first_name": "Grace",
        "last_name": "Hopper",
        "email": "grace@example.org",
        "currency": CryptoCurrency.objects.get(code="BTC").pk,
    }
    data.update(overrides)
    return data


def test_configurator_shows_every_card_and_duration_purpose(client, db):
    page = client.get("/order/").content.decode()
    for name in ("A40", "RTX A6000", "L40S", "RTX 6000 Ada", "A100 SXM", "RTX 4090", "L4"):
        assert name in page
    assert "a first controlled campaign" in page  # what 7 days are for


def test_price_partial_is_only_the_summary(client, db):
    data = _post_data()
    response = client.get("/order/price/", data, headers={"HX-Request": "true"})
    html = response.content.decode()
    assert html.strip().startswith('<section id="price"')
    assert "336.00 EUR" in html  # 24.00 × 2 × 7
    assert "<form" not in html


def test_tampered_price_and_total_change_nothing(client, fresh_rates, address_pool):
    response = client.post("/order/", _post_data(price_per_day="0.01", fiat_total="1", total="1"))
    assert response.status_code == 302
    order = Order.objects.get()
    assert order.fiat_total == Decimal("336.00")
    assert order.price_per_day == Decimal("24.00")


def test_tampered_choice_is_a_form_error(client, fresh_rates, address_pool):
    response = client.post("/order/", _post_data(gpu="999999", quantity="-3"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Select a valid choice" in html
    assert "greater than or equal to 1" in html
    assert not Order.objects.exists()


def test_out_of_stock_card_is_shown_and_refused_with_a_reason(client, fresh_rates, address_pool):
    GpuModel.objects.filter(name="L40S").update(stock=0)
    assert "L40S" in client.get("/order/").content.decode()
    response = client.post("/order/", _post_data())
    assert "L40S is out of stock" in response.content.decode()
    assert not Order.objects.exists()


def test_stale_rate_is_a_readable_refusal_on_the_form(client, db, address_pool):
    response = client.post("/order/", _post_data())  # no rate recorded at all
    assert "No current BTC rate" in response.content.decode()
    assert not Order.objects.exists()


def test_submit_leads_to_tracking_with_quote_and_qr(client, fresh_rates, address_pool):
    response = client.post("/order/", _post_data(), follow=True)
    order = Order.objects.get()
    assert response.redirect_chain[-1][0] == f"/order/t/{order.tracking_token}/"
    html = response.content.decode()
    assert order.payment_address.address in html
    assert "0.0056 BTC" in html  # 336 / 60000 = 0.0056
    assert "<svg" in html and "Payment QR code" in html
    assert "bitcoin:" in html


def test_unknown_token_is_a_plain_404(client, db):
    response = client.get("/order/t/not-a-real-token-at-all-0123456789/")
    assert response.status_code == 404


def test_a_token_shows_its_own_order_only(client, make_order):
    mine, theirs = make_order(), make_order(email="someone@example.org")
    html = client.get(f"/order/t/{mine.tracking_token}/").content.decode()
    assert mine.payment_address.address in html
    assert theirs.payment_address.address not in html
    assert "someone@example.org" not in html


def test_i_paid_twice_records_one_notice(client, make_order):
    order = make_order()
    url = f"/order/t/{order.tracking_token}/paid/"
    first = client.post(url, {"transaction_id": ""}, follow=True).content.decode()
    second = client.post(url, {"transaction_id": ""}, follow=True).content.decode()
    assert "Your notice was recorded" in first
    assert "already recorded" in second
    assert order.notices.count() == 1
    order.refresh_from_db()
    assert order.status == Status.PAYMENT_NOTIFIED


def test_a_bad_transaction_id_is_explained_and_not_recorded(client, make_order):
    order = make_order()
    page = client.post(
        f"/order/t/{order.tracking_token}/paid/",
        {"transaction_id": "<script>x</script>"},
        follow=True,
    ).content.decode()
    assert "not recorded" in page and "letters and digits" in page
    assert order.notices.count() == 0


def test_posts_need_the_csrf_token(make_order):
    order = make_order()
    strict = Client(enforce_csrf_checks=True)
    assert strict.post(f"/order/t/{order.tracking_token}/paid/").status_code == 403
    assert strict.post("/order/", {}).status_code == 403


def test_order_creation_is_rate_limited_per_client(client, fresh_rates, address_pool, settings):
    settings.ORDER_CREATE_RATE = "2/m"
    for _ in range(2):
        assert client.post("/order/", _post_data(quantity=1)).status_code == 302
    blocked = client.post("/order/", _post_data(quantity=1))
    assert blocked.status_code == 429
    assert "Too many requests" in blocked.content.decode()
    assert Order.objects.count() == 2


def test_staff_pages_are_not_for_customers(client, owner, make_order):
    order = make_order()
    client.force_login(owner)
    for url in ("/order/staff/", f"/order/staff/{order.pk}/"):
        response = client.get(url)
        assert response.status_code == 302 and "/login/" in response["Location"]
    response = client.post(
        f"/order/staff/{order.pk}/action/", {"action": "confirm", "note": "self-service"}
    )
    assert response.status_code == 302
    order.refresh_from_db()
    assert order.status == Status.AWAITING_PAYMENT


def test_queue_lists_notified_first_then_expired_with_notice(client, staff, make_order):
    from datetime import timedelta

    from portal import order_services as svc

    notified, late, quiet = make_order(), make_order(), make_order()
    svc.order_record_notice(order=notified)
    svc.order_record_notice(order=late, now=late.quote_expires_at + timedelta(minutes=1))
    svc.order_expire(order=quiet)
    client.force_login(staff)
    html = client.get("/order/staff/").content.decode()
    assert html.index(notified.reference) < html.index(late.reference)
    assert "paid late?" in html
    assert quiet.reference not in html  # expired without a notice: nothing to verify


def test_staff_confirm_needs_a_note_and_records_who(client, staff, make_order):
    order = make_order()
    client.force_login(staff)
    url = f"/order/staff/{order.pk}/action/"
    page = client.post(url, {"action": "confirm", "note": ""}, follow=True).content.decode()
    assert "Nothing changed" in page
    order.refresh_from_db()
    assert order.status == Status.AWAITING_PAYMENT
    client.post(url, {"action": "confirm", "note": "seen in block 800000"})
    order.refresh_from_db()
    assert order.status == Status.CONFIRMED
    event = order.events.last()
    assert (event.actor, event.note) == ("staff:staff", "seen in block 800000")


def test_staff_tampered_action_changes_nothing(client, staff, make_order):
    order = make_order()
    client.force_login(staff)
    page = client.post(
        f"/order/staff/{order.pk}/action/",
        {"action": "delete_everything", "note": "x"},
        follow=True,
    ).content.decode()
    assert "Nothing changed" in page
    order.refresh_from_db()
    assert order.status == Status.AWAITING_PAYMENT


def test_staff_illegal_transition_is_explained(client, staff, make_order):
    order = make_order()
    client.force_login(staff)
    page = client.post(
        f"/order/staff/{order.pk}/action/",
        {"action": "provisioned", "note": "too early"},
        follow=True,
    ).content.decode()
    assert "cannot become active" in page
