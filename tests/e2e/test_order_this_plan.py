"""From a profile's estimate to an order: "Order this plan" fills the configurator
with the recommended cards, duration and software, and the order is linked to
the campaign."""

from __future__ import annotations

import re

import pytest

from portal.models import CryptoCurrency, Environment, GpuModel, Order, RentalDuration
from tests.campaigns.test_profile_views import build_done_profile
from tests.conftest import SSH_KEY

pytestmark = pytest.mark.e2e


def test_order_this_plan_prefills_the_configurator_and_links_the_order_to_the_campaign(
    page, live_server, owner, make_campaign, catalog, fresh_rates, address_pool, transactional_db
):
    campaign = make_campaign("texts")
    estimate = build_done_profile(campaign).estimate
    gpu = GpuModel.objects.get(name=estimate.gpu_name)
    duration = RentalDuration.objects.get(days=estimate.duration_days)
    environment = Environment.objects.get(name="BriefGPU worker 0.1")  # torch 2.13, as profiled

    # given: the owner reads the campaign's profile report
    page.goto(f"{live_server.url}/campaigns/texts/profile/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/campaigns/texts/profile/")
    assert "Chosen batch size 12" in page.locator("#chosen").inner_text()

    # when: Order this plan
    page.click("#order-plan")
    page.wait_for_url(re.compile(r".*/order/\?.*campaign=texts.*"))

    # then: the configurator holds the plan, says why the memory, names the campaign
    assert page.locator("select[name=gpu]").input_value() == str(gpu.pk)
    assert page.locator("input[name=quantity]").input_value() == str(estimate.quantity)
    assert page.locator("input[name=duration]:checked").get_attribute("value") == str(duration.pk)
    assert page.locator("select[name=environment]").input_value() == str(environment.pk)
    guidance = page.locator("#memory-guidance").inner_text()
    assert f"at least {estimate.memory_tier_gb} GB per card" in guidance
    main = page.locator("main").inner_text()
    assert "will be linked to your campaign texts" in main
    expected_total = gpu.price_per_day * estimate.quantity * duration.days
    assert page.locator("#total").inner_text().startswith(f"{expected_total:.2f}")

    # and the order placed from it belongs to the campaign
    page.fill("input[name=first_name]", "Ada")
    page.fill("input[name=last_name]", "Lovelace")
    page.fill("input[name=email]", "ada@example.org")
    page.fill("textarea[name=ssh_keys]", SSH_KEY)
    page.select_option("select[name=currency]", str(CryptoCurrency.objects.get(code="BTC").pk))
    page.click("#order-form button[type=submit]")  # not the header's "Log out"
    page.wait_for_url(re.compile(r".*/order/t/[\w-]{32,}/$"))
    order = Order.objects.get()
    assert order.campaign_id == campaign.pk
    assert (order.gpu_id, order.quantity, order.duration_days, order.environment_id) == (
        gpu.pk,
        estimate.quantity,
        duration.days,
        environment.pk,
    )
