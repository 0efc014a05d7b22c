"""A customer orders, pays and follows the order; staff confirm it — in a real browser."""

from __future__ import annotations

import re

import pytest

from portal.models import CryptoCurrency, GpuModel, Order
from portal.order_states import Status
from tests.conftest import SSH_KEY

pytestmark = pytest.mark.e2e


def test_order_pay_notify_confirm_and_follow(
    page, new_page, live_server, staff, fresh_rates, address_pool, transactional_db
):
    # given: the configurator
    page.goto(f"{live_server.url}/order/")
    page.evaluate("window.__notReloaded = true")
    total = page.locator("#total")
    first_total = total.inner_text()

    # when the choices change, the total follows without a reload
    page.select_option("select[name=gpu]", str(GpuModel.objects.get(name="L40S").pk))
    page.fill("input[name=quantity]", "2")
    page.locator("label.duration", has_text="30 days").click()
    page.wait_for_function(
        "() => (document.querySelector('#total')?.innerText || '').startsWith('1440.00')"
    )  # 24.00 × 2 × 30
    assert total.inner_text() != first_total
    assert "several waves" in page.locator("#purpose").inner_text()
    assert page.evaluate("window.__notReloaded") is True

    page.fill("input[name=first_name]", "Grace")
    page.fill("input[name=last_name]", "Hopper")
    page.fill("input[name=email]", "grace@example.org")
    page.fill("textarea[name=ssh_keys]", SSH_KEY)
    page.select_option("select[name=currency]", str(CryptoCurrency.objects.get(code="BTC").pk))
    page.click("button[type=submit]")
    page.wait_for_url(re.compile(r".*/order/t/[\w-]{32,}/$"))

    # then: a locked quote, an address of its own, a QR code
    order = Order.objects.get()
    assert order.fiat_total == 1440
    assert page.locator("#amount").inner_text() == "0.024 BTC"  # 1440 / 60000
    assert page.locator("#address").inner_text() == order.payment_address.address
    assert page.locator("#qr svg").count() == 1
    assert page.locator("#payment-uri").get_attribute("href").startswith("bitcoin:")
    tracking_url = page.url

    # "I paid", twice: one notice
    page.click("#i-paid")
    assert "Your notice was recorded" in page.locator("main").inner_text()
    assert page.locator("[data-status]").inner_text() == "Payment notified"
    page.click("#i-paid")
    assert "already recorded" in page.locator("main").inner_text()
    assert order.notices.count() == 1

    # staff confirm in the queue, in their own browser session
    staff_page = new_page()
    staff_page.goto(f"{live_server.url}/order/staff/")
    staff_page.fill("input[name=username]", "staff")
    staff_page.fill("input[name=password]", "pw-for-tests")
    staff_page.click("[type=submit]")
    staff_page.wait_for_url("**/order/staff/")
    staff_page.click(f"text={order.reference}")
    staff_page.select_option("select[name=action]", "confirm")
    staff_page.fill("textarea[name=note]", "seen on chain, 3 confirmations")
    staff_page.click("#staff-action button[type=submit]")
    staff_page.wait_for_url("**/order/staff/")
    assert "is now payment confirmed" in staff_page.locator("main").inner_text()

    # the customer's page shows where the order stands, with every step
    page.goto(tracking_url)
    assert page.locator("[data-status]").inner_text() == "Payment confirmed"
    timeline = page.locator("ol.timeline").inner_text()
    assert "Awaiting payment" in timeline
    assert "Payment notified" in timeline
    assert "seen on chain, 3 confirmations" in timeline
    order.refresh_from_db()
    assert order.status == Status.CONFIRMED

    # and the dossier downloads
    with page.expect_download() as download:
        page.click("#dossier")
    assert download.value.suggested_filename == f"{order.reference}-dossier.zip"
