"""The review queue, the checkpoint page and the verification status, as a reviewer sees them."""

from __future__ import annotations

import base64
import io
import re
from unittest import mock

import numpy as np
import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from PIL import Image

from campaigns.models import (
    Attempt,
    Campaign,
    Checkpoint,
    ErrorClass,
    ReviewDecision,
    ReviewItem,
    Unit,
    UnitState,
)
from campaigns.review import queue as review
from campaigns.runs import setup, start
from tests.images import write_image_corpus
from tests.vectors import unit_vector

QUEUE = "/review/"
PANE = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "review-item"}
Item = ReviewItem.State


def _unit(campaign: Campaign, uid: str) -> Unit:
    return Unit.objects.get(campaign=campaign, uid=uid)


def _queue(client, query: dict) -> str:
    """The queue's page as a browser shows it: the list, then the item pane
    its placeholder loads (htmx, hx-trigger="load")."""
    page = client.get(QUEUE, query).content.decode()
    found = re.search(r'<section id="review-item" class="pane" [^>]*hx-get="([^"]+)"', page)
    if found is None:
        return page
    pane = client.get(found.group(1).replace("&amp;", "&"), **PANE).content.decode()
    return page + pane


def _decide(client, item: ReviewItem, decision: str, note: str = "", **extra):
    return client.post(
        reverse("review_decide", args=[item.pk]), {"decision": decision, "note": note, **extra}
    )


@pytest.fixture
def texts(make_campaign, run_here, output_root) -> Campaign:
    """The demo texts embedded, without a checkpoint (tests of the checkpoint set their own)."""
    campaign = make_campaign("texts")
    Campaign.objects.filter(pk=campaign.pk).update(checkpoint_after=0)
    campaign.refresh_from_db()
    run_here(campaign)
    return campaign


@pytest.fixture
def flagged(texts, owner) -> list[ReviewItem]:
    """Three succeeded units flagged by hand: in needs_review, each with an open item."""
    uids = ["news/solar-farm.txt", "recipes/bread.txt", "reviews/headphones.txt"]
    return [
        review.unit_flag(unit=_unit(texts, uid), user=owner, note=f"check {uid}") for uid in uids
    ]


@pytest.fixture
def pending_items(make_campaign, owner) -> list[ReviewItem]:
    """Items on units that never ran: enough for access rules, no model needed."""
    campaign = make_campaign("texts")
    return [
        ReviewItem.objects.create(
            campaign=campaign,
            unit=_unit(campaign, uid),
            version=campaign.current_version,
            reason="manual",
            detail="flagged for the test",
        )
        for uid in ("news/solar-farm.txt", "recipes/bread.txt")
    ]


# --- who sees what ---------------------------------------------------------------


def test_anonymous_visitors_are_sent_to_log_in(client, pending_items):
    item = pending_items[0]
    for response in (
        client.get(QUEUE),
        _decide(client, item, "accepted"),
        client.post(reverse("review_unit_flag", args=[item.unit_id]), {"note": "x"}),
    ):
        assert response.status_code == 302
        assert response.url.startswith(reverse("login"))
    assert ReviewItem.objects.get(pk=item.pk).state == Item.OPEN


def test_an_outsider_sees_none_of_another_projects_items_and_gets_not_found(
    client, outsider, pending_items
):
    item = pending_items[0]
    client.force_login(outsider)
    for query in ({}, {"campaign": "texts"}, {"state": "all"}):
        html = client.get(QUEUE, query).content.decode()
        assert "news/solar-farm.txt" not in html and "recipes/bread.txt" not in html
        assert "Nothing left to review" in html
    assert client.get(QUEUE, {"item": item.pk}).status_code == 404
    assert _decide(client, item, "rejected", "mine now").status_code == 404
    flag = client.post(reverse("review_unit_flag", args=[item.unit_id]), {"note": "x"})
    assert flag.status_code == 404
    assert ReviewItem.objects.get(pk=item.pk).state == Item.OPEN
    assert ReviewItem.objects.count() == 2


def test_decisions_need_the_csrf_token(owner, pending_items):
    item = pending_items[0]
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)
    assert _decide(client, item, "accepted").status_code == 403
    assert ReviewItem.objects.get(pk=item.pk).state == Item.OPEN
    assert not ReviewDecision.objects.exists()


# --- deciding --------------------------------------------------------------------


def test_a_rejection_without_a_reason_shows_why_and_changes_nothing(client, owner, flagged):
    item = flagged[0]
    client.force_login(owner)
    response = _decide(client, item, "rejected", "   ")
    assert response.status_code == 302
    assert f"item={item.pk}" in response.url  # back to the same item
    page = client.get(response.url).content.decode()
    assert "a rejection needs a reason" in page
    item.refresh_from_db()
    assert item.state == Item.OPEN
    assert item.unit.state == UnitState.NEEDS_REVIEW
    assert item.decisions.count() == 1  # the flag's own entry only


def test_a_tampered_decision_changes_nothing(client, owner, flagged):
    item = flagged[0]
    client.force_login(owner)
    response = _decide(client, item, "deleted", "bye")
    page = client.get(response.url).content.decode()
    assert "unknown decision" in page
    item.refresh_from_db()
    assert item.state == Item.OPEN
    assert item.unit.state == UnitState.NEEDS_REVIEW
    assert item.decisions.count() == 1


def test_accept_reject_and_requeue_move_the_unit_and_a_later_decision_undoes_an_earlier_one(
    client, owner, flagged
):
    accepted, rejected, requeued = flagged
    client.force_login(owner)
    _decide(client, accepted, "accepted")
    _decide(client, rejected, "rejected", "the text is a table of numbers")
    _decide(client, requeued, "requeued")

    unit = Unit.objects.get(pk=accepted.unit_id)
    assert unit.state == UnitState.SUCCEEDED
    unit = Unit.objects.get(pk=rejected.unit_id)
    assert (unit.state, unit.error_class) == (UnitState.FAILED, ErrorClass.REJECTED_BY_REVIEW)
    assert "the text is a table of numbers" in unit.error_message
    assert Unit.objects.get(pk=requeued.unit_id).state == UnitState.PENDING

    # second thoughts on the rejection: reopen, then accept
    _decide(client, rejected, "open")
    assert Unit.objects.get(pk=rejected.unit_id).state == UnitState.NEEDS_REVIEW
    _decide(client, rejected, "accepted", "fine after all")
    unit = Unit.objects.get(pk=rejected.unit_id)
    assert (unit.state, unit.error_class) == (UnitState.SUCCEEDED, "")
    steps = list(rejected.decisions.values_list("from_state", "to_state"))
    assert steps == [
        ("open", "open"),  # the manual flag
        ("open", "rejected"),
        ("rejected", "open"),
        ("open", "accepted"),
    ]
    page = client.get(QUEUE, {"item": rejected.pk, "state": "all"}).content.decode()
    assert "the text is a table of numbers" in page and "fine after all" in page
    assert "rejected → open" in page
    # the pane names who decided (the reviewer loads with the decided item only)
    decision = re.search(r'data-item-state="accepted">([^<]*)<', page).group(1)
    assert decision.startswith(f"accepted by {owner.get_username()}, ")
    assert decision.endswith(": fine after all")


def test_after_a_decision_the_next_open_item_of_the_filter_is_shown_with_an_undo(
    client, owner, flagged
):
    first, second, _third = flagged
    client.force_login(owner)
    response = _decide(client, first, "accepted", campaign="texts")
    assert response.status_code == 302
    assert f"item={second.pk}" in response.url and f"undo={first.pk}" in response.url
    page = client.get(response.url).content.decode()
    assert f'data-item="{second.pk}"' in page
    assert "Accepted news/solar-farm.txt" in page
    assert "Undo: reopen news/solar-farm.txt" in page
    # the list shows the filter's open items only
    assert f'id="row-{first.pk}"' not in page and f'id="row-{second.pk}"' in page


def test_after_a_rejection_the_units_other_flags_wait_and_the_next_unit_is_shown(
    client, owner, flagged
):
    first, second, _third = flagged
    sibling = ReviewItem.objects.create(
        campaign=first.campaign, unit=first.unit, version=first.version, reason="truncated"
    )
    client.force_login(owner)
    response = _decide(client, first, "rejected", "wrong language", campaign="texts")
    assert f"item={second.pk}" in response.url
    # the sibling is still open: after the last unit it comes round again
    assert ReviewItem.objects.get(pk=sibling.pk).state == Item.OPEN
    assert "Other flags on this unit" in client.get(QUEUE, {"item": first.pk}).content.decode()


def test_htmx_swaps_only_the_item_pane(client, owner, flagged):
    first, second, _third = flagged
    client.force_login(owner)
    response = client.get(QUEUE, {"campaign": "texts", "item": second.pk}, **PANE)
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="review-item"')
    assert "<html" not in html and 'id="review-list"' not in html
    assert "recipes/bread.txt" in html

    response = client.post(
        reverse("review_decide", args=[first.pk]),
        {"decision": "accepted", "campaign": "texts"},
        **PANE,
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="review-item"')
    assert f'data-item="{second.pk}"' in html  # the next open item
    assert "Accepted news/solar-farm.txt" in html
    assert f'<tr id="row-{first.pk}" data-state="accepted" hx-swap-oob="true"' in html
    assert "<html" not in html
    assert f"item={second.pk}" in response["HX-Push-Url"]


def test_the_queue_page_loads_its_first_item_after_the_list_and_links_it_without_javascript(
    client, owner, flagged
):
    first, second, _third = flagged
    client.force_login(owner)
    page = client.get(QUEUE, {"campaign": "texts"}).content.decode()
    # The list and the filter's forms are drawn; the first item's pane is not,
    # only a placeholder that loads it, and a plain link to it.
    assert f'id="row-{first.pk}" data-state="open" aria-current="true"' in page
    assert f'id="row-{second.pk}"' in page
    assert 'id="decide-form"' not in page and "check news/solar-farm.txt" not in page
    url = f"{QUEUE}?campaign=texts&amp;item={first.pk}"
    assert f'data-item="{first.pk}" aria-busy="true" hx-get="{url}" hx-trigger="load"' in page
    assert f'<a href="{url}">news/solar-farm.txt</a>' in page
    # The bulk accept keeps the filter.
    bulk = page[page.index('id="bulk-accept"') :]
    assert '<input type="hidden" name="campaign" value="texts">' in bulk[: bulk.index("</form>")]

    # What the placeholder loads: the pane, with the decision form.
    pane = client.get(url.replace("&amp;", "&"), **PANE).content.decode()
    assert pane.lstrip().startswith(
        f'<section id="review-item" class="pane" data-item="{first.pk}"'
    )
    assert 'id="decide-form"' in pane and "check news/solar-farm.txt" in pane
    # Without JavaScript the link opens the whole page with the pane in it.
    full = client.get(url.replace("&amp;", "&")).content.decode()
    assert 'id="decide-form"' in full and 'id="review-list"' in full


def test_bulk_accept_accepts_exactly_the_open_items_of_the_filter(
    client, owner, flagged, make_campaign
):
    texts = flagged[0].campaign
    truncated = ReviewItem.objects.create(
        campaign=texts,
        unit=_unit(texts, "long/annual-report.txt"),
        version=texts.current_version,
        reason="truncated",
    )
    other = make_campaign("other")
    elsewhere = review.unit_flag(unit=_unit(other, "news/solar-farm.txt"), user=owner, note="x")
    decided = flagged[2]
    review.review_decide(item=decided, decision="rejected", user=owner, note="bad")
    client.force_login(owner)

    refused = client.post(reverse("review_bulk_accept"), {"reason": "manual"}, follow=True)
    assert "needs a campaign filter" in refused.content.decode()
    assert ReviewItem.objects.filter(state=Item.ACCEPTED).count() == 0

    response = client.post(
        reverse("review_bulk_accept"), {"campaign": "texts", "reason": "manual"}, follow=True
    )
    assert "Accepted 2 open items." in response.content.decode()
    assert set(ReviewItem.objects.filter(state=Item.ACCEPTED)) == {flagged[0], flagged[1]}
    assert ReviewItem.objects.get(pk=truncated.pk).state == Item.OPEN
    assert ReviewItem.objects.get(pk=elsewhere.pk).state == Item.OPEN
    assert ReviewItem.objects.get(pk=decided.pk).state == Item.REJECTED
    assert {u.state for u in Unit.objects.filter(review_items__in=flagged[:2])} == {
        UnitState.SUCCEEDED
    }


def test_the_manual_flag_puts_a_succeeded_unit_in_needs_review(client, owner, texts):
    unit = _unit(texts, "docs/backup-policy.txt")
    assert unit.state == UnitState.SUCCEEDED
    client.force_login(owner)
    page = client.get(reverse("unit_detail", args=[texts.name, unit.pk])).content.decode()
    assert "Flag for review" in page

    empty = client.post(reverse("review_unit_flag", args=[unit.pk]), {"note": " "}, follow=True)
    assert "say why this unit should be reviewed" in empty.content.decode()
    assert not ReviewItem.objects.filter(unit=unit).exists()

    response = client.post(
        reverse("review_unit_flag", args=[unit.pk]), {"note": "mentions a customer"}, follow=True
    )
    assert "Flagged docs/backup-policy.txt for review" in response.content.decode()
    unit.refresh_from_db()
    assert unit.state == UnitState.NEEDS_REVIEW
    item = ReviewItem.objects.get(unit=unit)
    assert (item.state, item.reason, item.detail) == (Item.OPEN, "manual", "mentions a customer")
    queue = _queue(client, {"campaign": texts.name})
    assert "docs/backup-policy.txt" in queue and "mentions a customer" in queue


# --- what the pane shows ---------------------------------------------------------


def test_the_pane_shows_the_text_excerpt_the_vector_norm_and_the_flag(
    client, owner, flagged, corpus
):
    item = flagged[0]
    attempt = item.unit.attempts.get()
    client.force_login(owner)
    html = client.get(QUEUE, {"item": item.pk}).content.decode()
    start = (corpus / "news/solar-farm.txt").read_text(encoding="utf-8")[:40]
    assert start.split()[0] in html
    assert f"<dd data-norm>{attempt.metrics['norm']}</dd>" in html
    assert "flagged by hand" in html and "check news/solar-farm.txt" in html


def test_a_duplicate_vector_flag_names_its_twin_with_a_link(client, owner, texts):
    twin = _unit(texts, "news/rail-strike.txt")
    item = ReviewItem.objects.create(
        campaign=texts,
        unit=_unit(texts, "news/solar-farm.txt"),
        version=texts.current_version,
        reason="duplicate_vector",
        detail="same vector as news/rail-strike.txt",
    )
    client.force_login(owner)
    html = client.get(QUEUE, {"item": item.pk}).content.decode()
    assert "same vector as a different input" in html
    assert reverse("unit_detail", args=[texts.name, twin.pk]) in html


def test_images_are_shown_as_small_thumbnails_never_as_the_file_and_classification_scores(
    client, owner, project, tmp_path, output_root
):
    root = tmp_path / "images"
    write_image_corpus(root)
    campaign, _ = setup.campaign_create(
        name="pictures",
        processor="image-transform",
        project=project,
        input_folder=root,
        params={"max_pixels": 10_000_000},
    )
    # the preview decodes with the version's own limits: the bomb stays undecoded
    ok, bomb = _unit(campaign, "ok/rgb.jpg"), _unit(campaign, "bad/bomb.png")
    rel = "pictures/v1/ok-rgb.npz"
    (output_root / rel).parent.mkdir(parents=True)
    np.savez(
        output_root / rel,
        top_labels=np.array(["red", "green"]),
        top_probs=np.array([0.55, 0.45], dtype=np.float32),
        margin=np.float32(0.1),
    )
    Unit.objects.filter(pk=ok.pk).update(output_path=rel)
    items = [
        ReviewItem.objects.create(
            campaign=campaign, unit=unit, version=campaign.current_version, reason="manual"
        )
        for unit in (ok, bomb)
    ]
    client.force_login(owner)
    html = client.get(QUEUE, {"item": items[0].pk}).content.decode()
    assert 'id="input-thumbnail"' in html and 'src="data:image/png;base64,' in html
    assert str(root) not in html  # no path, no link to the file: only the thumbnail's pixels
    assert "<td>red</td><td>0.550</td>" in html and "<td>green</td><td>0.450</td>" in html
    assert "<strong data-margin>0.100</strong>" in html

    html = client.get(QUEUE, {"item": items[1].pk}).content.decode()
    assert "Cannot show the input: input_invalid: image too large" in html
    assert "data:image/png" not in html


def test_a_thumbnail_is_at_most_256_pixels(client, owner, project, tmp_path, output_root):
    root = tmp_path / "big"
    root.mkdir()
    Image.new("RGB", (1200, 600), (10, 120, 200)).save(root / "wide.png")
    campaign, _ = setup.campaign_create(
        name="big", processor="image-transform", project=project, input_folder=root
    )
    item = ReviewItem.objects.create(
        campaign=campaign,
        unit=_unit(campaign, "wide.png"),
        version=campaign.current_version,
        reason="manual",
    )
    client.force_login(owner)
    html = client.get(QUEUE, {"item": item.pk}).content.decode()
    encoded = html.split('src="data:image/png;base64,')[1].split('"')[0]
    with Image.open(io.BytesIO(base64.b64decode(encoded))) as thumb:
        assert thumb.size == (256, 128)


# --- the checkpoint --------------------------------------------------------------


@pytest.fixture
def at_checkpoint(make_campaign, run_here, output_root) -> Campaign:
    """Ten units processed (the four bad inputs among them), then the campaign waits."""
    campaign = make_campaign("texts")
    Campaign.objects.filter(pk=campaign.pk).update(checkpoint_after=10)
    campaign.refresh_from_db()
    run_here(campaign)
    assert Checkpoint.objects.filter(campaign=campaign, state="pending").exists()
    return campaign


def test_passing_the_checkpoint_continues_the_run(client, owner, at_checkpoint):
    checkpoint = Checkpoint.objects.get(campaign=at_checkpoint)
    client.force_login(owner)
    page = client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).content.decode()
    sample = checkpoint.items.order_by("pk")
    assert sample.count() == len(checkpoint.sample) > 0
    link = f"/review/?state=all&amp;checkpoint={checkpoint.pk}&amp;item={sample[0].pk}"
    assert link in page
    assert "Holdout" in page

    queue = client.get(QUEUE, {"checkpoint": checkpoint.pk}).content.decode()
    assert queue.count('<tr id="row-') == sample.count()

    pending = at_checkpoint.units.filter(state=UnitState.PENDING).count()
    with mock.patch.object(start.celery_app, "send_task"):
        response = client.post(
            reverse("checkpoint_decide", args=[checkpoint.pk]), {"verdict": "pass"}, follow=True
        )
    html = response.content.decode()
    assert "Checkpoint passed: the campaign continues" in html and "queued" in html
    checkpoint.refresh_from_db()
    assert (checkpoint.state, checkpoint.decided_by) == (Checkpoint.State.PASSED, owner)
    assert at_checkpoint.units.filter(state=UnitState.QUEUED).count() == pending > 0
    assert at_checkpoint.units.filter(state=UnitState.PENDING).count() == 0


def test_failing_the_checkpoint_needs_a_reason(client, owner, at_checkpoint):
    checkpoint = Checkpoint.objects.get(campaign=at_checkpoint)
    url = reverse("checkpoint_decide", args=[checkpoint.pk])
    client.force_login(owner)
    response = client.post(url, {"verdict": "fail", "reason": ""}, follow=True)
    assert "failing a checkpoint needs a reason" in response.content.decode()
    checkpoint.refresh_from_db()
    assert checkpoint.state == Checkpoint.State.PENDING

    response = client.post(url, {"verdict": "fail", "reason": "vectors of code are noise"})
    checkpoint.refresh_from_db()
    assert checkpoint.state == Checkpoint.State.FAILED
    page = client.get(response.url).content.decode()
    assert "Checkpoint failed" in page and "vectors of code are noise" in page
    assert "Pass: continue" not in page


def test_an_outsider_gets_not_found_for_a_checkpoint(client, outsider, at_checkpoint):
    checkpoint = Checkpoint.objects.get(campaign=at_checkpoint)
    client.force_login(outsider)
    assert client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).status_code == 404
    response = client.post(reverse("checkpoint_decide", args=[checkpoint.pk]), {"verdict": "pass"})
    assert response.status_code == 404
    checkpoint.refresh_from_db()
    assert checkpoint.state == Checkpoint.State.PENDING
    assert client.get(reverse("review_holdout", args=[at_checkpoint.name])).status_code == 404


# --- the campaign pages ----------------------------------------------------------


def test_the_campaign_page_and_list_show_the_verification_status(
    client, owner, at_checkpoint, make_campaign
):
    fresh = make_campaign("fresh")
    checkpoint = Checkpoint.objects.get(campaign=at_checkpoint)
    client.force_login(owner)
    detail = reverse("campaign_detail", args=[at_checkpoint.name])

    page = client.get(detail).content.decode()
    assert 'data-verification="checkpoint pending"' in page
    assert reverse("checkpoint_detail", args=[checkpoint.pk]) in page
    open_items = ReviewItem.objects.filter(campaign=at_checkpoint, state=Item.OPEN).count()
    assert open_items > 0
    assert f'href="/review/?campaign=texts" id="open-review-items">{open_items} open' in page
    assert reverse("review_holdout", args=[at_checkpoint.name]) in page

    listing = client.get(reverse("campaign_list")).content.decode()
    assert '<td data-verification="checkpoint pending">' in listing
    assert '<td data-verification="not verified">' in listing  # fresh
    assert (
        'data-verification="not verified"'
        in client.get(reverse("campaign_detail", args=[fresh.name])).content.decode()
    )

    review.checkpoint_decide(checkpoint=checkpoint, passed=False, user=owner, reason="too noisy")
    page = client.get(detail).content.decode()
    assert 'data-verification="failed"' in page
    assert "by owner" in page and "Reason: too noisy" in page
    assert (
        '<td data-verification="failed">' in client.get(reverse("campaign_list")).content.decode()
    )


def test_the_holdout_report_loads_as_a_fragment_of_the_campaign_page(client, owner, at_checkpoint):
    client.force_login(owner)
    response = client.get(
        reverse("review_holdout", args=[at_checkpoint.name]),
        HTTP_HX_REQUEST="true",
        HTTP_HX_TARGET="holdout",
    )
    html = response.content.decode()
    assert html.lstrip().startswith('<section id="holdout">')
    assert "held out" in html and "<html" not in html


def test_the_nav_links_to_the_review_queue(client, owner, project):
    client.force_login(owner)
    assert '<a href="/review/">Review</a>' in client.get(QUEUE).content.decode()


def test_the_campaign_list_says_who_decided_and_when(client, owner, at_checkpoint):
    checkpoint = Checkpoint.objects.get(campaign=at_checkpoint)
    client.force_login(owner)
    listing = client.get(reverse("campaign_list")).content.decode()
    opened = timezone.localtime(checkpoint.created_at).strftime("%Y-%m-%d %H:%M")
    assert f'checkpoint pending<br><small class="meta">since {opened}</small>' in listing

    review.checkpoint_decide(checkpoint=checkpoint, passed=True, user=owner)
    checkpoint.refresh_from_db()
    listing = client.get(reverse("campaign_list")).content.decode()
    decided = timezone.localtime(checkpoint.decided_at).strftime("%Y-%m-%d %H:%M")
    assert (
        '<td data-verification="passed">passed<br><small class="meta" data-verified-by>'
        f"by owner, {decided}</small></td>"
    ) in listing

    # failed by the flag rules: said so, with the time
    Checkpoint.objects.filter(pk=checkpoint.pk).update(state="failed", decided_by=None)
    listing = client.get(reverse("campaign_list")).content.decode()
    assert (
        '<td data-verification="failed">failed<br><small class="meta" data-verified-by>'
        f"by flag rules, {decided}</small></td>"
    ) in listing


def _reason_count(html: str, reason: str) -> int | None:
    found = re.search(rf'data-reason="{reason}"[^>]*>[^<]*<span class="count">(\d+)</span>', html)
    return int(found.group(1)) if found else None


def test_the_queue_filters_by_category_and_state_and_counts_each_reason(client, owner, texts):
    # given: open items in two categories and two reasons, and one decided item
    Unit.objects.filter(campaign=texts, uid__startswith="news/").update(category="news")
    Unit.objects.filter(campaign=texts, uid__startswith="recipes/").update(category="recipes")

    def item(uid: str, reason: str) -> ReviewItem:
        return ReviewItem.objects.create(
            campaign=texts, unit=_unit(texts, uid), version=texts.current_version, reason=reason
        )

    solar = item("news/solar-farm.txt", "manual")
    rail = item("news/rail-strike.txt", "truncated")
    bread = item("recipes/bread.txt", "manual")
    pancakes = item("recipes/pancakes.txt", "truncated")
    review.review_decide(item=pancakes, decision="accepted", user=owner)
    client.force_login(owner)

    html = client.get(QUEUE, {"campaign": "texts"}).content.decode()
    assert (_reason_count(html, "manual"), _reason_count(html, "truncated")) == (2, 1)
    assert "<h2>3 items open</h2>" in html
    for shown in (solar, rail, bread):
        assert f'id="row-{shown.pk}"' in html
    assert f'id="row-{pancakes.pk}"' not in html  # decided: not in the open queue

    html = client.get(QUEUE, {"campaign": "texts", "category": "news"}).content.decode()
    assert (_reason_count(html, "manual"), _reason_count(html, "truncated")) == (1, 1)
    assert f'id="row-{solar.pk}"' in html and f'id="row-{rail.pk}"' in html
    assert f'id="row-{bread.pk}"' not in html
    assert '<option value="recipes">' in html  # the other category stays choosable

    html = client.get(QUEUE, {"campaign": "texts", "state": "accepted"}).content.decode()
    assert (_reason_count(html, "manual"), _reason_count(html, "truncated")) == (None, 1)
    assert f'id="row-{pancakes.pk}"' in html and f'id="row-{solar.pk}"' not in html

    html = client.get(QUEUE, {"campaign": "texts", "state": "all", "reason": "manual"})
    html = html.content.decode()
    assert f'id="row-{solar.pk}"' in html and f'id="row-{bread.pk}"' in html
    assert f'id="row-{rail.pk}"' not in html and f'id="row-{pancakes.pk}"' not in html
    assert _reason_count(html, "truncated") == 2  # the counts ignore the reason filter
    assert "<h2>2 items</h2>" in html  # the heading counts the reason shown


def test_an_embedding_item_shows_the_nearest_vector_of_its_batch(
    client, owner, flagged, output_root
):
    item = flagged[0]
    attempt = item.attempt
    others = Attempt.objects.filter(batch=attempt.batch, outcome="succeeded").exclude(
        unit=item.unit
    )
    own = unit_vector(output_root, attempt.output_path)
    cosines = {
        other.unit.uid: float(own @ unit_vector(output_root, other.output_path)) for other in others
    }
    nearest = max(cosines, key=cosines.get)
    client.force_login(owner)
    html = client.get(QUEUE, {"item": item.pk}).content.decode()
    section = html.split('id="nearest"')[1].split("</p>")[0]
    assert nearest in section
    assert f"<strong data-nearest-cosine>{cosines[nearest]:.4f}</strong>" in section
    assert f"(of {len(cosines)} other" in section


def test_a_transformed_image_shows_its_dimensions_and_format_beside_what_was_asked(
    client, owner, project, tmp_path, output_root, run_here
):
    root = tmp_path / "wide"
    root.mkdir()
    Image.new("RGB", (1200, 600), (10, 120, 200)).save(root / "wide.png")
    campaign, _ = setup.campaign_create(
        name="wide", processor="image-transform", project=project, input_folder=root
    )
    run_here(campaign)
    item = review.unit_flag(unit=_unit(campaign, "wide.png"), user=owner, note="look")
    client.force_login(owner)
    html = client.get(QUEUE, {"item": item.pk}).content.decode()
    assert 'id="output-thumbnail"' in html
    assert "<dd data-output-dimensions>256×128 PNG</dd>" in html
    assert "<dd data-output-asked>thumbnail within 256×256, PNG</dd>" in html


def test_the_queue_and_its_pane_are_cached_apart(client, owner, pending_items):
    # The same URL is the page or, to htmx, the pane alone: Back must not show the pane.
    client.force_login(owner)
    url = f"/review/?campaign=texts&item={pending_items[0].pk}"
    for headers in ({}, {"HX-Request": "true", "HX-Target": "review-item"}):
        response = client.get(url, headers=headers)
        assert response.status_code == 200
        assert "HX-Request" in response["Vary"]
