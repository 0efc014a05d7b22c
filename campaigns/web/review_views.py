"""The review queue, the checkpoint page, and the manual flag, in the browser.

Thin views over campaigns/review/queue.py: the services decide and write; these pick
what a reviewer may see (items of their own projects only, the same 404 for
someone else's as for a wrong id) and show an item well enough to judge it
without opening files by hand.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.db.models import Count, QuerySet
from django.http import Http404, HttpRequest, HttpResponse, QueryDict
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import push_url

from campaigns import selectors
from campaigns.models import (
    Attempt,
    Campaign,
    Checkpoint,
    ParameterVersion,
    ReviewDecision,
    ReviewItem,
    Unit,
)
from campaigns.review import effort, holdout, previews, reasons
from campaigns.review import queue as review
from campaigns.review.flags import FlagReason, reason_label
from campaigns.runs import start
from campaigns.web.access import campaign_for_user_or_404

Item = ReviewItem.State
PANE = "review-item"
ITEMS_SHOWN = 100
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
        a reverse() and urlencode() per link would be a large share of the page's time.
        """
        url = self.url()
        return f"{url}{'&' if '?' in url else '?'}item="


def _visible_items(request: HttpRequest) -> QuerySet[ReviewItem]:
    """Items of the user's campaigns only: another project's never appear."""
    campaigns = selectors.campaigns_for_user(request.user).values("pk")
    return ReviewItem.objects.filter(campaign__in=campaigns)


def _filtered(
    request: HttpRequest,
    filters: Filters,
    *,
    state: bool = True,
    campaign_ids: list[int] | None = None,
) -> QuerySet:
    """The filter's items. campaign_ids: the campaigns it covers, when the
    caller has read them already (_shown_campaign_ids)."""
    if campaign_ids is not None:
        items = ReviewItem.objects.filter(campaign_id__in=campaign_ids)
    elif filters.campaign:
        # The campaign's id first: filtering by name joins every open item to
        # its campaign, which is slow at tens of thousands of open items
        # (bench/RESULTS.md, "Pages at scale — `bench/pages_scale.py`").
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


# What the item pane reads of an item besides its own row.
PANE_RELATED = ("campaign", "unit", "version", "attempt__version")


def _item_for_user(request: HttpRequest, pk) -> ReviewItem:
    # What every pane shows; the attempt and the reviewer load when the item
    # has them: PostgreSQL plans a seven-table join that fetches them all for
    # ten times longer than it reads.
    item = _visible_items(request).select_related(*PANE_RELATED).filter(pk=pk).first()
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

# What a row of the queue shows of an item (campaign_extras.review_rows).
QUEUE_ROW_FIELDS = ("pk", "state", "reason", "campaign__name", "unit__uid")


def _shown_campaigns(request: HttpRequest, filters: Filters) -> tuple[list[str], list[int]]:
    """The names of the user's campaigns (the filter's choices), and the ids of
    those the filter covers: one query."""
    rows = selectors.campaign_names_for_user(user=request.user)
    names, ids = [], []
    for pk, name in rows:
        names.append(name)
        if not filters.campaign or name == filters.campaign:
            ids.append(pk)
    return names, ids


def _reason_counts(filters: Filters, campaign_ids: list[int], items: QuerySet) -> dict[str, int]:
    """The filter's items (reason aside) per reason: from the trigger-kept
    counters, which key campaign, state and reason; counted over the items
    when a category or checkpoint narrows them."""
    if filters.category or filters.checkpoint:
        return review.reason_counts(items=items)
    state = None if filters.state == "all" else filters.state
    return review.reason_counts_kept(campaign_ids=campaign_ids, state=state)


@login_required
# The same URL answers the page or, to htmx, the pane alone: a browser's cache
# must not serve one for the other (Back after the pane loaded).
@vary_on_headers("HX-Request")
def review_queue(request: HttpRequest) -> HttpResponse:
    filters = Filters.parse(request.GET)
    names, shown = _shown_campaigns(request, filters)
    without_reason = _filtered(request, filters, campaign_ids=shown)
    items = without_reason.filter(reason=filters.reason) if filters.reason else without_reason
    items = items.order_by("pk")
    pane_wanted = request.htmx and request.htmx.target == PANE
    # The row's cells only, as tuples: model instances are dear to build.
    rows = [] if pane_wanted else list(items.values_list(*QUEUE_ROW_FIELDS)[:ITEMS_SHOWN])
    if not pane_wanted and "item" not in request.GET and "undo" not in request.GET:
        # The queue's own page: the first item's pane loads after it.
        pane = _deferred_pane(request, filters, rows)
    else:
        current: ReviewItem | None
        if request.GET.get("item", "").isdigit():
            current = _item_for_user(request, request.GET["item"])
        else:
            # Of the user's campaigns already: loaded as _item_for_user loads an item.
            current = items.select_related(*PANE_RELATED).first()
        undo = _undo_item(request, request.GET.get("undo", ""))
        pane = _pane_context(request, filters, current, undo=undo, campaign_ids=shown)
        pane["marked"] = current
        if pane_wanted:
            return render(request, f"campaigns/review_queue.html#{PANE}", pane)

    # Every category of the campaigns shown, so that choosing one does not hide
    # the rest: from the units' category index, not by joining every item.
    categories = selectors.unit_categories(campaign_ids=shown)
    counts = _reason_counts(filters, shown, without_reason)
    # The reason counts cover the same items: no second count over them.
    total = counts.get(filters.reason, 0) if filters.reason else sum(counts.values())
    context = {
        **pane,
        "rows": rows,
        "total": total,
        "shown": min(total, ITEMS_SHOWN),
        "campaigns": names,
        "categories": list(categories),
        "states": STATE_CHOICES,
        "reasons": [
            (reason, reason_label(reason), n, replace(filters, reason=reason).url())
            for reason, n in counts.items()
        ],
        "reasons_total": sum(counts.values()),
        "all_reasons_url": replace(filters, reason="").url(),
    }
    return render(request, "campaigns/review_queue.html", context)


def _deferred_pane(request: HttpRequest, filters: Filters, rows: list[tuple]) -> dict:
    """The pane of the queue's page before its item is drawn: the first row's
    item, loaded by htmx once the page is shown (its previews, history and
    neighbours are most of the page's work), behind a link that opens it
    without JavaScript. No rows: the empty pane, drawn at once."""
    context = _pane_context(request, filters, None)
    if rows:
        pk, uid = rows[0][0], rows[0][4]
        context.update(
            pane_url=f"{filters.item_prefix}{pk}", pane_uid=uid, marked=ReviewItem(pk=pk)
        )
    return context


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
    reject_reason = request.POST.get("reject_reason", "")
    try:
        review.review_decide(
            item=item,
            decision=decision,
            user=request.user,
            note=note,
            reject_reason=reject_reason,
            shown_at=effort.shown_at(request.POST.get("shown", ""), item.pk),
        )
    except ValidationError as exc:
        # Nothing changed: show the same item again with the reason.
        error = "; ".join(exc.messages)
        if request.htmx:
            pane = _pane_context(
                request, filters, item, error=error, note=note, reject_reason=reject_reason
            )
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
    notice = f"{verb} {unit.uid} ({reason_label(item.reason)}): the unit is now {state}"
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
    reject_reason: str = "",
    campaign_ids: list[int] | None = None,
) -> dict:
    """What the item pane shows; campaign_ids: the filter's campaigns, when
    the caller has read them (_shown_campaigns)."""
    context = {
        "filters": filters,
        "filter_fields": filters.params(),
        "item": item,
        "undo": undo,
        "notice": notice,
        "error": error,
        "note": note,
        "reject_reason": reject_reason,
        "queue_url": filters.url(),
    }
    if item is None:
        return context
    # The decision's time runs from this render (campaigns/review/effort.py).
    context["shown_token"] = effort.shown_token(item.pk)
    context["reject_reasons"] = reasons.reject_reasons(item.campaign)
    in_filter = _filtered(request, filters, campaign_ids=campaign_ids)
    if filters.reason:
        in_filter = in_filter.filter(reason=filters.reason)
    in_filter = in_filter.order_by("pk")
    previous = in_filter.filter(pk__lt=item.pk).order_by("-pk").first()
    following = in_filter.filter(pk__gt=item.pk).first()
    unit = item.unit
    judged = _judged_attempt(item)
    context.update(
        {
            "unit": unit,
            "campaign": item.campaign,
            "reason_label": reason_label(item.reason),
            "previous_url": filters.url(item=previous.pk) if previous else "",
            "next_url": filters.url(item=following.pk) if following else "",
            "input": previews.input_preview(
                unit=unit, campaign=item.campaign, params=item.version.params
            ),
            "output": previews.output_summary(
                unit=unit,
                attempt=judged,
                campaign=item.campaign,
                # The version that made the output shown (a spot check's may be another's).
                params=judged.version.params if judged is not None else item.version.params,
                twins=_duplicates_named(item),
            ),
            "history": ReviewDecision.objects.filter(item__unit=unit)
            .select_related("item", "reviewer")
            .order_by("created_at", "pk"),
            "other_items": ReviewItem.objects.filter(unit=unit).exclude(pk=item.pk).order_by("pk"),
        }
    )
    return context


def _judged_attempt(item: ReviewItem) -> Attempt | None:
    """The try whose output the item judges: its own, else the unit's last success."""
    if item.attempt_id:
        return item.attempt
    return (
        Attempt.objects.filter(unit=item.unit, outcome=Attempt.Outcome.SUCCEEDED)
        .select_related("version")
        .order_by("-finished_at", "-pk")
        .first()
    )


def _duplicates_named(item: ReviewItem) -> list[str]:
    """The unit ids a duplicate_vector flag's detail names."""
    prefix = "same vector as "
    if item.reason != FlagReason.DUPLICATE_VECTOR or not item.detail.startswith(prefix):
        return []
    return [uid.strip() for uid in item.detail.removeprefix(prefix).split(",")]


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
        # The effort of this checkpoint's version: its spot check and its flags.
        "effort": effort.review_effort(campaign=campaign, version=checkpoint.version),
        "effort_version": checkpoint.version,
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
        with start.broker_outage_noted() as outage:
            batches, more = start.campaign_start(campaign=checkpoint.campaign)
    except ValidationError as exc:
        messages.error(
            request, f"Checkpoint passed, but the run did not continue: {'; '.join(exc.messages)}"
        )
    else:
        if outage:
            messages.warning(request, start.broker_outage_reason(outage))
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
    campaign = campaign_for_user_or_404(request, name)
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
