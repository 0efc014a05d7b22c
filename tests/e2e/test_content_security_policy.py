"""Every page works under the Content Security Policy: nothing inline is refused."""

from __future__ import annotations

import pytest

from campaigns.runs import setup
from portal.models import GpuModel

pytestmark = pytest.mark.e2e


def _log_in(page, url: str, username: str) -> None:
    page.goto(f"{url}/accounts/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_load_state()


def test_the_main_pages_load_with_the_policy_and_refuse_nothing(
    page, live_server, make_campaign, owner, staff, project, catalog, csp_violations
):
    campaign = make_campaign("texts")
    project.members.add(staff)
    staff.is_superuser = True  # the admin's change lists too
    staff.save()
    setup.campaign_import(campaign=campaign)

    # an injected inline script is what the policy is for: it must not run
    response = page.goto(f"{live_server.url}/order/")
    policy = response.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "frame-ancestors 'none'" in policy
    page.evaluate(
        """() => { const s = document.createElement('script');
                   s.textContent = 'window.__injected = true'; document.body.append(s); }"""
    )
    assert page.evaluate("window.__injected") is None
    page.wait_for_function("() => true")  # the console message arrives after the refusal
    assert csp_violations, "the injected script was refused and reported"
    csp_violations.clear()

    _log_in(page, live_server.url, "staff")
    for path in (
        "/",
        "/campaigns/",
        "/campaigns/texts/",
        "/campaigns/texts/profile/",
        "/review/",
        "/order/",
        "/order/staff/",
        "/admin/",
        "/admin/campaigns/unit/",
    ):
        page.goto(f"{live_server.url}{path}")
        page.wait_for_load_state("networkidle")
        assert page.locator("body").inner_text().strip(), path
    assert not csp_violations, csp_violations

    # htmx still swaps under the policy (and every browser test checks the
    # console for refusals: tests/e2e/conftest.py): the total follows the card
    page.goto(f"{live_server.url}/order/")
    page.select_option("select[name=gpu]", str(GpuModel.objects.get(name="L40S").pk))
    page.check("#id_duration_0")
    page.fill("input[name=quantity]", "2")
    page.wait_for_function("() => document.querySelector('#total')?.innerText.includes('.')")
