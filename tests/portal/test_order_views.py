"""The ordering pages as a customer and as staff use them."""

from __future__ import annotations

import itertools
from decimal import Decimal

from django.test import Client

from portal.models import Environment, GpuModel, Order, RentalDuration
from portal.order_states import Status
from tests.conftest import SSH_KEY


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
        "ssh_keys": SSH_KEY,
    }
    data.update(overrides)
    return data


def test_configurator_shows_every_card_and_duration_purpose(client, db):
    page = client.get("/order/").content.decode()
    for name in ("A40", "RTX A6000", "L40S", "RTX 6000 Ada", "A100 SXM", "RTX 4090", "L4"):
        assert name in page
    assert "a first controlled campaign" in page  # what 7 days are for


def test_the_duration_the_summary_prices_is_the_one_checked(client, db):
    durations = RentalDuration.objects.filter(active=True).order_by("days")
    shortest, longest = durations.first(), durations.last()
    page = client.get("/order/").content.decode()
    assert _checked_durations(page) == [str(shortest.pk)]
    assert f"during {shortest.days} days" in page
    # a link that names a duration checks that one instead
    linked = client.get("/order/", {"duration": longest.pk}).content.decode()
    assert _checked_durations(linked) == [str(longest.pk)]
    assert f"during {longest.days} days" in linked


def _checked_durations(html: str) -> list[str]:
    from django.test.html import parse_html

    def inputs(node):
        for child in getattr(node, "children", []):
            if not isinstance(child, str):
                if child.name == "input":
                    yield dict(child.attributes)
                yield from inputs(child)

    return [
        attrs["value"]
        for attrs in inputs(parse_html(html))
        if attrs.get("name") == "duration" and "checked" in attrs
    ]


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
    assert order.crypto_amount == Decimal("0.0056")  # 336.00 EUR at 60000 EUR/BTC
    assert order.payment_uri().endswith("?amount=0.0056")


def test_tampered_environment_is_a_form_error_shown_beside_it(client, fresh_rates, address_pool):
    response = client.post("/order/", _post_data(environment="99999"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="error-environment"' in html
    assert "Select a valid choice" in html
    assert 'id="form-errors"' in html and ">Software environment</a>: Select" in html
    assert not Order.objects.exists()


def test_every_field_error_is_listed_at_the_top(client, fresh_rates, address_pool):
    data = _post_data(environment="99999", email="not-an-address", currency="")
    html = client.post("/order/", data).content.decode()
    summary = html[html.index('id="form-errors"') : html.index("</div>", html.index("form-errors"))]
    for label in ("Software environment", "Email", "Pay with"):
        assert f">{label}</a>: " in summary, label
    assert not Order.objects.exists()


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


def test_notices_are_rate_limited_per_client(client, make_order, settings):
    settings.ORDER_NOTICE_RATE = "2/m"
    order = make_order()
    url = f"/order/t/{order.tracking_token}/paid/"
    for tx in ("tx1", "tx2"):
        assert client.post(url, {"transaction_id": tx}).status_code == 302
    blocked = client.post(url, {"transaction_id": "tx3"})
    assert blocked.status_code == 429
    assert "Too many requests" in blocked.content.decode()
    assert sorted(order.notices.values_list("transaction_id", flat=True)) == ["tx1", "tx2"]


_customers = itertools.count(1)


def _create_from(client, address: dict) -> int:
    # A new e-mail address each time: the rate limit is tested, not the cap on
    # open orders per e-mail address.
    email = f"grace.{next(_customers)}@example.org"
    return client.post("/order/", _post_data(quantity=1, email=email), **address).status_code


def test_behind_a_proxy_by_default_every_customer_shares_one_limit(
    client, fresh_rates, address_pool, settings
):
    # What the setting is for: the proxy is every request's REMOTE_ADDR.
    settings.ORDER_CREATE_RATE = "2/m"
    first, second = {"HTTP_X_REAL_IP": "203.0.113.7"}, {"HTTP_X_REAL_IP": "198.51.100.9"}
    assert [_create_from(client, first) for _ in range(2)] == [302, 302]
    assert _create_from(client, second) == 429


def test_with_x_real_ip_configured_two_clients_have_their_own_limits(
    client, fresh_rates, address_pool, settings
):
    settings.ORDER_CREATE_RATE = "2/m"
    settings.RATELIMIT_IP_META_KEY = "HTTP_X_REAL_IP"
    # Cards for every order: a sold-out refusal would not count toward the limit.
    GpuModel.objects.filter(name="L40S").update(stock=10)
    first, second = {"HTTP_X_REAL_IP": "203.0.113.7"}, {"HTTP_X_REAL_IP": "198.51.100.9"}
    assert [_create_from(client, first) for _ in range(2)] == [302, 302]
    assert _create_from(client, first) == 429
    assert [_create_from(client, second) for _ in range(2)] == [302, 302]
    assert _create_from(client, second) == 429
    assert Order.objects.count() == 4


def test_with_x_forwarded_for_the_proxy_s_entry_counts_not_the_client_s(
    client, fresh_rates, address_pool, settings
):
    settings.ORDER_CREATE_RATE = "2/m"
    settings.RATELIMIT_IP_META_KEY = "portal.client_ip.forwarded_for"
    settings.RATELIMIT_TRUSTED_PROXIES = 1

    def via_proxy(client_says: str, proxy_saw: str) -> dict:
        # nginx: proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
        return {"HTTP_X_FORWARDED_FOR": f"{client_says}, {proxy_saw}"}

    # A client that writes a new address into the header each time is still one client.
    assert _create_from(client, via_proxy("10.0.0.1", "203.0.113.7")) == 302
    assert _create_from(client, via_proxy("10.0.0.2", "203.0.113.7")) == 302
    assert _create_from(client, via_proxy("10.0.0.3", "203.0.113.7")) == 429
    # Another client behind the same proxy has its own count.
    assert _create_from(client, via_proxy("10.0.0.1", "198.51.100.9")) == 302

    # Two proxies of ours (a CDN, then nginx): the client is the second entry from the right.
    settings.RATELIMIT_TRUSTED_PROXIES = 2
    two_hops = {"HTTP_X_FORWARDED_FOR": "10.9.9.9, 192.0.2.44, 172.16.0.1"}
    assert _create_from(client, two_hops) == 302


def test_a_request_without_the_header_counts_by_its_peer(rf, settings):
    from portal.client_ip import forwarded_for

    settings.RATELIMIT_TRUSTED_PROXIES = 1
    assert forwarded_for(rf.get("/", REMOTE_ADDR="192.0.2.1")) == "192.0.2.1"
    garbage = rf.get("/", REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR="unknown")
    assert forwarded_for(garbage) == "192.0.2.1"
    settings.RATELIMIT_TRUSTED_PROXIES = 3
    short = rf.get("/", REMOTE_ADDR="192.0.2.1", HTTP_X_FORWARDED_FOR="198.51.100.3")
    assert forwarded_for(short) == "198.51.100.3"  # every entry there was one of ours


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
        {"action": "provisioning", "note": "too early"},
        follow=True,
    ).content.decode()
    assert "cannot become provisioning" in page


def test_i_paid_on_a_settled_order_is_explained_and_records_nothing(client, make_order):
    from portal import order_services as svc

    order = svc.order_confirm_payment(order=make_order(), actor="staff:t", note="ok")
    events = order.events.count()
    page = client.post(
        f"/order/t/{order.tracking_token}/paid/", {"transaction_id": "tx9"}, follow=True
    ).content.decode()
    assert "Your notice was not recorded: this order is payment confirmed" in page
    assert 'id="i-paid"' not in page  # and the button is gone
    assert order.notices.count() == 0
    assert order.events.count() == events


def _done_profile(campaign):
    from campaigns.models import Profile

    return Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.DONE,
        sample=[],
        device="CPU (2 threads)",
        runtime={"torch": "2.13.0+cpu"},
        memory_budget=1 << 30,
        steps=[],
        chosen_batch_size=8,
        chosen_peak_reserved=1 << 29,
    )


def test_an_order_made_from_a_profile_keeps_that_profile(
    client, owner, make_campaign, fresh_rates, address_pool
):
    campaign, other = make_campaign(), make_campaign("other")
    profile, foreign = _done_profile(campaign), _done_profile(other)
    client.force_login(owner)

    page = client.get("/order/", {"campaign": campaign.name, "profile": profile.pk})
    assert f'name="profile" value="{profile.pk}"' in page.content.decode()
    client.post("/order/", _post_data(campaign=campaign.name, profile=profile.pk, quantity=1))
    # Another campaign's profile (a tampered field) is not linked.
    client.post("/order/", _post_data(campaign=campaign.name, profile=foreign.pk, quantity=1))

    first, second = Order.objects.order_by("pk")
    assert (first.campaign, first.profile) == (campaign, profile)
    assert (second.campaign, second.profile) == (campaign, None)
