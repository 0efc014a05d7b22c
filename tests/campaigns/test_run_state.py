"""What a campaign is doing, said the same on its page, in the list and by
`campaign status`: paused, waiting at its checkpoint, stopped by a failed one."""

from __future__ import annotations

import json
from io import StringIO
from unittest import mock

import pytest
from django.core.management import call_command
from django.test.html import parse_html
from django.urls import reverse

from campaigns.models import Checkpoint, Unit, UnitState
from campaigns.runs import control, start
from tests.conftest import waiting_at_checkpoint

HTMX_COUNTS = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "counts"}


@pytest.fixture
def campaign(make_campaign):
    return make_campaign("texts")


def _detail(campaign):
    return reverse("campaign_detail", args=[campaign.name])


def _status(*args) -> str:
    out = StringIO()
    call_command("campaign", "status", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


def _element(html: str, element_id: str) -> str:
    """The element with this id, as text with its tags (django's HTML tree)."""
    found = parse_html(html)
    stack = [found]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            continue
        if dict(node.attributes).get("id") == element_id:
            return str(node)
        stack.extend(node.children)
    raise AssertionError(f"no #{element_id}")


def _pending(campaign) -> int:
    return Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count()


def test_the_page_says_waiting_at_the_checkpoint_and_links_it_instead_of_idle(
    client, owner, campaign
):
    # given: the first group ran and its checkpoint waits for the spot check
    checkpoint = waiting_at_checkpoint(campaign)
    pending = _pending(campaign)
    client.force_login(owner)

    # when
    html = client.get(_detail(campaign)).content.decode()

    # then: the header and the status line name the checkpoint and link its page
    link = reverse("checkpoint_detail", args=[checkpoint.pk])
    header = _element(html, "run-state")
    assert f"Waiting at checkpoint {checkpoint.pk} (v1)" in header and link in header
    status = _element(html, "run-status")
    assert f"Waiting at checkpoint {checkpoint.pk} (v1)" in status and link in status
    assert f"{pending} units wait for it" in status
    assert "Idle" not in status


def test_a_small_campaign_at_its_checkpoint_reads_waiting_not_done(client, owner, campaign):
    # given: every unit ran in the first group, and its checkpoint waits
    checkpoint = waiting_at_checkpoint(campaign)
    Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).update(
        state=UnitState.SUCCEEDED
    )
    client.force_login(owner)

    # when
    html = client.get(_detail(campaign)).content.decode()

    # then
    status = _element(html, "run-status")
    assert f"Waiting at checkpoint {checkpoint.pk} (v1)" in status
    assert "every unit is processed: review its spot check" in status
    assert "nothing left" not in status


def test_a_paused_campaign_reads_paused_until_run_again(client, owner, campaign):
    client.force_login(owner)

    # when: paused with nothing running
    page = client.post(reverse("campaign_pause", args=[campaign.name]), follow=True)

    # then: its header, its status line and the list say so
    html = page.content.decode()
    assert 'data-state="paused"' in _element(html, "run-state")
    assert "Paused" in _element(html, "run-state")
    assert f"{_pending(campaign)} units to do; Resume goes on" in _element(html, "run-status")
    listing = client.get(reverse("campaign_list")).content.decode()
    assert '<td class="run-state" data-state="paused"' in listing

    # and Run takes it out of the Pause
    with mock.patch.object(start.celery_app, "send_task"):
        page = client.post(reverse("campaign_run", args=[campaign.name]), follow=True)
    assert "Paused" not in _element(page.content.decode(), "run-state")


def test_the_list_says_which_campaign_waits_at_its_checkpoint(client, owner, campaign):
    checkpoint = waiting_at_checkpoint(campaign)
    client.force_login(owner)

    html = client.get(reverse("campaign_list")).content.decode()

    row = html.split('<td class="run-state"')[1].split("</td>")[0]
    assert f"Waiting at checkpoint {checkpoint.pk} (v1)" in row
    assert reverse("checkpoint_detail", args=[checkpoint.pk]) in row


def test_a_failed_checkpoint_says_the_campaign_is_stopped_and_why(client, owner, campaign):
    checkpoint = waiting_at_checkpoint(campaign)
    Checkpoint.objects.filter(pk=checkpoint.pk).update(
        state=Checkpoint.State.FAILED, reason="labels swapped"
    )
    client.force_login(owner)

    html = client.get(_detail(campaign)).content.decode()

    status = _element(html, "run-status")
    assert f"Stopped: checkpoint {checkpoint.pk} (v1) failed" in status
    assert "labels swapped" in status


def test_the_counts_poll_swaps_the_header_label_when_the_run_stops_at_the_checkpoint(
    client, owner, campaign
):
    # given: the page was drawn while the first group ran; now it waits
    checkpoint = waiting_at_checkpoint(campaign)
    client.force_login(owner)

    # when: the poll's last answer
    response = client.get(_detail(campaign), **HTMX_COUNTS)

    # then: the counts, and the header's label out of band
    html = response.content.decode()
    assert response.status_code == 286
    assert f"Waiting at checkpoint {checkpoint.pk} (v1)" in _element(html, "run-status")
    label = _element(html, "run-state")
    assert 'hx-swap-oob="true"' in label and f"checkpoint {checkpoint.pk}" in label


@pytest.mark.django_db
def test_campaign_status_says_waiting_at_the_checkpoint_and_paused(make_campaign):
    campaign = make_campaign("texts")
    control.campaign_pause(campaign=campaign)
    assert "Paused: since " in _status("texts")
    assert f"{_pending(campaign)} units to do; Resume goes on" in _status("texts")

    checkpoint = waiting_at_checkpoint(campaign)
    out = _status("texts")
    assert f"Waiting at checkpoint {checkpoint.pk} (v1): {_pending(campaign)} units wait" in out
    assert "campaign checkpoint texts pass|fail" in out
    state = json.loads(_status("texts", "--json"))["state"]
    assert state["key"] == "checkpoint" and state["checkpoint_id"] == checkpoint.pk


def test_after_a_full_disk_the_page_says_outputs_were_not_written_and_resume_redoes_them(
    client, owner, campaign
):
    # given: every unit ran; three could not write their output (disk full)
    units = Unit.objects.filter(campaign=campaign).order_by("pk")
    unwritten = list(units.values_list("pk", flat=True)[:3])
    units.update(state=UnitState.SUCCEEDED)
    Unit.objects.filter(pk__in=unwritten).update(
        state=UnitState.FAILED,
        error_class="output_write_error",
        error_message="[Errno 28] No space left on device",
    )
    client.force_login(owner)

    # then: the page does not say done, it says what happened and what to do
    html = client.get(_detail(campaign)).content.decode()
    assert 'data-state="write_failed"' in _element(html, "run-state")
    status = _element(html, "run-status")
    assert (
        "3 units failed to write their output (disk full, not writable, or not kept as written)"
        in status
    )
    assert "Resume redoes them" in status
    assert "nothing left to run" not in status
    assert "Outputs not written" in _status(campaign.name)

    # and Run remaining says so instead of "Nothing to run"
    page = client.post(reverse("campaign_run", args=[campaign.name]), follow=True)
    said = page.content.decode()
    assert "Nothing to run: no pending units." not in said
    assert "3 units failed to write their output" in said

    # and Resume redoes them
    with mock.patch.object(start.celery_app, "send_task"):
        client.post(reverse("campaign_resume", args=[campaign.name]))
    assert not Unit.objects.filter(campaign=campaign, error_class="output_write_error").exists()
