"""The watch panel, the campaign list's ETA and `campaign status`: what a
customer renting a device by the hour reads — when the run ends, against the
rental's end, who is working, and a stall named with its cause."""

from __future__ import annotations

import datetime as dt
import io
import json

import pytest
from django.core.management import call_command
from django.urls import reverse
from django.utils import timezone

from campaigns import selectors
from campaigns.models import Batch, Campaign, Unit, UnitState, WorkerBeat
from campaigns.watch import state

HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def campaign(make_campaign):
    made = make_campaign("texts")
    Campaign.objects.filter(pk=made.pk).update(checkpoint_after=0)
    made.refresh_from_db()
    return made


def _history(campaign, *, batches=6, seconds=10, size=4, tokens=400, end=None):
    """Finished batches, one every `seconds`, the last ending at `end` (now)."""
    end = end or timezone.now()
    version = campaign.current_version
    made = []
    for i in range(batches):
        finished = end - dt.timedelta(seconds=seconds * (batches - 1 - i))
        made.append(
            Batch.objects.create(
                campaign=campaign,
                version=version,
                size=size,
                state=Batch.State.DONE,
                started_at=finished - dt.timedelta(seconds=seconds),
                finished_at=finished,
                real_tokens=tokens,
                worker="gpu1:100",
                rss=200_000_000 + i,
            )
        )
    return made


def _beat(name="gpu1:100", *, ago=1.0, queues="gpu", done=6):
    host, pid = name.split(":")
    at = timezone.now() - dt.timedelta(seconds=ago)
    return WorkerBeat.objects.create(
        name=name,
        host=host,
        pid=int(pid),
        device="cuda:0 NVIDIA H200",
        queues=queues,
        batches_done=done,
        started_at=at - dt.timedelta(hours=1),
        beat_at=at,
    )


def _running(campaign, *, worker="gpu1:100", units=4, created_ago=5.0):
    batch = Batch.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        size=units,
        state=Batch.State.RUNNING,
        worker=worker,
        lease_expires_at=timezone.now() + dt.timedelta(seconds=30),
    )
    Batch.objects.filter(pk=batch.pk).update(
        created_at=timezone.now() - dt.timedelta(seconds=created_ago)
    )
    pks = list(
        Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).values_list(
            "pk", flat=True
        )[:units]
    )
    Unit.objects.filter(pk__in=pks).update(state=UnitState.RUNNING, batch=batch)
    return batch


def test_the_panel_says_when_the_run_ends_in_tokens(client, owner, campaign):
    Unit.objects.filter(campaign=campaign).update(cost=100)  # 39 units, 3,900 tokens
    _history(campaign)  # 400 tokens every 10 s: 40 tokens/s
    _running(campaign)
    _beat()
    client.force_login(owner)
    page = client.get(reverse("campaign_watch", args=[campaign.name]), **HTMX)
    html = page.content.decode()
    assert page.status_code == 200
    assert 'id="watch"' in html and 'hx-trigger="every 15s"' in html
    assert "39 units (3,900 tokens)" in html
    assert "0.4 units/s, 40 tokens/s over the last 6 batches" in html
    # 3,900 tokens at 40 tokens/s: 97.5 s, "in 98 s".
    assert "in 98 s" in html
    assert 'data-worker="gpu1:100" data-live="true"' in html
    assert "cuda:0 NVIDIA H200" in html
    assert f"batch {Batch.objects.get(state='running').pk} of texts" in html
    assert html.count("<svg") == 3  # items/s, tokens/s, worker RSS
    assert "stall-banner" not in html


def test_the_panel_against_the_rental(client, owner, campaign, make_order):
    from portal.models import Order
    from portal.order_states import Status

    Unit.objects.filter(campaign=campaign).update(cost=100)
    _history(campaign)
    _running(campaign)
    _beat()
    now = timezone.now()
    order = make_order(days=3)
    Order.objects.filter(pk=order.pk).update(
        status=Status.ACTIVE,
        starts_at=now - dt.timedelta(days=1, hours=12),
        ends_at=now + dt.timedelta(days=1, hours=12),
    )
    order.campaigns.add(campaign)
    client.force_login(owner)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert 'data-fits="true"' in html
    assert "h before Rental" in html and "50% of the rental used" in html

    out = io.StringIO()
    call_command("campaign", "status", campaign.name, "--json", stdout=out)
    watch = json.loads(out.getvalue())["watch"]
    assert watch["rental"]["used_share"] == pytest.approx(0.5, abs=0.01)
    assert watch["rental"]["margin_seconds"] > 0
    assert watch["eta"]["by_cost"] is True
    assert watch["left"] == {
        "units": 39,
        "cost": 3900,
        "cost_exact": True,
        "cost_unit": "tokens",
    }
    assert watch["running"] is True
    assert [v["version"] for v in watch["versions"]] == [campaign.current_version.label]
    assert watch["versions"][0]["eta"]["seconds"] == watch["eta"]["seconds"]


def test_a_dead_worker_holding_a_batch_raises_the_banner(client, owner, campaign, settings):
    settings.WORKER_BEAT_SECONDS = 15
    _history(campaign, end=timezone.now() - dt.timedelta(seconds=90))
    _running(campaign, created_ago=120)
    _beat(ago=80)  # silent for more than 3 beats: killed
    client.force_login(owner)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert 'id="stall-banner" data-cause="no_worker"' in html
    assert "No worker is running" in html
    assert 'data-worker="gpu1:100" data-live="false"' in html

    out = io.StringIO()
    call_command("campaign", "status", campaign.name, stdout=out)
    assert "STALLED: No worker is running" in out.getvalue()


def test_a_progressing_run_has_no_banner_and_an_idle_one_stops_polling(client, owner, campaign):
    _history(campaign)
    _running(campaign)
    _beat()
    client.force_login(owner)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert "stall-banner" not in html
    Batch.objects.filter(state=Batch.State.RUNNING).update(state=Batch.State.DONE)
    Unit.objects.filter(campaign=campaign, state=UnitState.RUNNING).update(
        state=UnitState.SUCCEEDED
    )
    html = client.get(reverse("campaign_watch", args=[campaign.name]), **HTMX).content.decode()
    assert 'data-active="false"' in html and "every 15s" not in html


def test_before_three_batches_it_says_measuring(client, owner, campaign):
    _history(campaign, batches=2)
    _running(campaign)
    _beat()
    client.force_login(owner)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert "measuring: an estimate follows the first batches" in html


def test_the_list_shows_the_eta_of_running_campaigns(client, owner, campaign, make_campaign):
    idle = make_campaign("idle-one")
    Unit.objects.filter(campaign=campaign).update(cost=100)
    _history(campaign)
    _running(campaign)
    client.force_login(owner)
    html = client.get(reverse("campaign_list")).content.decode()
    assert html.count("data-eta") == 1
    assert "ETA ~" in html and "(in 98 s)" in html
    assert idle.name in html


def test_the_campaign_page_loads_the_panel(client, owner, campaign):
    client.force_login(owner)
    html = client.get(reverse("campaign_detail", args=[campaign.name])).content.decode()
    assert f'hx-get="/campaigns/{campaign.name}/watch/" hx-trigger="load"' in html


def test_outsiders_see_no_panel(client, outsider, campaign):
    client.force_login(outsider)
    assert client.get(reverse("campaign_watch", args=[campaign.name])).status_code == 404


def _left(campaign):
    counts = selectors.campaign_counts(campaign=campaign)
    return state.work_left(campaign=campaign, counts=counts)


def test_work_left_by_version_counts_unweighed_units_at_the_mean(campaign):
    pks = list(Unit.objects.filter(campaign=campaign).values_list("pk", flat=True))
    Unit.objects.filter(pk__in=pks[:10]).update(cost=50)
    left = _left(campaign)[campaign.current_version_id]
    assert (left.units, left.cost, left.exact) == (39, 39 * 50, True)
    Unit.objects.filter(campaign=campaign).update(cost=None)
    assert _left(campaign)[campaign.current_version_id].cost is None


def test_work_left_reads_a_bounded_sample_of_a_large_campaign(campaign, monkeypatch):
    """Beyond COST_SAMPLE units a state, the cost is the count times the mean
    of the first units by id: what is left of ten million units is weighed by
    reading a few thousand."""
    monkeypatch.setattr(state, "COST_SAMPLE", 10)
    pks = list(Unit.objects.filter(campaign=campaign).order_by("pk").values_list("pk", flat=True))
    Unit.objects.filter(pk__in=pks[:10]).update(cost=100)
    Unit.objects.filter(pk__in=pks[10:]).update(cost=300)
    left = _left(campaign)[campaign.current_version_id]
    assert (left.units, left.cost, left.exact) == (39, 39 * 100, False)
    running = _running(campaign, units=4)  # the first four pending by id
    split = _left(campaign)
    assert split[campaign.current_version_id].units == 39
    assert running.size == 4


def test_the_panel_says_an_estimated_cost_is_one(client, owner, campaign, monkeypatch):
    monkeypatch.setattr(state, "COST_SAMPLE", 10)
    Unit.objects.filter(campaign=campaign).update(cost=100)
    client.force_login(owner)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert "39 units (about 3,900 tokens, from a sample of their costs)" in html


def test_each_version_with_work_left_has_its_line(client, owner, campaign):
    """v1's batches still running while v2 (new parameters) waits with the rest:
    one line each, with its own rate and estimate."""
    from campaigns.runs import setup

    Unit.objects.filter(campaign=campaign).update(cost=100)
    _history(campaign)
    _running(campaign, units=4)
    v1 = campaign.current_version
    v2 = setup.version_create(campaign=campaign, params={"max_tokens": 128})
    campaign.refresh_from_db()
    assert campaign.current_version_id == v2.pk
    client.force_login(owner)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    table = html[html.index('id="version-etas"') :]
    assert f"<th>{v1.label}</th><td>4</td>" in table
    assert f"<th>{v2.label} (current)</th><td>35</td>" in table
    # v1 measured its batches; v2 has none yet.
    assert "0.4 units/s, 40 tokens/s" in table and "measuring: fewer than 3" in table


def test_the_timeline_sums_every_finished_batch_by_slice_and_worker(campaign):
    """The charts' rows: each done batch in exactly one slice of the run, per
    worker, summed by the database (both vendors' time arithmetic)."""
    from campaigns.db import run_timeline

    made = _history(campaign, batches=10, seconds=6)  # gpu1:100, 54 s of finishes
    Batch.objects.filter(pk__in=[b.pk for b in made[::2]]).update(
        worker="gpu2:200", metrics={"gpu_util": 80}
    )
    Batch.objects.create(  # still running: not in the timeline
        campaign=campaign, version=campaign.current_version, size=9, state="running"
    )
    found = run_timeline.timeline(campaign_id=campaign.pk, slices=9)
    assert found.slices == 9 and found.width == pytest.approx(6.0, abs=0.01)
    assert sum(r.batches for r in found.rows) == 10
    assert sum(r.items for r in found.rows) == 40 and sum(r.cost for r in found.rows) == 4000
    assert {r.worker for r in found.rows} == {"gpu1:100", "gpu2:200"}
    assert all(0 <= r.index < 9 for r in found.rows)
    utils = {r.gpu_util for r in found.rows if r.worker == "gpu2:200"}
    assert utils == {80.0}
    assert {r.gpu_util for r in found.rows if r.worker == "gpu1:100"} == {None}
    assert found.start == made[0].finished_at and found.end == made[-1].finished_at
    assert run_timeline.timeline(campaign_id=campaign.pk + 1000, slices=9) is None


def test_the_workers_panel_names_only_the_readers_campaigns(
    client, owner, outsider, campaign, make_campaign
):
    """Workers are shared by every project of the installation: a member of
    one sees that a worker is busy, not the name of another project's campaign."""
    from campaigns.models import Project

    other_project = Project.objects.create(name="other")
    other_project.members.add(outsider)
    secret = make_campaign("secret-merger-plan")
    Campaign.objects.filter(pk=secret.pk).update(project=other_project)
    _running(secret, worker="gpu1:100")
    _beat()
    client.force_login(owner)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert "secret-merger-plan" not in html
    assert "another project&#x27;s campaign" in html or "another project's campaign" in html
    client.force_login(outsider)
    html = client.get(reverse("campaign_watch", args=[secret.name])).content.decode()
    assert "of secret-merger-plan" in html


def test_a_run_that_does_not_run_promises_no_end(client, owner, campaign, make_order):
    """Paused (or waiting at its checkpoint): the work left at the measured
    rate, no finishing time, and the rental's clock said to run on."""
    from portal.models import Order
    from portal.order_states import Status

    Unit.objects.filter(campaign=campaign).update(cost=100)
    _history(campaign)  # it ran, then stopped: nothing queued or running now
    now = timezone.now()
    order = make_order(days=3)
    Order.objects.filter(pk=order.pk).update(
        status=Status.ACTIVE,
        starts_at=now - dt.timedelta(days=1),
        ends_at=now + dt.timedelta(days=2),
        campaign=campaign,
    )
    client.force_login(owner)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert "not running: about" in html and "of work left at the recent rate" in html
    assert "UTC, in" not in html.split('id="eta-done"')[1].split("</dd>")[0]
    assert 'data-fits="unknown"' in html and "its clock running" in html
    out = io.StringIO()
    call_command("campaign", "status", campaign.name, "--json", stdout=out)
    watch = json.loads(out.getvalue())["watch"]
    assert watch["running"] is False
    assert watch["eta"]["finishes_at"] is None and watch["eta"]["seconds"] > 0
    assert watch["rental"]["margin_seconds"] is None


def test_a_training_a_worker_runs_is_shown(client, owner, campaign):
    from campaigns.models import Training

    _beat()
    Training.objects.create(
        campaign=campaign, version=campaign.current_version, state="running", worker="gpu1:100"
    )
    client.force_login(owner)
    html = client.get(reverse("campaign_watch", args=[campaign.name])).content.decode()
    assert "a training of texts" in html
