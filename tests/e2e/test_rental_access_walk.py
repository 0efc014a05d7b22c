"""The whole way to a usable rental, in a real browser: order with an SSH key
and a batch list, quote, "I paid", staff confirm, provision with host, port and
user, and the customer copies the SSH command from the tracking page.

With DOCS_SCREENSHOTS=1 it also saves the configurator, the quote, the active
rental and the staff's provisioning page in docs/img/ (docs/ordering.md shows them).
"""

from __future__ import annotations

import re

import pytest

from portal.models import CryptoCurrency, GpuModel, Order
from portal.order_states import Status
from tests.campaigns.test_profile_views import build_done_profile
from tests.conftest import SSH_KEY
from tests.e2e.test_screenshots import shoot
from tests.portal.test_ssh_keys import RSA_1024

pytestmark = pytest.mark.e2e

SSH_COMMAND = "ssh -p 2222 ada@gpu-7.example.net"


def _shot(page, name: str) -> None:
    shoot(page, name)  # the screenshots test's writer: one variable, one folder, one size cap


def _staff_submits(page, form: str) -> None:
    page.click(f"{form} button[type=submit]")
    page.wait_for_url("**/order/staff/")


def test_order_pay_confirm_provision_and_copy_the_ssh_command(
    page,
    new_page,
    live_server,
    staff,
    owner,
    make_campaign,
    fresh_rates,
    address_pool,
    transactional_db,
):
    # given: a signed-in customer with a profiled campaign, at the configurator
    campaign = make_campaign("texts")
    profile = build_done_profile(campaign)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live_server.url)
    page.goto(f"{live_server.url}/accounts/login/?next=/order/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/order/")
    page.select_option("select[name=gpu]", str(GpuModel.objects.get(name="L40S").pk))
    page.locator("label.duration", has_text="7 days").click()
    page.fill("input[name=first_name]", "Ada")
    page.fill("input[name=last_name]", "Lovelace")
    page.fill("input[name=email]", "ada@example.org")
    page.fill("textarea[name=ssh_keys]", SSH_KEY)
    page.fill("textarea[name=export_folders]", "results/run1")
    page.get_by_label("texts").check()  # the batch list
    page.select_option("select[name=currency]", str(CryptoCurrency.objects.get(code="BTC").pk))
    _shot(page, "order-configurator")
    page.fill("textarea[name=ssh_keys]", RSA_1024)
    page.click("#order-form button[type=submit]")

    # the key is refused beside its field, and nothing is ordered
    assert "Line 1 is an RSA key of 1024 bits" in page.locator("#error-ssh_keys").inner_text()
    assert Order.objects.count() == 0
    page.fill("textarea[name=ssh_keys]", SSH_KEY)
    page.click("#order-form button[type=submit]")
    page.wait_for_url(re.compile(r".*/order/t/[\w-]{32,}/$"))
    tracking_url = page.url
    order = Order.objects.get()
    assert order.ssh_public_keys == [SSH_KEY]
    assert order.batch_list() == ["texts"]

    # the quote, then "I paid"
    assert page.locator("#amount").inner_text().endswith(" BTC")
    _shot(page, "order-quote")
    page.click("#i-paid")
    assert page.locator("[data-status]").inner_text() == "Payment notified"
    assert page.locator("#ssh-command").count() == 0  # nothing to connect to yet

    # staff confirm the payment, start provisioning, then record the access
    staff_page = new_page()
    staff_page.goto(f"{live_server.url}/order/staff/")
    staff_page.fill("input[name=username]", "staff")
    staff_page.fill("input[name=password]", "pw-for-tests")
    staff_page.click("[type=submit]")
    staff_page.wait_for_url("**/order/staff/")
    staff_url = f"{live_server.url}/order/staff/{order.pk}/"
    staff_page.goto(staff_url)
    staff_page.select_option("select[name=action]", "confirm")
    staff_page.fill("#staff-action textarea[name=note]", "seen on chain, 3 confirmations")
    _staff_submits(staff_page, "#staff-action")
    staff_page.goto(staff_url)
    staff_page.select_option("select[name=action]", "provisioning")
    staff_page.fill("#staff-action textarea[name=note]", "preparing your machine")
    _staff_submits(staff_page, "#staff-action")

    staff_page.goto(staff_url)
    assert SSH_KEY in staff_page.locator("#authorized-keys").inner_text()
    linked = staff_page.locator("#linked-texts").inner_text()
    assert f"profile {profile.pk} on CPU (2 threads)" in linked
    assert "Estimate" in linked and " h on " in linked
    staff_page.fill("#access_host", "gpu-7.example.net; reboot")
    staff_page.fill("#access_username", "ada")
    staff_page.click("#access-form button[type=submit]")
    assert "Give a DNS name" in staff_page.locator("#access-error-host").inner_text()
    staff_page.goto(staff_url)
    staff_page.fill("#access_host", "gpu-7.example.net")
    staff_page.fill("#access_port", "2222")
    staff_page.fill("#access_username", "ada")
    staff_page.fill("#access_notebook_url", "https://gpu-7.example.net:8888/lab")
    staff_page.fill("#access_notebook_token", "nb-token-8f3a1c5e9b")
    _shot(staff_page, "staff-provision")
    _staff_submits(staff_page, "#access-form")
    assert "is now active until" in staff_page.locator("main").inner_text()
    order.refresh_from_db()
    assert order.status == Status.ACTIVE

    # the customer's page, left open since "I paid", loads itself again once the
    # rental is active (its status refreshes every 15 s) and shows how to connect
    page.wait_for_selector("#ssh-command", timeout=45_000)
    assert page.url == tracking_url
    assert page.locator("[data-status]").inner_text() == "Active"
    # the copy button copies the command
    assert page.locator("#ssh-command").inner_text() == SSH_COMMAND
    copy = page.locator('button[data-copy="ssh-command"]')
    copy.click()
    page.wait_for_function(
        "() => document.querySelector('button[data-copy=\"ssh-command\"]').textContent === 'Copied'"
    )
    assert page.evaluate("() => navigator.clipboard.readText()") == SSH_COMMAND
    assert page.locator("#copy-status").inner_text() == f"Copied to the clipboard: {SSH_COMMAND}"

    # the notebook token stays hidden until the customer asks for it
    token = page.locator("#notebook-token")
    assert not token.is_visible()
    page.click("#notebook-token-reveal summary")
    assert token.is_visible() and token.inner_text() == "nb-token-8f3a1c5e9b"
    # the batch list's command line, to run on the machine
    run = "python manage.py campaign run texts --wait"
    assert page.locator("#campaign-run").inner_text() == run
    # the time left, counted down by the page
    assert re.fullmatch(r"6 d 23 h left", page.locator("#rental-remaining").inner_text())
    _shot(page, "order-active")
