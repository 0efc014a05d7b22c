"""A person sets up a campaign in the browser: parameters swap with the processor,
the preview shows what will fail, Create starts the work."""

from __future__ import annotations

from unittest import mock

import pytest

from campaigns.models import Campaign, UnitState
from campaigns.runs import start

pytestmark = pytest.mark.e2e


def test_set_up_preview_and_start_a_campaign(
    page, live_server, owner, corpus, settings, transactional_db
):
    settings.CORPUS_ROOTS = [corpus.parent]
    page.goto(f"{live_server.url}/campaigns/new/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/campaigns/new/")

    # the parameters follow the processor, without a reload
    page.evaluate("window.__notReloaded = true")
    page.select_option("select[name=processor]", "image-transform")
    page.wait_for_selector("select[name=param_operation]")
    assert page.locator("input[name=param_max_tokens]").count() == 0
    page.select_option("select[name=processor]", "text-embedding")
    page.wait_for_selector("input[name=param_max_tokens]")
    assert page.evaluate("window.__notReloaded") is True

    page.fill("input[name=project]", "acme")
    page.fill("input[name=name]", "from-the-browser")
    page.select_option("select[name=folder]", str(corpus))
    page.select_option("select[name=param_batch_policy]", "token_budget")

    # preview: what will fail, before anything exists
    page.click("button[value=preview]")
    failing = page.locator("table.failing").inner_text()
    assert "bad/empty.txt" in failing and "empty file" in failing
    assert not Campaign.objects.exists()

    # create and start: the campaign page shows the queued work
    with mock.patch.object(start.celery_app, "send_task") as send:
        page.click("button[value=create]")
        page.wait_for_url("**/campaigns/from-the-browser/")
    campaign = Campaign.objects.get(name="from-the-browser")
    assert campaign.current_version.params["batch_policy"] == "token_budget"
    assert send.call_count >= 1
    queued = campaign.units.filter(state=UnitState.QUEUED).count()
    assert int(page.locator('#counts [data-count="queued"]').inner_text()) == queued == 39
    assert "Created from-the-browser: 39 units" in page.locator("main").inner_text()
