"""Run and Resume while the broker is down: a readable message on the page and in
the CLI, never a 500 nor a hung request; the batches stay queued in the database
and the lost-message sweep sends them once the broker answers again."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from campaigns.models import Batch
from campaigns.runs import leases
from tests.worker import free_port, purge_queue, use_broker

pytestmark = pytest.mark.django_db(transaction=True)

DOWN = "The broker does not answer"


def _closed_port_broker() -> str:
    # Nothing listens there: every connection is refused.
    return f"redis://127.0.0.1:{free_port()}/0"


def _queued(campaign) -> list[int]:
    return sorted(
        Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).values_list(
            "pk", flat=True
        )
    )


def test_run_and_resume_with_the_broker_down_say_so_and_keep_the_work(client, owner, make_campaign):
    campaign = make_campaign("offline")
    client.force_login(owner)
    with use_broker(_closed_port_broker()):
        # when: Run is pressed while the broker refuses connections
        clock = time.monotonic()
        page = client.post(reverse("campaign_run", args=[campaign.name]), follow=True)
        took = time.monotonic() - clock

        # then: the page says what happened and what comes next, quickly
        assert page.status_code == 200
        html = page.content.decode()
        assert DOWN in html
        queued = _queued(campaign)
        assert queued, "the batches are planned and kept"
        assert f"{len(queued)} batch" in html and "sent by the sweeper" in html
        assert took < 15, took

        # and Resume says the same instead of failing
        page = client.post(reverse("campaign_resume", args=[campaign.name]), follow=True)
        assert page.status_code == 200
        assert DOWN in page.content.decode()
        assert _queued(campaign) == queued

    # when the broker answers again, the sweep sends every one of them
    purge_queue()
    assert leases.batches_resend_lost(grace=0, confirm_after=0) == queued


def test_campaign_run_in_the_cli_with_the_broker_down_says_so(make_campaign, capsys):
    campaign = make_campaign("offline-cli")
    with use_broker(_closed_port_broker()), pytest.raises(CommandError, match=DOWN) as failed:
        call_command("campaign", "run", campaign.name)
    assert "sent by the sweeper" in str(failed.value)
    assert _queued(campaign)
