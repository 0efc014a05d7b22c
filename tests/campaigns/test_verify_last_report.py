"""The first verify moves the units it finds damaged back to pending; what it
found stays readable: a second verify (and the campaign page's report of it)
still names them, and `verify --last` prints the stored report without
checking again."""

from __future__ import annotations

import json
from io import StringIO
from unittest import mock

import pytest
from django.core.management import call_command
from django.urls import reverse

from campaigns.models import Batch, Reconciliation, Unit, UnitState
from campaigns.runs import start
from campaigns.storage.vector_shards import split_member
from campaigns.verify.reconcile import campaign_verify
from gpuworker.runner.batch import run_batch

pytestmark = pytest.mark.django_db


def _call(*args) -> str:
    out = StringIO()
    call_command("campaign", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.fixture
def damaged(make_campaign, output_root, django_capture_on_commit_callbacks):
    """A finished campaign, one batch's shard deleted and another's cut short."""
    campaign = make_campaign("checked", batch_size=8)
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
    for pk in Batch.objects.filter(campaign=campaign).values_list("pk", flat=True):
        run_batch(pk)
    shards: dict[str, list[str]] = {}
    for uid, rel in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).values_list(
        "uid", "output_path"
    ):
        shards.setdefault(split_member(rel)[0], []).append(uid)
    gone, cut = sorted(shards)[:2]
    (output_root / gone).unlink()
    (output_root / cut).write_bytes((output_root / cut).read_bytes()[:100])
    return campaign, set(shards[gone]), set(shards[cut])


def test_a_second_verify_still_names_what_the_first_found_missing_or_truncated(damaged):
    campaign, gone, cut = damaged
    first = campaign_verify(campaign=campaign)
    assert first.counts["output_missing"] == len(gone)
    assert first.counts["output_incomplete"] == len(cut)

    second = campaign_verify(campaign=campaign).as_dict()

    pending = {s["id"]: s["reason"] for s in second["samples"]["pending"]}
    assert set(pending) == gone | cut
    assert all(pending[uid].startswith("output missing at verify: ") for uid in gone)
    assert all(pending[uid].startswith("output incomplete at verify: ") for uid in cut)


def test_verify_last_prints_the_stored_report_without_checking_again(damaged):
    campaign, gone, cut = damaged
    _call("verify", campaign.name)
    states = dict(Unit.objects.filter(campaign=campaign).values_list("uid", "state"))

    table = _call("verify", campaign.name, "--last")
    data = json.loads(_call("verify", campaign.name, "--last", "--json"))

    assert Reconciliation.objects.filter(campaign=campaign).count() == 1  # nothing ran again
    assert dict(Unit.objects.filter(campaign=campaign).values_list("uid", "state")) == states
    assert "last verify at " in table and "nothing was checked now" in table
    assert "output_missing" in table and "output_incomplete" in table
    assert data["output_missing"] == len(gone) and data["output_incomplete"] == len(cut)
    assert {s["id"] for s in data["samples"]["output_missing"]} == gone
    assert data["verified_at"]


def test_verify_last_of_a_campaign_never_verified_says_so(make_campaign):
    campaign = make_campaign("fresh")
    assert _call("verify", campaign.name, "--last").strip() == (
        "fresh: never verified (campaign verify fresh checks it now)"
    )


def test_after_a_second_verify_the_page_still_names_what_the_first_found(damaged, client, owner):
    campaign, gone, cut = damaged
    campaign_verify(campaign=campaign)
    campaign_verify(campaign=campaign)
    client.force_login(owner)

    page = client.get(reverse("campaign_detail", args=[campaign.name])).content.decode()

    section = page[page.index('<section id="verify">') :]
    section = section[: section.index("</section>")]
    assert f'data-verdict="pending">{len(gone | cut)}<' in section
    assert "output missing at verify: " in section or "output incomplete at verify: " in section
