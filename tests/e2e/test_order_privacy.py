"""The configurator's live price, as a browser sends it: plan fields only, the
real total or the reason there is none, and a working page without JavaScript."""

from __future__ import annotations

from urllib.parse import parse_qs, urlsplit

import pytest

from portal.models import GpuModel, Order

pytestmark = pytest.mark.e2e

PLAN_FIELDS = {"gpu", "quantity", "duration", "environment"}


def test_the_price_request_carries_no_contact_data(page, live_server, catalog, transactional_db):
    # given: a customer who filled in the contact fields first
    price_urls: list[str] = []
    page.on("request", lambda r: "/order/price/" in r.url and price_urls.append(r.url))
    page.goto(f"{live_server.url}/order/")
    page.fill("input[name=first_name]", "Grace")
    page.fill("input[name=last_name]", "Hopper")
    page.fill("input[name=email]", "grace@example.org")

    # when: the plan changes and the total follows
    page.select_option("select[name=gpu]", str(GpuModel.objects.get(name="L40S").pk))
    page.fill("input[name=quantity]", "2")
    page.locator("label.duration", has_text="30 days").click()
    page.wait_for_function(
        "() => (document.querySelector('#total')?.innerText || '').startsWith('1440.00')"
    )

    # then: every price request names the plan only
    assert price_urls
    for url in price_urls:
        query = urlsplit(url).query
        assert set(parse_qs(query)) <= PLAN_FIELDS, url
        for secret in ("grace", "Hopper", "example.org", "csrf"):
            assert secret.lower() not in query.lower(), url


def test_the_total_is_that_of_the_quantity_typed_or_says_how_many_are_free(
    page, live_server, catalog, transactional_db
):
    # given: four L40S left
    l40s = GpuModel.objects.get(name="L40S")
    l40s.stock = 4
    l40s.save(update_fields=["stock"])
    page.goto(f"{live_server.url}/order/")
    page.select_option("select[name=gpu]", str(l40s.pk))
    page.locator("label.duration", has_text="7 days").click()

    # when: 30 are typed
    page.fill("input[name=quantity]", "30")
    page.press("input[name=quantity]", "Tab")  # leaving the field is a change
    page.wait_for_selector("#price-refusal")

    # then: no total for another quantity, and the reason
    refusal = page.locator("#price-refusal").inner_text()
    assert "30 × L40S" in refusal
    assert "Only 4 L40S card(s) are free" in refusal
    assert page.locator("#total").count() == 0

    # and 3 of them price as 3
    page.fill("input[name=quantity]", "3")
    page.press("input[name=quantity]", "Tab")
    page.wait_for_function(
        "() => (document.querySelector('#total')?.innerText || '').startsWith('504.00')"
    )  # 24.00 × 3 × 7
    assert page.locator("#price-refusal").count() == 0


def test_without_javascript_update_price_shows_the_total_and_orders_nothing(
    browser, live_server, catalog, transactional_db
):
    context = browser.new_context(java_script_enabled=False)
    page = context.new_page()
    page.set_default_timeout(15_000)
    try:
        page.goto(f"{live_server.url}/order/")
        page.select_option("select[name=gpu]", str(GpuModel.objects.get(name="L40S").pk))
        page.fill("input[name=quantity]", "2")
        page.locator("label.duration", has_text="7 days").click()
        page.fill("input[name=first_name]", "Grace")
        page.click("#update-price")
        page.wait_for_load_state()

        assert page.locator("#total").inner_text().startswith("336.00")  # 24.00 × 2 × 7
        # the choices and what was typed stay, without errors for the empty fields
        assert page.input_value("input[name=quantity]") == "2"
        assert page.input_value("input[name=first_name]") == "Grace"
        assert page.locator("#form-errors").count() == 0
        assert Order.objects.count() == 0
    finally:
        context.close()


def test_a_lost_link_comes_back_by_e_mail(
    page, live_server, make_order, mailoutbox, sent_tasks, transactional_db
):
    order = make_order(email="ada@example.org")
    mailoutbox.clear()
    page.goto(f"{live_server.url}/order/")
    page.click("#recover-link")
    page.fill("input[name=email]", "ada@example.org")
    page.click("#recover-form button[type=submit]")
    assert "on its way" in page.locator("#recover-sent").inner_text()
    # sent by the portal worker, after the page answered
    assert mailoutbox == []
    sent_tasks.run()
    (mail,) = mailoutbox
    assert f"/order/t/{order.tracking_token}/" in mail.body
