"""The review queue, the checkpoint page, and the manual flag, in the browser.

Thin views over campaigns/review.py: the services decide and write; these pick
what a reviewer may see (items of their own projects only, the same 404 for
someone else's as for a wrong id) and show an item well enough to judge it
without opening files by hand.
"""

from __future__ import annotations

import base64
import functools
import io
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urlencode

import numpy as np
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import push_url
from PIL import Image

from . import holdout, review, selectors, services
from .flags import FlagReason
from .images import MAX_ASPECT, MAX_PIXELS, decode_image
from .inputs import InputError, decode_text, read_bytes
from .models import (
    Attempt,
    Campaign,
    Checkpoint,
    ParameterVersion,
    ReviewDecision,
    ReviewItem,
    Unit,
)
from .paths import resolve_input
from .vector_shards import VectorReader, split_member

Item = ReviewItem.State
PANE = "review-item"
ITEMS_SHOWN = 100
EXCERPT_CHARS = 1500
THUMBNAIL = (256, 256)
# Read into memory for a preview at most this much: a pixel limit alone would
# still read a multi-gigabyte file before refusing it.
PREVIEW_MAX_BYTES = 64 * 1024 * 1024
IMAGE_PROCESSORS = {"image-transform", "image-classification"}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".bmp", ".tif", ".tiff"}
STATE_CHOICES = [*Item.values, "all"]


# --- which items -----------------------------------------------------------------


@dataclass(frozen=True)
class Filters:
    campaign: str = ""
    reason: str = ""
    category: str = ""
    state: str = Item.OPEN
    checkpoint: int | None = None

    @classmethod
    def parse(cls, data: QueryDict) -> Filters:
        # Unknown values narrow to nothing or fall back to the default; they never fail.
        state = data.get("state", "") or Item.OPEN
        checkpoint = data.get("checkpoint", "")
        return cls(
            campaign=data.get("campaign", "").strip(),
            reason=data.get("reason", "").strip(),
            category=data.get("category", "").strip(),
            state=state if state in STATE_CHOICES else Item.OPEN,
            checkpoint=int(checkpoint) if checkpoint.isdigit() else None,
        )

    def params(self, **extra) -> dict:
        given = {
            "campaign": self.campaign,
            "reason": self.reason,
            "category": self.category,
            "state": "" if self.state == Item.OPEN else self.state,
            "checkpoint": self.checkpoint or "",
        }
        return {k: v for k, v in {**given, **extra}.items() if v not in ("", None)}

    def url(self, **extra) -> str:
        query = urlencode(self.params(**extra))
        return f"{reverse('review_queue')}{'?' if query else ''}{query}"

    @functools.cached_property
    def item_prefix(self) -> str:
        """The queue URL of this filter up to an item's id, for links in templates.

        Computed once: each of the queue's 100 rows links to its item twice, and
        a reverse() and urlencode() per link were a fifth of the page's time.
        """
        url = self.url()
        return f"{url}{'&' if '?' in url else '?'}item="


def _visible_items(request: HttpRequest) -> QuerySet[ReviewItem]:
    """Items of the user's campaigns only: another project's never appear."""
    campaigns = selectors.campaigns_for_user(request.user).values("pk")
    return ReviewItem.objects.filter(campaign__in=campaigns)


def _filtered(request: HttpRequest, filters: Filters, *, state: bool = True) -> QuerySet:
    if filters.campaign:
        # The campaign's id first: filtering by name joined every open item to
        # its campaign (0.3-0.7 s with 30k open items, bench/RESULTS.md).
        campaign_id = (
            selectors.campaigns_for_user(request.user)
            .filter(name=filters.campaign)
            .values_list("pk", flat=True)
            .first()
        )
        items = ReviewItem.objects.filter(campaign_id=campaign_id)
    else:
        items = _visible_items(request)
    if filters.category:
        items = items.filter(unit__category=filters.category)
    if filters.checkpoint:
        items = items.filter(checkpoint_id=filters.checkpoint)
    if state and filters.state != "all":
        items = items.filter(state=filters.state)
    return items


def _item_for_user(request: HttpRequest, pk) -> ReviewItem:
    # What every pane shows; the attempt and the reviewer load when the item
    # has them. PostgreSQL spent 2.3 ms planning the seven-table join that
    # fetched them all, for 0.2 ms of reading.
    item = (
        _visible_items(request).select_related("campaign", "unit", "version").filter(pk=pk).first()
    )
    if item is None:
        raise Http404("No such review item.")
    return item


def _next_open(request: HttpRequest, filters: Filters, after: ReviewItem) -> ReviewItem | None:
    """The next open item of the filter after this one, else the first still open.

    After a rejection or a requeue the unit's fate is settled, so its other
    flags come last rather than next; after an accept they still need a look.
    """
    items = _filtered(request, filters, state=False).filter(state=Item.OPEN)
    if filters.reason:
        items = items.filter(reason=filters.reason)
    items = items.exclude(pk=after.pk).order_by("pk")
    if after.state in (Item.REJECTED, Item.REQUEUED):
        others = items.exclude(unit_id=after.unit_id)
        found = others.filter(pk__gt=after.pk).first() or others.first()
        if found is not None:
            return found
    return items.filter(pk__gt=after.pk).first() or items.first()


# --- the queue -------------------------------------------------------------------

# What the queue-row partial shows of an item.
QUEUE_ROW_FIELDS = ("state", "reason", "campaign__name", "unit__uid")


@login_required
def review_queue(request: HttpRequest) -> HttpResponse:
    filters = Filters.parse(request.GET)
    without_reason = _filtered(request, filters)
    items = without_reason.filter(reason=filters.reason) if filters.reason else without_reason
    items = items.order_by("pk")
    if request.GET.get("item", "").isdigit():
        current = _item_for_user(request, request.GET["item"])
    else:
        first = items.first()
        current = _item_for_user(request, first.pk) if first else None
    undo = _undo_item(request, request.GET.get("undo", ""))
    pane = _pane_context(request, filters, current, undo=undo)
    if request.htmx and request.htmx.target == PANE:
        return render(request, f"campaigns/review_queue.html#{PANE}", pane)

    campaigns = selectors.campaigns_for_user(request.user)
    # Every category of the campaigns shown, so that choosing one does not hide
    # the rest: from the units' category index, not by joining every item.
    shown = (
        campaigns.filter(name=filters.campaign) if filters.campaign else campaigns
    ).values_list("pk", flat=True)
    categories = selectors.unit_categories(campaign_ids=list(shown))
    counts = review.reason_counts(items=without_reason)
    # The reason counts cover the same items: no second count over them.
    total = counts.get(filters.reason, 0) if filters.reason else sum(counts.values())
    context = {
        **pane,
        # The row's four cells only: whole units and campaigns cost ~3 ms a page to build.
        "rows": items.select_related("campaign", "unit").only(*QUEUE_ROW_FIELDS)[:ITEMS_SHOWN],
        "total": total,
        "shown": min(total, ITEMS_SHOWN),
        "campaigns": campaigns.values_list("name", flat=True).order_by("name"),
        "categories": list(categories),
        "states": STATE_CHOICES,
        "reasons": [
            (reason, _reason_label(reason), n, replace(filters, reason=reason).url())
            for reason, n in counts.items()
        ],
        "reasons_total": sum(counts.values()),
        "all_reasons_url": replace(filters, reason="").url(),
    }
    return render(request, "campaigns/review_queue.html", context)


def _undo_item(request: HttpRequest, pk: str) -> ReviewItem | None:
    if not pk.isdigit():
        return None
    item = _visible_items(request).select_related("unit").filter(pk=pk).first()
    return item if item is not None and item.state != Item.OPEN else None


@login_required
@require_POST
def review_decide(request: HttpRequest, pk: int) -> HttpResponse:
    item = _item_for_user(request, pk)
    filters = Filters.parse(request.POST)
    decision = request.POST.get("decision", "")
    note = request.POST.get("note", "")
    try:
        review.review_decide(item=item, decision=decision, user=request.user, note=note)
    except ValidationError as exc:
        # Nothing changed: show the same item again with the reason.
        error = "; ".join(exc.messages)
        if request.htmx:
            pane = _pane_context(request, filters, item, error=error, note=note)
            return render(request, f"campaigns/review_queue.html#{PANE}", pane)
        messages.error(request, error)
        return redirect(filters.url(item=item.pk))

    notice = _decided_notice(item)
    # Reopening is an undo: the reviewer stays on the item just reopened.
    shown = item if decision == Item.OPEN else _next_open(request, filters, item)
    undo = item if decision != Item.OPEN else None
    target = filters.url(item=shown.pk if shown else "", undo=undo.pk if undo else "")
    if not request.htmx:
        messages.success(request, notice)
        return redirect(target)
    pane = _pane_context(request, filters, shown, undo=undo, notice=notice)
    html = render_to_string(f"campaigns/review_queue.html#{PANE}", pane, request=request)
    # The decided item's row in the list, updated in place (htmx out-of-band swap);
    # in a <template>, or the HTML parser drops a <tr> that stands outside a table.
    row = render_to_string(
        "campaigns/review_queue.html#queue-row",
        {"row": item, "filters": filters, "oob": True, "item": shown},
        request=request,
    )
    html += f"<template>{row}</template>"
    return push_url(HttpResponse(html), target)


def _decided_notice(item: ReviewItem) -> str:
    item.unit.refresh_from_db(fields=["state", "error_class"])
    unit = item.unit
    state = unit.state + (f" ({unit.error_class})" if unit.error_class else "")
    verb = {
        Item.ACCEPTED: "Accepted",
        Item.REJECTED: "Rejected",
        Item.REQUEUED: "Requeued",
        Item.OPEN: "Reopened",
    }[item.state]
    notice = f"{verb} {unit.uid} ({_reason_label(item.reason)}): the unit is now {state}"
    if item.state == Item.REQUEUED and unit.state == "pending":
        notice += f", to run under a new parameter version (not {item.version.label} again)"
    return notice + "."


@login_required
@require_POST
def review_bulk_accept(request: HttpRequest) -> HttpResponse:
    filters = Filters.parse(request.POST)
    if not filters.campaign and request.POST.get("confirm") != "1":
        messages.error(
            request,
            "Bulk accept needs a campaign filter, or the confirmation that every open item "
            "of every campaign you see should be accepted: nothing was accepted.",
        )
        return redirect(filters.url())
    items = _filtered(request, filters)
    if filters.reason:
        items = items.filter(reason=filters.reason)
    accepted = review.review_bulk_accept(
        items=items, user=request.user, note=request.POST.get("note", "")
    )
    messages.success(request, f"Accepted {accepted} open item{'s' if accepted != 1 else ''}.")
    return redirect(filters.url())


@login_required
@require_POST
def unit_flag(request: HttpRequest, unit_pk: int) -> HttpResponse:
    campaigns = selectors.campaigns_for_user(request.user).values("pk")
    unit = Unit.objects.filter(pk=unit_pk, campaign__in=campaigns).select_related("campaign")
    unit = unit.first()
    if unit is None:
        raise Http404("No such unit.")
    try:
        item = review.unit_flag(unit=unit, user=request.user, note=request.POST.get("note", ""))
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(
            request, f"Flagged {unit.uid} for review (item {item.pk} in the review queue)."
        )
    return redirect("unit_detail", name=unit.campaign.name, pk=unit.pk)


# --- the item pane ---------------------------------------------------------------


def _pane_context(
    request: HttpRequest,
    filters: Filters,
    item: ReviewItem | None,
    *,
    undo: ReviewItem | None = None,
    notice: str = "",
    error: str = "",
    note: str = "",
) -> dict:
    context = {
        "filters": filters,
        "filter_fields": filters.params(),
        "item": item,
        "undo": undo,
        "notice": notice,
        "error": error,
        "note": note,
        "queue_url": filters.url(),
    }
    if item is None:
        return context
    in_filter = _filtered(request, filters)
    if filters.reason:
        in_filter = in_filter.filter(reason=filters.reason)
    in_filter = in_filter.order_by("pk")
    previous = in_filter.filter(pk__lt=item.pk).order_by("-pk").first()
    following = in_filter.filter(pk__gt=item.pk).first()
    unit = item.unit
    context.update(
        {
            "unit": unit,
            "campaign": item.campaign,
            "reason_label": _reason_label(item.reason),
            "previous_url": filters.url(item=previous.pk) if previous else "",
            "next_url": filters.url(item=following.pk) if following else "",
            "input": _input_preview(item),
            "output": _output_summary(item),
            "history": ReviewDecision.objects.filter(item__unit=unit)
            .select_related("item", "reviewer")
            .order_by("created_at", "pk"),
            "other_items": ReviewItem.objects.filter(unit=unit).exclude(pk=item.pk).order_by("pk"),
        }
    )
    return context


def _reason_label(reason: str) -> str:
    return FlagReason(reason).label if reason in FlagReason.values else reason


def _read_limited(root: Path, relative: str) -> bytes:
    try:
        size = resolve_input(root, relative).stat().st_size
    except (OSError, ValueError):
        size = 0  # read_bytes says what is wrong, classified
    if size > PREVIEW_MAX_BYTES:
        raise InputError("too_large", f"{size:,} bytes: too large to preview here")
    return read_bytes(root, relative)


def _thumbnail(data: bytes, params: dict) -> str:
    """A small PNG as a data: URL: the browser never receives the original bytes."""
    image = decode_image(
        data,
        max_pixels=int(params.get("max_pixels", MAX_PIXELS)),
        max_aspect=int(params.get("max_aspect", MAX_ASPECT)),
    )
    image.thumbnail(THUMBNAIL)
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


@dataclass
class Preview:
    kind: str  # text / image / error
    text: str = ""
    cut: bool = False
    thumbnail: str = ""
    error: str = ""


def _input_preview(item: ReviewItem) -> Preview:
    unit, campaign = item.unit, item.campaign
    is_image = (
        campaign.processor in IMAGE_PROCESSORS or Path(unit.source_path).suffix in IMAGE_SUFFIXES
    )
    try:
        data = _read_limited(Path(campaign.input_root), unit.source_path)
        if is_image:
            return Preview("image", thumbnail=_thumbnail(data, item.version.params))
        text = decode_text(data)
    except InputError as exc:
        return Preview("error", error=f"{exc.error_class}: {exc.message}")
    return Preview("text", text=text[:EXCERPT_CHARS], cut=len(text) > EXCERPT_CHARS)


@dataclass
class Nearest:
    unit: Unit
    cosine: float
    compared: int


@dataclass
class OutputSummary:
    kind: str  # classification / embedding / image / none / error
    labels: list = field(default_factory=list)  # (label, probability)
    margin: float | None = None
    metrics: dict = field(default_factory=dict)
    twins: list = field(default_factory=list)  # units named by a duplicate_vector flag
    nearest: Nearest | None = None  # the closest vector of the same batch
    thumbnail: str = ""
    dimensions: str = ""  # a transformed image: width×height and format, and what was asked
    asked: str = ""
    error: str = ""


def _judged_attempt(item: ReviewItem) -> Attempt | None:
    """The try whose output the item judges: its own, else the unit's last success."""
    if item.attempt_id:
        return item.attempt
    return (
        Attempt.objects.filter(unit=item.unit, outcome=Attempt.Outcome.SUCCEEDED)
        .order_by("-finished_at", "-pk")
        .first()
    )


def _output_summary(item: ReviewItem) -> OutputSummary:
    attempt = _judged_attempt(item)
    # The output the item is about: a unit processed again since (the holdout
    # under a new version) has a new one, and an output its check refused has none.
    rel = attempt.output_path if attempt is not None else item.unit.output_path
    if not rel:
        if attempt is not None and attempt.outcome == Attempt.Outcome.FAILED:
            return OutputSummary("error", error=attempt.error_message)
        return OutputSummary("none")
    file_rel, row = split_member(rel)
    if row is not None:
        return _embedding_summary(item, attempt)  # a row of a batch's vector shard
    suffix = Path(file_rel).suffix
    root = Path(settings.OUTPUT_ROOT)
    try:
        if suffix == ".npz":
            return _classification_summary(_read_limited(root, rel))
        if suffix in IMAGE_SUFFIXES:
            return _image_summary(item, _read_limited(root, rel))
    except InputError as exc:
        return OutputSummary("error", error=f"{exc.error_class}: {exc.message}")
    if suffix == ".npy":
        return _embedding_summary(item, attempt)
    return OutputSummary("none")


def _image_summary(item: ReviewItem, data: bytes) -> OutputSummary:
    """The transformed file: a thumbnail, its dimensions and format beside what was asked."""
    try:
        with Image.open(io.BytesIO(data)) as image:  # the header only: no pixels decoded
            width, height, fmt = image.width, image.height, image.format or "?"
        thumbnail = _thumbnail(data, {})
    except (OSError, ValueError, InputError) as exc:
        return OutputSummary("error", error=f"unreadable image output: {exc}")
    params = item.version.params
    asked = ""
    if item.campaign.processor == "image-transform" and "operation" in params:
        box = f"{params.get('width')}×{params.get('height')}"
        asked = {
            "resize": f"resize to {box}",
            "thumbnail": f"thumbnail within {box}",
        }.get(params["operation"], "same size")
        asked += f", {str(params.get('format', '')).upper()}"
    return OutputSummary(
        "image", thumbnail=thumbnail, dimensions=f"{width}×{height} {fmt}", asked=asked
    )


def _classification_summary(data: bytes) -> OutputSummary:
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as out:
            labels = [str(label) for label in out["top_labels"]]
            probs = [float(p) for p in out["top_probs"]]
            ranked = list(zip(labels, probs, strict=True))
            margin = float(out["margin"])
    except (OSError, ValueError, KeyError) as exc:
        return OutputSummary("error", error=f"unreadable classification output: {exc}")
    return OutputSummary("classification", labels=ranked, margin=margin)


def _embedding_summary(item: ReviewItem, attempt: Attempt | None) -> OutputSummary:
    summary = OutputSummary("embedding", metrics=attempt.metrics if attempt else {})
    prefix = "same vector as "
    if item.reason == FlagReason.DUPLICATE_VECTOR and item.detail.startswith(prefix):
        named = [uid.strip() for uid in item.detail.removeprefix(prefix).split(",")]
        summary.twins = list(
            Unit.objects.filter(campaign=item.campaign, uid__in=named).order_by("uid")
        )
    if attempt is not None and attempt.batch_id and attempt.output_path:
        summary.nearest = _nearest_in_batch(attempt)
    return summary


# Vectors read to find an item's nearest neighbour: its batch's, at most this
# many (a few milliseconds each from a local disk; a token-budget batch can
# hold thousands of short texts).
NEAREST_MAX = 256


def _nearest_in_batch(attempt: Attempt) -> Nearest | None:
    """The most similar vector among the other outputs of the same batch.

    Cheap because bounded: a batch, not the campaign (that would need an index
    of every vector). A duplicate in another batch is found by the
    duplicate_vector rule, by hash, when the worker writes it.
    """
    reader = VectorReader(settings.OUTPUT_ROOT)
    own = holdout.unit_vector(reader, attempt.output_path)
    if own is None:
        return None
    others = (
        Attempt.objects.filter(batch_id=attempt.batch_id, outcome=Attempt.Outcome.SUCCEEDED)
        .exclude(unit_id=attempt.unit_id)
        .exclude(output_path="")
        .order_by("pk")
        .values_list("unit_id", "output_path")[:NEAREST_MAX]
    )
    best: tuple[float, int] | None = None
    compared = 0
    for unit_id, rel in others:
        vector = holdout.unit_vector(reader, rel)
        if vector is None or vector.shape != own.shape:
            continue
        compared += 1
        cosine = float(np.dot(own, vector))
        if best is None or cosine > best[0]:
            best = (cosine, unit_id)
    if best is None:
        return None
    return Nearest(unit=Unit.objects.get(pk=best[1]), cosine=best[0], compared=compared)


# --- the checkpoint --------------------------------------------------------------


def _checkpoint_for_user(request: HttpRequest, pk: int) -> Checkpoint:
    campaigns = selectors.campaigns_for_user(request.user).values("pk")
    checkpoint = (
        Checkpoint.objects.filter(pk=pk, campaign__in=campaigns)
        .select_related("campaign", "campaign__project", "version", "decided_by")
        .first()
    )
    if checkpoint is None:
        raise Http404("No such checkpoint.")
    return checkpoint


@login_required
def checkpoint_detail(request: HttpRequest, pk: int) -> HttpResponse:
    checkpoint = _checkpoint_for_user(request, pk)
    campaign = checkpoint.campaign
    items = checkpoint.items.select_related("unit", "reviewer").order_by("pk")
    context = {
        "checkpoint": checkpoint,
        "campaign": campaign,
        "items": items,
        "states": dict(items.values_list("state").annotate(n=Count("pk")).order_by()),
        "sample_url": Filters(checkpoint=checkpoint.pk, state="all").url(),
        "current": checkpoint.version_id == campaign.current_version_id,
        # The report of this checkpoint's own version, not the campaign's current one.
        **_holdout_context(campaign, checkpoint.version),
        "snapshots": [
            (moment, checkpoint.holdout_snapshots[moment])
            for moment in review.SNAPSHOT_MOMENTS
            if moment in checkpoint.holdout_snapshots
        ],
    }
    return render(request, "campaigns/checkpoint_detail.html", context)


@login_required
@require_POST
def checkpoint_decide(request: HttpRequest, pk: int) -> HttpResponse:
    checkpoint = _checkpoint_for_user(request, pk)
    verdict = request.POST.get("verdict", "")
    if verdict not in ("pass", "fail"):
        messages.error(request, "Choose pass or fail: nothing was decided.")
        return redirect("checkpoint_detail", pk=checkpoint.pk)
    try:
        review.checkpoint_decide(
            checkpoint=checkpoint,
            passed=verdict == "pass",
            user=request.user,
            reason=request.POST.get("reason", ""),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("checkpoint_detail", pk=checkpoint.pk)
    if verdict == "fail":
        messages.success(
            request,
            "Checkpoint failed: the campaign stays paused until the method changes "
            "(save changed parameters: a new parameter version).",
        )
        return redirect("checkpoint_detail", pk=checkpoint.pk)
    try:
        batches, more = services.campaign_start(campaign=checkpoint.campaign)
    except ValidationError as exc:
        messages.error(
            request, f"Checkpoint passed, but the run did not continue: {'; '.join(exc.messages)}"
        )
    else:
        messages.success(
            request,
            f"Checkpoint passed: the campaign continues, {batches} "
            f"batch{'es' if batches != 1 else ''} queued"
            f"{', the rest being planned in the background' if more else ''}.",
        )
    return redirect("checkpoint_detail", pk=checkpoint.pk)


# --- the holdout -----------------------------------------------------------------


@login_required
def holdout_panel(request: HttpRequest, name: str) -> HttpResponse:
    """The holdout report as a fragment: the campaign page loads it after the page,
    since scoring reads every processed holdout output."""
    campaign = selectors.campaign_for_user(user=request.user, name=name)
    if campaign is None:
        raise Http404("No such campaign.")
    return render(request, "campaigns/checkpoint_detail.html#holdout", _holdout_context(campaign))


def _holdout_context(campaign: Campaign, version: ParameterVersion | None = None) -> dict:
    report = holdout.holdout_report(campaign=campaign, version=version)
    confusion = report.get("confusion") or {}
    predicted = sorted({label for row in confusion.values() for label in row})
    return {
        "holdout": report,
        "confusion_labels": predicted,
        "confusion_rows": [
            (truth, [row.get(label, 0) for label in predicted]) for truth, row in confusion.items()
        ],
    }
