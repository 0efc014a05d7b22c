"""Correction effort as a reviewer and a campaign owner see it: the decision
form times the decision and offers the campaign's reject reasons; the
checkpoint page, the campaign page and the export show the figures."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from campaigns.models import Campaign, Checkpoint, ReviewDecision, ReviewItem, Unit
from campaigns.review import queue as review
from tests.conftest import waiting_at_checkpoint

QUEUE = "/review/"
PANE = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "review-item"}
Item = ReviewItem.State


@pytest.fixture
def campaign(make_campaign) -> Campaign:
    return make_campaign("texts")


@pytest.fixture
def checkpoint(campaign) -> Checkpoint:
    """Waiting, its spot check of three units in two categories in the queue;
    the first group's batch ran for 50 s."""
    checkpoint = waiting_at_checkpoint(campaign)
    batch = campaign.batches.get()
    end = timezone.now() - timedelta(hours=1)
    batch.started_at, batch.finished_at = end - timedelta(seconds=50), end
    batch.save(update_fields=["started_at", "finished_at"])
    units = list(Unit.objects.filter(batch=batch, holdout=False).order_by("pk")[:3])
    for unit, category in zip(units, ("news", "news", "recipes"), strict=True):
        Unit.objects.filter(pk=unit.pk).update(category=category)
        ReviewItem.objects.create(
            campaign=campaign,
            unit=unit,
            version=checkpoint.version,
            checkpoint=checkpoint,
            source=ReviewItem.Source.SPOT_CHECK,
            reason="spot_check",
        )
    return checkpoint


def _shown(html: str) -> str:
    return re.search(r'name="shown" value="([^"]+)"', html).group(1)


def test_the_decision_form_times_the_decision_from_the_item_shown(client, owner, checkpoint):
    first, second = checkpoint.items.order_by("pk")[:2]
    client.force_login(owner)

    # given: the queue's page on the first item, its show time signed in the form
    # (the page, and the pane htmx swaps in, alike)
    page = client.get(QUEUE, {"item": first.pk}).content.decode()
    token = _shown(page)
    assert _shown(client.get(QUEUE, {"item": first.pk}, **PANE).content.decode())

    # when: the reviewer accepts it; a form whose show time was tampered with accepts the other
    client.post(
        reverse("review_decide", args=[first.pk]),
        {"decision": "accepted", "shown": token},
        **PANE,
    )
    client.post(
        reverse("review_decide", args=[second.pk]),
        {"decision": "accepted", "shown": token},  # the first item's token
        **PANE,
    )

    # then: the first decision keeps its seconds, the second none
    timed = ReviewDecision.objects.get(item=first)
    assert timed.seconds is not None and 0 <= timed.seconds < 30
    assert ReviewDecision.objects.get(item=second).seconds is None


def test_the_reject_form_offers_the_campaigns_reasons_and_records_the_one_picked(
    client, owner, campaign, checkpoint
):
    client.force_login(owner)
    # given: the owner's own list, saved from the campaign page
    saved = client.post(
        reverse("reject_reasons_edit", args=[campaign.name]),
        {"reasons": "wrong topic\nencoding garbage\n"},
        follow=True,
    )
    assert "Reject reasons saved: wrong topic, encoding garbage." in saved.content.decode()
    item = checkpoint.items.order_by("pk").first()

    # when
    pane = client.get(QUEUE, {"item": item.pk}, **PANE).content.decode()
    client.post(
        reverse("review_decide", args=[item.pk]),
        {"decision": "rejected", "reject_reason": "encoding garbage", "shown": _shown(pane)},
        **PANE,
    )

    # then: the list is in the form; the rejection counts under its reason
    assert '<option value="wrong topic">wrong topic</option>' in pane
    assert '<option value="encoding garbage">encoding garbage</option>' in pane
    item.refresh_from_db()
    assert (item.state, item.reject_reason) == (Item.REJECTED, "encoding garbage")
    assert ReviewDecision.objects.get(item=item).reject_reason == "encoding garbage"


def test_a_reason_off_the_list_is_refused_and_the_item_shown_again(client, owner, checkpoint):
    item = checkpoint.items.order_by("pk").first()
    client.force_login(owner)

    response = client.post(
        reverse("review_decide", args=[item.pk]),
        {"decision": "rejected", "reject_reason": "made up"},
        **PANE,
    )

    html = response.content.decode()
    assert "is not one of this campaign&#x27;s reject reasons" in html
    assert f'data-item="{item.pk}"' in html
    assert ReviewItem.objects.get(pk=item.pk).state == Item.OPEN


def test_the_checkpoint_page_shows_the_correction_effort(client, owner, checkpoint):
    # given: one spot check accepted after 8 s, one rejected for a listed
    # reason after 12 s, one still open
    first, second, _third = checkpoint.items.order_by("pk")
    now = timezone.now()
    review.review_decide(
        item=first, decision="accepted", user=owner, shown_at=now - timedelta(seconds=8)
    )
    review.review_decide(
        item=second,
        decision="rejected",
        user=owner,
        reject_reason="wrong result",
        shown_at=now - timedelta(seconds=12),
    )
    client.force_login(owner)

    # when
    html = client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).content.decode()

    # then
    effort = html.split('id="review-effort"')[1]
    assert '<td data-effort="decisions">2</td>' in effort
    assert re.search(r'data-effort="mean-seconds">1\d\.?\d? s<', effort)  # about 10 s
    assert re.search(r'data-effort="per-hour">3\d\d items/h<', effort)  # 2 in about 20 s
    assert '<td data-effort="backlog">1 open</td>' in effort
    assert re.search(r'data-effort="hours-to-clear">1\d s of review to clear it', effort)
    assert 'data-effort="production-per-hour">' in effort and "units/h" in effort
    reasons = effort.split('class="grid effort-reject-reasons"')[1].split("</table>")[0]
    assert "<th>wrong result</th><td>1</td><td>100%</td>" in reasons
    categories = effort.split('class="grid effort-categories"')[1].split("</table>")[0]
    assert "<th>news</th><td>2</td><td>0</td>" in categories
    assert "1 (50%)" in categories  # news: one accepted, one rejected
    assert "review_effort.json" in effort


def test_the_campaign_page_loads_the_effort_and_edits_the_reject_reasons(
    client, owner, campaign, checkpoint
):
    client.force_login(owner)
    url = reverse("review_effort", args=[campaign.name])

    page = client.get(reverse("campaign_detail", args=[campaign.name])).content.decode()
    fragment = client.get(url, HTTP_HX_REQUEST="true").content.decode()
    whole = client.get(url).content.decode()

    assert f'hx-get="{url}"' in page and f'href="{url}"' in page
    assert '<textarea name="reasons"' in page and "wrong result\npoor quality\n" in page
    assert "review_effort.json" in page and "review_decisions.csv" in page
    assert fragment.lstrip().startswith('<section id="review-effort">')
    assert "<html" not in fragment
    assert "<html" in whole and 'data-effort="decisions">0<' in whole


def test_an_outsider_gets_not_found_for_the_effort_and_the_reasons(client, outsider, campaign):
    client.force_login(outsider)
    assert client.get(reverse("review_effort", args=[campaign.name])).status_code == 404
    edit = client.post(reverse("reject_reasons_edit", args=[campaign.name]), {"reasons": "x"})
    assert edit.status_code == 404
    campaign.refresh_from_db()
    assert campaign.reject_reasons is None


def test_the_export_has_the_effort_and_every_decision(client, owner, campaign, checkpoint):
    first, second, _ = checkpoint.items.order_by("pk")
    now = timezone.now()
    review.review_decide(
        item=first, decision="accepted", user=owner, shown_at=now - timedelta(seconds=9)
    )
    review.review_decide(
        item=second, decision="rejected", user=owner, reject_reason="duplicate", note="twice"
    )
    client.force_login(owner)

    def download(name: str) -> str:
        response = client.get(reverse("campaign_export", args=[campaign.name, name]))
        assert response.status_code == 200
        return b"".join(response.streaming_content).decode()

    figures = json.loads(download("review_effort.json"))
    rows = list(csv.DictReader(io.StringIO(download("review_decisions.csv"))))

    label = checkpoint.version.label
    for scope in (figures["all_versions"], figures["versions"][label]):
        assert (scope["decisions"], scope["timed"], scope["untimed"]) == (2, 1, 1)
        assert scope["reject_reasons"] == [{"reason": "duplicate", "rejected": 1}]
        assert scope["backlog"] == 1
        assert scope["units_processed"] == 5  # the batch of the first group
    assert figures["idle_limit_seconds"] == 300
    assert [(r["to_state"], r["reject_reason"], r["note"], r["version"]) for r in rows] == [
        ("accepted", "", "", label),
        ("rejected", "duplicate", "twice", label),
    ]
    assert 8 <= float(rows[0]["seconds"]) < 30 and rows[1]["seconds"] == ""
