"""Which units the checkpoint looks at: a cross-section, not the head of the import.

Before its checkpoint a parameter version processes a first group, and the
checkpoint samples what the group made for a person to check. Both are picked
by one rule (campaigns/db/cross_section.py): round the categories, round the
input size quartiles within each, seeded by the campaign and the version so
that a run picks the same units again. A folder import gives every unit its
top folder as category (campaigns/intake/importing.py), so a corpus without a
manifest is spread over its folders too.

Identical inputs (the same sha256) cost the first group its allowance only
once every distinct input is in; the spot check never shows the same input
twice.
"""

from __future__ import annotations

from django.db.models import QuerySet

from campaigns.db.cross_section import units_cross_section
from campaigns.models import Campaign, ParameterVersion, Unit


def _seed(campaign: Campaign, version: ParameterVersion) -> str:
    return f"{campaign.pk}-{version.pk}"


def first_group(
    *,
    pending: QuerySet[Unit],
    allowance: int,
    campaign: Campaign,
    version: ParameterVersion,
) -> list[int]:
    """The ids of the `allowance` units outside the holdout that a run before
    the checkpoint sends (`pending`: the units it may run), sorted."""
    return units_cross_section(
        units=pending.filter(holdout=False),
        count=allowance,
        seed=_seed(campaign, version),
        distinct_inputs=False,
    )


def spot_check_sample(
    *, processed: QuerySet[Unit], size: int, campaign: Campaign, version: ParameterVersion
) -> list[int]:
    """The ids of up to `size` units of `processed` for the spot check, one per
    distinct input, sorted."""
    return units_cross_section(
        units=processed,
        count=size,
        seed=f"sample-{_seed(campaign, version)}",
        distinct_inputs=True,
    )
