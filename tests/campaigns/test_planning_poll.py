"""The campaign page keeps polling while a run is being planned, not only while
units are queued or running: workers faster than the planner (a GPU beside a
CPU that tokenizes) finish every queued batch before the next slice is
planned, and a page that stopped at that gap would never update again."""

from __future__ import annotations

import datetime as dt
from unittest import mock

import pytest
from django.urls import reverse
from django.utils import timezone

from campaigns import selectors
from campaigns.models import Campaign, Unit, UnitState
from campaigns.runs import start
from campaigns.tasks import plan_campaign

HTMX_COUNTS = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "counts"}
HTMX_RUN_PANELS = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-panels"}


@pytest.fixture
def campaign(make_campaign, monkeypatch):
    monkeypatch.setattr(start, "RUN_SLICE_UNITS", 16)  # 39 units: three slices
    made = make_campaign("texts")
    Campaign.objects.filter(pk=made.pk).update(checkpoint_after=0)  # past the checkpoint
    return made


def _poll(client, campaign, headers=HTMX_COUNTS):
    return client.get(reverse("campaign_detail", args=[campaign.name]), **headers)


def _workers_finish_what_is_queued(campaign) -> None:
    Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).update(state=UnitState.SUCCEEDED)


def _start(client, campaign, django_capture_on_commit_callbacks) -> list:
    """The page's Start: the first slice queued, the rest handed to a portal
    worker; returns the plan task's arguments."""
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        client.post(reverse("campaign_run", args=[campaign.name]))
    name, args = send.call_args_list[-1].args[0], send.call_args_list[-1].kwargs["args"]
    assert name == start.PLAN_TASK
    return args


def test_the_page_keeps_polling_while_the_rest_waits_for_the_planner(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    _start(client, campaign, django_capture_on_commit_callbacks)
    _workers_finish_what_is_queued(campaign)  # before the portal worker takes the rest

    response = _poll(client, campaign)
    assert response.status_code == 200  # not 286: the page goes on polling
    html = response.content.decode()
    assert "hx-trigger" in html
    assert "planning the next batches, 23 units to do" in html
    assert _poll(client, campaign, HTMX_RUN_PANELS).status_code == 200
    page = client.get(reverse("campaign_detail", args=[campaign.name])).content.decode()
    assert 'data-active="true"' in page


def test_the_page_keeps_polling_while_a_slice_is_planned_and_stops_after_the_last(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    args = _start(client, campaign, django_capture_on_commit_callbacks)
    polls: list[int] = []
    plan = start._plan_and_send

    def drained_then_planned(**kwargs):
        # The workers have run dry by the time each slice is planned.
        _workers_finish_what_is_queued(campaign)
        polls.append(_poll(client, campaign).status_code)
        return plan(**kwargs)

    with (
        mock.patch.object(start, "_plan_and_send", drained_then_planned),
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert plan_campaign(*args) == 2
    assert polls == [200, 200]
    assert _poll(client, campaign).status_code == 200  # the last slice is queued
    _workers_finish_what_is_queued(campaign)
    response = _poll(client, campaign)
    assert response.status_code == 286  # nothing queued, running or planned: stop
    assert "Done" in response.content.decode()
    assert Campaign.objects.get(pk=campaign.pk).planning_at is None


def test_a_planner_that_died_lets_the_page_stop_once_its_stamp_is_stale(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    _start(client, campaign, django_capture_on_commit_callbacks)
    _workers_finish_what_is_queued(campaign)
    assert _poll(client, campaign).status_code == 200
    # The portal worker was killed mid-slice: its stamp is never renewed or cleared.
    died = timezone.now() - Campaign.PLANNING_STALE - dt.timedelta(seconds=1)
    Campaign.objects.filter(pk=campaign.pk).update(planning_at=died)
    response = _poll(client, campaign)
    assert response.status_code == 286
    assert "Idle" in response.content.decode()  # 23 units to do, Run goes on with them


def test_a_pause_before_the_worker_plans_clears_the_stamp(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    args = _start(client, campaign, django_capture_on_commit_callbacks)
    client.post(reverse("campaign_pause", args=[campaign.name]))
    with mock.patch.object(start.celery_app, "send_task") as send:
        assert plan_campaign(*args) == 0
    send.assert_not_called()
    _workers_finish_what_is_queued(campaign)
    assert _poll(client, campaign).status_code == 286
    assert Campaign.objects.get(pk=campaign.pk).planning_at is None


def test_a_plan_task_the_broker_refuses_leaves_no_stamp(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    from kombu.exceptions import OperationalError

    client.force_login(owner)

    def refuse_the_plan_task(name, args=None, **kwargs):
        if name == start.PLAN_TASK:
            raise OperationalError("connection refused")

    # What the Start view does, its commit callbacks run inside the outage's note.
    with (
        mock.patch.object(start.celery_app, "send_task", side_effect=refuse_the_plan_task),
        start.broker_outage_noted() as outage,
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert start.campaign_start(campaign=Campaign.objects.get(pk=campaign.pk)) == (1, True)
    assert outage.planning_unsent
    assert Campaign.objects.get(pk=campaign.pk).planning_at is None
    _workers_finish_what_is_queued(campaign)
    assert _poll(client, campaign).status_code == 286


def test_the_command_and_the_list_read_planning_too(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    _start(client, campaign, django_capture_on_commit_callbacks)
    _workers_finish_what_is_queued(campaign)
    counts = selectors.campaign_counts(campaign=campaign)
    assert counts.active and counts.planning
    assert counts.as_dict(campaign.name)["planning"] is True
    listed = client.get(reverse("campaign_list")).content.decode()
    assert "planning the next batches" in listed


def test_a_pause_ends_running_at_once_though_the_worker_has_not_planned_yet(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    _start(client, campaign, django_capture_on_commit_callbacks)
    _workers_finish_what_is_queued(campaign)
    client.post(reverse("campaign_pause", args=[campaign.name]))
    response = _poll(client, campaign)  # the portal worker is down, or busy
    assert response.status_code == 286
    assert "Paused" in response.content.decode()


def test_the_worker_clears_only_the_stamp_its_request_left(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    args = _start(client, campaign, django_capture_on_commit_callbacks)
    client.post(reverse("campaign_pause", args=[campaign.name]))
    # Another planner (a second Start, `campaign run`) is at work meanwhile.
    other = timezone.now()
    Campaign.objects.filter(pk=campaign.pk).update(planning_at=other)
    with mock.patch.object(start.celery_app, "send_task"):
        assert plan_campaign(*args) == 0  # paused after the request: nothing planned
    assert Campaign.objects.get(pk=campaign.pk).planning_at == other
