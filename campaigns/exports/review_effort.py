"""The review's side of the dossier: the correction effort's figures
(review_effort.json, as campaigns/review/effort.py measures them, for the
campaign and for each parameter version) and every decision taken
(review_decisions.csv, keyset-paginated: constant memory at any size)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from django.conf import settings

from campaigns.exports.csv_stream import stream_csv
from campaigns.models import Campaign, ReviewDecision
from campaigns.review import effort, reasons

_CHUNK = 5000


def review_effort_json(campaign: Campaign) -> Iterator[str]:
    document = {
        "campaign": campaign.name,
        "idle_limit_seconds": settings.REVIEW_IDLE_SECONDS,
        "reject_reasons": reasons.reject_reasons(campaign),
        "all_versions": effort.review_effort(campaign=campaign).as_dict(),
        "versions": {
            version.label: effort.review_effort(campaign=campaign, version=version).as_dict()
            for version in campaign.versions.order_by("number")
        },
    }
    yield json.dumps(document, indent=2)


_DECISION_FIELDS = (
    "created_at",
    "item_id",
    "item__unit__uid",
    "item__unit__category",
    "item__version__number",
    "item__version__fingerprint",
    "item__source",
    "item__reason",
    "from_state",
    "to_state",
    "reject_reason",
    "note",
    "reviewer__username",
    "seconds",
    "bulk",
)


def _decisions(campaign: Campaign) -> Iterator[tuple[object, ...]]:
    limit = settings.REVIEW_IDLE_SECONDS
    last = 0
    while True:
        rows = list(
            ReviewDecision.objects.filter(item__campaign=campaign, pk__gt=last)
            .order_by("pk")
            .values_list("pk", *_DECISION_FIELDS)[:_CHUNK]
        )
        if not rows:
            return
        last = rows[-1][0]
        for pk, at, item, uid, category, number, fingerprint, *rest, seconds, bulk in rows:
            idle = seconds is not None and seconds > limit
            yield (
                pk,
                at.isoformat(),
                item,
                uid,
                category,
                f"v{number}-{fingerprint[:10]}",
                *rest,
                "" if seconds is None else f"{seconds:.3f}",
                "yes" if idle else "",
                "yes" if bulk else "",
            )


def review_decisions_csv(campaign: Campaign) -> Iterator[str]:
    """Every review decision; seconds from the item shown to the decision
    (empty: not measured), idle when over REVIEW_IDLE_SECONDS (then left out
    of the effort's time)."""
    return stream_csv(
        [
            *("decision", "at", "item", "unit", "category", "version", "source", "flag_reason"),
            *("from_state", "to_state", "reject_reason", "note", "reviewer", "seconds"),
            *("idle", "bulk"),
        ],
        _decisions(campaign),
    )
