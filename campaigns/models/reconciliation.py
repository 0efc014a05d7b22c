"""A Reconciliation: the record of one verify run over a campaign's units."""

from __future__ import annotations

from django.db import models

from campaigns.models.campaign import Campaign


class Reconciliation(models.Model):
    """One run of verify: what the disk said about every unit, and what it fixed."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="reconciliations")
    created_at = models.DateTimeField(auto_now_add=True)
    deep = models.BooleanField(default=False)
    seconds = models.FloatField()
    # verdict -> number of units; plus orphans and stale temp files.
    counts = models.JSONField()
    # verdict -> a few unit ids with their reason, for the page and the CLI.
    samples = models.JSONField(default=dict)

    class Meta:
        ordering = ["-created_at"]
