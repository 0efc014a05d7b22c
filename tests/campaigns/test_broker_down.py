"""Run and Resume while the broker is down: a readable message on the page and in
the CLI, never a 500 nor a hung request; the batches stay queued in the database
and the lost-message sweep sends them once the broker answers again. The same
for the other work a page or a command sends a worker: a training, a profile, the
run a passed checkpoint lets on, the demo's run."""

from __future__ import annotations

import time

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from campaigns.models import Batch, Profile, Training
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


def test_checkpoint_pass_in_the_cli_with_the_broker_down_says_so(make_campaign, owner):
    from tests.conftest import waiting_at_checkpoint

    campaign = make_campaign("offline-checkpoint")
    checkpoint = waiting_at_checkpoint(campaign)
    with use_broker(_closed_port_broker()), pytest.raises(CommandError, match=DOWN) as failed:
        call_command("campaign", "checkpoint", campaign.name, "pass")
    # the verdict is recorded, and the run it lets on is queued for the sweeper
    checkpoint.refresh_from_db()
    assert checkpoint.state == checkpoint.State.PASSED
    assert "sent by the sweeper" in str(failed.value)
    assert _queued(campaign)


# --- trainings and profiles: recorded as queued, sent by the same sweeper -------------


@pytest.fixture
def adaptation_campaign(project, tmp_path):
    import json

    from campaigns.runs import setup

    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for i in range(4):
        (pairs / f"p{i}.json").write_text(json.dumps({"anchor": f"q {i}", "positive": f"a {i}"}))
    campaign, _ = setup.campaign_create(
        name="adapt-offline", processor="text-adaptation", project=project, input_folder=pairs
    )
    return campaign


def _sent_when_the_broker_is_back() -> int:
    """What the sweep sends to the gpu queue once the broker answers again."""
    purge_queue()
    leases.batches_resend_lost(grace=0, confirm_after=0)
    return leases.broker_queue_waiting(leases.BATCH_QUEUE)


# The training page's Start, and the campaign page's Run and Resume, which start it too.
@pytest.mark.parametrize("url", ["training_start", "campaign_run", "campaign_resume"])
def test_training_start_with_the_broker_down_says_so_and_keeps_the_training(
    client, owner, adaptation_campaign, url
):
    client.force_login(owner)
    with use_broker(_closed_port_broker()):
        # when: pressed while the broker is down
        page = client.post(reverse(url, args=[adaptation_campaign.name]), follow=True)

    # then: a readable message, not a 500; the training is recorded as queued
    assert page.status_code == 200
    html = page.content.decode()
    assert DOWN in html
    assert "The training is queued in the database" in html
    training = Training.objects.get(campaign=adaptation_campaign)
    assert training.state == Training.State.QUEUED

    # when the broker answers again, the sweep sends it
    assert _sent_when_the_broker_is_back() == 1


def test_campaign_train_in_the_cli_with_the_broker_down_says_so(adaptation_campaign):
    with use_broker(_closed_port_broker()), pytest.raises(CommandError, match=DOWN) as failed:
        call_command("campaign", "train", adaptation_campaign.name)
    assert "sent by the sweeper" in str(failed.value)
    assert Training.objects.get(campaign=adaptation_campaign).state == Training.State.QUEUED


def test_profile_start_with_the_broker_down_says_so_and_keeps_the_profile(
    client, owner, make_campaign
):
    campaign = make_campaign("profile-offline")
    client.force_login(owner)
    with use_broker(_closed_port_broker()):
        page = client.post(
            reverse("campaign_profile_start", args=[campaign.name]), {"margin": "20"}, follow=True
        )
    assert page.status_code == 200
    html = page.content.decode()
    assert DOWN in html and "The profile is queued in the database" in html
    assert "Profile queued: a worker measures" not in html
    profile = Profile.objects.get(campaign=campaign)
    assert profile.state == Profile.State.QUEUED
    assert _sent_when_the_broker_is_back() == 1


def test_profile_rerun_with_the_broker_down_says_so_and_keeps_the_profile(
    client, owner, make_campaign
):
    campaign = make_campaign("rerun-offline")
    done = Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.DONE,
        sample=list(campaign.units.values_list("pk", flat=True)[:4]),
    )
    client.force_login(owner)
    with use_broker(_closed_port_broker()):
        page = client.post(
            reverse("campaign_profile_rerun", args=[campaign.name, done.pk]), follow=True
        )
    assert page.status_code == 200
    assert DOWN in page.content.decode()
    again = Profile.objects.exclude(pk=done.pk).get(campaign=campaign)
    assert again.state == Profile.State.QUEUED and again.sample == done.sample
    assert _sent_when_the_broker_is_back() == 1


def test_the_demo_with_the_broker_down_says_so_and_sets_up_the_rest(db, catalog, settings):
    from io import StringIO

    from portal.models import PaymentAddress

    settings.DEBUG = True  # the development database it is made for
    out = StringIO()
    with use_broker(_closed_port_broker()):
        call_command("demo", stdout=out, stderr=out)
    assert DOWN in out.getvalue()
    # the ordering demo after the run is set up all the same
    assert PaymentAddress.objects.filter(order=None).exists()
