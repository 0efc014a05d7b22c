"""What an abuser, and a staff member, meet in Chromium (issue 31): one visitor
cannot hold every card with unpaid orders (point 2); wrong passwords lock a
login, the right one then refused with a page that says why (point 6); the
demo's staff account opens the admin pages its tasks need (point 10); a
customer is offered, and may use, only their own projects' folders (point 11)."""

from __future__ import annotations

import re
import shutil
from decimal import Decimal

import pytest
from django.core.management import call_command

from campaigns.models import Campaign
from portal.models import CryptoCurrency, ExchangeRate, GpuModel, Order
from tests.conftest import DEMO_CORPUS, SSH_KEY

pytestmark = pytest.mark.e2e


# --- point 2: open unpaid orders are capped per visitor ----------------------------------


def _order(page, url: str, *, email: str, gpu: GpuModel, quantity: int) -> None:
    page.goto(f"{url}/order/")
    page.select_option("select[name=gpu]", str(gpu.pk))
    page.fill("input[name=quantity]", str(quantity))
    page.fill("input[name=first_name]", "Eve")
    page.fill("input[name=last_name]", "Hoarder")
    page.fill("input[name=email]", email)
    page.fill("textarea[name=ssh_keys]", SSH_KEY)
    page.select_option("select[name=currency]", str(CryptoCurrency.objects.get(code="BTC").pk))
    page.click("#order-form button[type=submit]")
    page.wait_for_load_state()


def _gpu_label(page, gpu: GpuModel) -> str:
    return page.locator(f"select[name=gpu] option[value='{gpu.pk}']").inner_text()


def test_one_visitor_s_unpaid_orders_reach_the_cap_and_cards_stay_on_sale(
    page, new_page, live_server, settings, fresh_rates, address_pool, transactional_db
):
    # given: every order from this browser counts toward one client's cap
    settings.ORDER_OPEN_PER_CLIENT = 3
    l4 = GpuModel.objects.get(name="L4")  # stock 8
    # a card each, a new e-mail address each time: neither the per-address cap nor
    # the share of the stock one client may hold (ORDER_MAX_HELD_SHARE) is the one hit
    for n in range(3):
        _order(page, live_server.url, email=f"eve{n}@example.org", gpu=l4, quantity=1)
        page.wait_for_url(re.compile(r".*/order/t/[\w-]{32,}/$"))
    assert Order.objects.count() == 3

    # when: a fourth quote from the same connection
    _order(page, live_server.url, email="eve9@example.org", gpu=l4, quantity=1)

    # then: the form says why, beside what was typed, and nothing is ordered
    assert page.url == f"{live_server.url}/order/"
    errors = page.locator("#form-errors").inner_text()
    assert "Your connection already has 3 unpaid order(s)" in errors
    assert "wait until its quote expires" in errors
    assert page.locator("input[name=email]").input_value() == "eve9@example.org"
    assert Order.objects.count() == 3
    # and the cards the cap kept off hold are still offered to everyone
    stranger = new_page()
    stranger.goto(f"{live_server.url}/order/")
    assert _gpu_label(stranger, l4).endswith("— 5 free")


# --- point 6: wrong passwords lock the login ------------------------------------------------


@pytest.mark.parametrize(
    ("start", "where"),
    [("/order/staff/", "the site's login"), ("/admin/", "the admin's login")],
)
def test_wrong_passwords_lock_the_login_and_the_right_one_is_then_refused_readably(
    page, live_server, staff, settings, transactional_db, start, where
):
    settings.AXES_FAILURE_LIMIT = 3
    page.goto(f"{live_server.url}{start}")

    def log_in(password: str):
        page.fill("input[name=username]", "staff")
        page.fill("input[name=password]", password)
        with page.expect_navigation() as answer:
            page.click("[type=submit]")
        return answer.value

    for _ in range(2):
        assert log_in("guess").status == 200  # the form again, saying the password is wrong
        assert page.locator("input[name=password]").count() == 1, where
    assert log_in("guess").status == 429  # the third wrong one locks

    # then: back at the login, the right password is refused, with a page that says why
    page.goto(f"{live_server.url}{start}")
    refused = log_in("pw-for-tests")
    assert refused.status == 429, where
    text = page.locator("main").inner_text()
    assert "Login locked for a while" in text, where
    assert "Too many wrong passwords for staff" in text, where
    assert "even with the right password" in " ".join(text.split()), where
    assert "Traceback" not in page.content()
    # and the account is not signed in: the page it wanted asks for a login again
    page.goto(f"{live_server.url}{start}")
    assert page.locator("input[name=password]").count() == 1, where


# --- point 10: the demo's staff account and the admin ----------------------------------------


def test_the_demo_staff_account_opens_the_admin_pages_its_tasks_need(
    page, live_server, catalog, settings, transactional_db
):
    # given: the demo's accounts (the command runs on development databases only)
    settings.DEBUG = True
    call_command("demo", "--no-run")
    settings.DEBUG = False
    btc = CryptoCurrency.objects.get(code="BTC")

    # when: its staff account logs into the admin, as docs/ordering.md tells
    page.goto(f"{live_server.url}/admin/")
    page.fill("input[name=username]", "staff")
    page.fill("input[name=password]", "staff-briefgpu")
    page.click("[type=submit]")
    page.wait_for_url(f"{live_server.url}/admin/")

    # then: the pages it needs are listed, and each opens
    index = page.locator("#content-main").inner_text()
    for model in ("Exchange rates", "Payment addresses", "Orders"):
        assert model in index, model
    assert "Gpu models" not in index and "Users" not in index  # the owner's, not staff's

    # rates go stale: staff record a new one
    page.click("#content-main a[href='/admin/portal/exchangerate/add/']")
    page.select_option("select[name=currency]", str(btc.pk))
    page.fill("input[name=fiat_per_unit]", "61000")
    page.click("input[name=_save]")
    assert "was added successfully" in page.locator(".messagelist").inner_text()
    assert ExchangeRate.objects.filter(currency=btc, fiat_per_unit=Decimal("61000")).exists()

    for url in (
        "/admin/portal/paymentaddress/",
        "/admin/portal/paymentaddress/add/",
        "/admin/portal/order/",
        "/order/staff/",
    ):
        answer = page.goto(f"{live_server.url}{url}")
        assert answer.status == 200, url
        assert "403" not in page.title() and "Forbidden" not in page.locator("body").inner_text()


# --- point 11: a customer's corpora are theirs -------------------------------------------------


def test_a_customer_is_offered_only_their_folders_and_a_forged_folder_is_refused(
    page, live_server, owner, outsider, tmp_path, settings, transactional_db, allow_folder
):
    # given: two customers' corpora side by side on one server
    data = tmp_path / "data"
    shutil.copytree(DEMO_CORPUS, data / "acme" / "texts")
    (data / "beta" / "private").mkdir(parents=True)
    (data / "beta" / "private" / "memo.txt").write_text("Beta's memo: the merger closes Friday.")
    settings.CORPUS_ROOTS = [data]
    allow_folder(data / "acme", project="acme", members=[owner])
    allow_folder(data / "beta", project="beta", members=[outsider])

    # when: acme's member opens the setup page
    page.goto(f"{live_server.url}/campaigns/new/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/campaigns/new/")

    # then: only acme's folders and project are offered
    folders = page.locator("select[name=folder] option").evaluate_all(
        "(options) => options.map((o) => o.value)"
    )
    assert str(data / "acme" / "texts") in folders
    assert not [f for f in folders if "beta" in f]
    projects = page.locator("select[name=project] option").all_inner_texts()
    assert "beta" not in " ".join(projects)

    # when: the page is edited to submit beta's folder anyway
    page.select_option("select[name=project]", "acme")
    page.fill("input[name=name]", "forged")
    page.locator("select[name=folder] option").first.evaluate(
        "(option, forged) => { option.value = forged; option.selected = true; }",
        str(data / "beta" / "private"),
    )
    with page.expect_navigation() as answer:
        page.click("button[value=create]")

    # then: refused with words, and nothing of beta's is read or shown
    assert answer.value.status == 400
    assert "that folder is not one your projects may read" in page.locator("main").inner_text()
    assert "memo.txt" not in page.content() and "merger" not in page.content()
    assert not Campaign.objects.exists()
