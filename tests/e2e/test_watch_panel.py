"""The watch panel in Chromium: loaded after the campaign page, it shows when
the run ends against the rental, the live workers, the charts over the run,
and, once the worker holding a batch stops beating, the stall banner; the
project's alerts page takes a webhook and shows its secret."""

from __future__ import annotations

import datetime as dt

import pytest
from django.db.models import F
from django.utils import timezone

from campaigns.models import Batch, Unit, WorkerBeat
from tests.campaigns.test_watch_page import _beat, _history, _running

pytestmark = pytest.mark.e2e


def _log_in(page, url: str) -> None:
    page.goto(url)
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url(url)


def test_the_panel_and_its_charts_render_and_a_dead_worker_raises_the_banner(
    page, live_server, owner, make_campaign, make_order, settings
):
    from portal.models import Order
    from portal.order_states import Status

    settings.WORKER_BEAT_SECONDS = 15
    campaign = make_campaign("watched")
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    Unit.objects.filter(campaign=campaign).update(cost=100)
    _history(campaign, batches=12)
    _running(campaign)
    _beat()
    now = timezone.now()
    order = make_order(days=7)
    Order.objects.filter(pk=order.pk).update(
        status=Status.ACTIVE,
        starts_at=now - dt.timedelta(days=1),
        ends_at=now + dt.timedelta(days=6),
        campaign=campaign,
    )

    # given: the campaign page of a running campaign
    _log_in(page, f"{live_server.url}/campaigns/watched/")

    # then: the panel loads after the page, with its estimate and the rental
    panel = page.locator("#watch")
    panel.locator("#eta-done").wait_for()
    assert "in 98 s" in panel.locator("#eta-done").inner_text()
    rental = panel.locator("#eta-rental").inner_text()
    assert "before Rental" in rental and "14% of the rental used" in rental
    # the live worker, with the batch it holds
    row = panel.locator('#workers tr[data-worker="gpu1:100"]')
    assert row.get_attribute("data-live") == "true"
    assert "cuda:0 NVIDIA H200" in row.inner_text() and "of watched" in row.inner_text()
    # and the charts: items/s, tokens/s, the worker's memory, each an SVG with a line
    charts = panel.locator("figure.profile-chart svg")
    assert charts.count() == 3
    for i in range(3):
        box = charts.nth(i).bounding_box()
        assert box is not None and box["width"] > 300
        assert charts.nth(i).locator("polyline").count() >= 1
    assert panel.locator("#stall-banner").count() == 0

    # when: the worker was killed two minutes ago while it held its batch:
    # its beat stopped, and no batch finished since
    two_minutes = dt.timedelta(minutes=2)
    WorkerBeat.objects.update(beat_at=F("beat_at") - two_minutes)
    Batch.objects.update(
        created_at=F("created_at") - two_minutes,
        started_at=F("started_at") - two_minutes,
        finished_at=F("finished_at") - two_minutes,
    )

    # then: the panel's next poll shows the banner, naming the cause
    banner = page.locator("#stall-banner")
    banner.wait_for(timeout=25_000)
    assert banner.get_attribute("data-cause") == "no_worker"
    assert "No worker is running" in banner.inner_text()
    assert row.get_attribute("data-live") == "false"


def test_the_alerts_page_takes_a_webhook_and_shows_the_secret(
    page, live_server, owner, make_campaign, settings
):
    settings.WEBHOOK_ALLOW_PRIVATE = True
    campaign = make_campaign("alerted")
    _log_in(page, f"{live_server.url}/campaigns/alerted/watch/")
    page.click(f"a[href='/campaigns/projects/{campaign.project_id}/alerts/']")
    page.wait_for_url("**/alerts/")
    secret = page.locator("#webhook-secret").inner_text()
    assert len(secret) == 64
    page.fill("input[name=webhook_url]", "http://127.0.0.1:9999/hook")
    page.uncheck("input[name=events][value=done]")
    page.click("#alerts-form button[type=submit]")
    page.locator("#alerts-saved").wait_for()
    from campaigns.models import ProjectAlerts

    alerts = ProjectAlerts.objects.get(project=campaign.project)
    assert alerts.webhook_url == "http://127.0.0.1:9999/hook"
    assert "done" not in alerts.events and "checkpoint" in alerts.events
    assert alerts.webhook_secret == secret
