"""The campaign a command names, for the `campaign` command and its subcommand modules."""

from __future__ import annotations

from django.core.management.base import CommandError

from campaigns.models import Campaign


def campaign_named(name: str) -> Campaign:
    """The campaign called `name`, with its current version; CommandError if none."""
    campaign = Campaign.objects.select_related("current_version").filter(name=name).first()
    if campaign is None:
        raise CommandError(f"no campaign named {name!r} (see: campaign list)")
    return campaign
