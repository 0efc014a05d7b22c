"""A Batch: the units one task runs together, its lease, and what the worker
measured while running it."""

from __future__ import annotations

from django.db import models
from django.db.models import Q

from campaigns.models.campaign import Campaign, ParameterVersion


class Batch(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="batches")
    # RESTRICT: a version that made batches cannot go on its own, only with its campaign.
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="batches")
    state = models.CharField(max_length=20, choices=State.choices, default=State.QUEUED)
    size = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True)
    # The lease: whoever holds the token owns the batch until lease_expires_at,
    # which a heartbeat pushes forward while the worker lives. A dead worker
    # stops pushing; the sweeper then puts the batch back in the queue.
    lease_token = models.CharField(max_length=32, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    deliveries = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # How the batch was formed: original / length_grouped / token_budget.
    policy = models.CharField(max_length=20, blank=True)
    # What the worker measured, as columns so pages aggregate them in SQL:
    # tokens (or pixels) the model saw, real and with padding; model time;
    # device memory after the batch (CUDA) and its peaks; process RSS on CPU.
    real_tokens = models.BigIntegerField(null=True, blank=True)
    padded_tokens = models.BigIntegerField(null=True, blank=True)
    compute_seconds = models.FloatField(null=True, blank=True)
    mem_allocated = models.BigIntegerField(null=True, blank=True)
    mem_reserved = models.BigIntegerField(null=True, blank=True)
    mem_peak_allocated = models.BigIntegerField(null=True, blank=True)
    mem_peak_reserved = models.BigIntegerField(null=True, blank=True)
    rss = models.BigIntegerField(null=True, blank=True)
    # Everything else the worker measured: runtime facts, splits, adoptions.
    metrics = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        verbose_name_plural = "batches"
        indexes = [
            # The lease sweeper: running batches whose lease expired.
            models.Index(
                fields=["lease_expires_at"],
                name="batch_running_lease",
                condition=Q(state="running"),
            ),
            # resume: queued batches of a campaign, to send their task again.
            models.Index(fields=["campaign", "state"], name="batch_campaign_state"),
            # The campaign page's memory chart: the last 200 finished batches,
            # an index read instead of sorting every batch of the campaign.
            models.Index(
                fields=["campaign", "finished_at"],
                name="batch_done_finished",
                condition=Q(state="done"),
            ),
            # The watch: a version's recent batches (its rate, its failure
            # share) without walking the other versions' ...
            models.Index(
                fields=["version", "finished_at"],
                name="batch_version_done",
                condition=Q(state="done"),
            ),
            # ... and the campaigns that finished a batch lately, whatever
            # their number (the watch sweep's "done").
            models.Index(
                fields=["finished_at"],
                name="batch_done_recent",
                condition=Q(state="done"),
            ),
        ]

    def __str__(self) -> str:
        return f"batch {self.pk} of {self.campaign.name}"
