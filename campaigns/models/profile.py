"""Batch-size profiling: a Profile measured on a sample of the campaign's
inputs, and the Estimate that projects the whole corpus from it."""

from __future__ import annotations

from django.db import models

from campaigns.models.campaign import Campaign, ParameterVersion


class Profile(models.Model):
    """A batch-size measurement on a saved sample of the campaign's own inputs."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="profiles")
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="+")
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    # The sample, saved so the same profile can run again and be compared:
    # unit ids, and which of them were picked as the heaviest.
    sample = models.JSONField(default=list)
    heavy = models.JSONField(default=list)
    margin = models.FloatField(default=0.2)
    # Device memory on CUDA; the configured budget on CPU.
    memory_budget = models.BigIntegerField(null=True, blank=True)
    max_batch_size = models.PositiveIntegerField(default=1024)
    device = models.CharField(max_length=200, blank=True)
    runtime = models.JSONField(default=dict, blank=True)
    # One dict per measured step: phase, batch size, times, tokens, memory, fits.
    steps = models.JSONField(default=list, blank=True)
    chosen_batch_size = models.PositiveIntegerField(null=True, blank=True)
    chosen_peak_reserved = models.BigIntegerField(null=True, blank=True)
    # Allocated memory after each repeat of the chosen size, and the verdict.
    leak = models.JSONField(default=dict, blank=True)
    # Corpus-wide padding of each batching policy at the chosen size.
    policies = models.JSONField(default=list, blank=True)
    # The heaviest inputs it ran ({uid, cost}), and sample inputs that failed to read.
    heaviest_tried = models.JSONField(default=list, blank=True)
    sample_failures = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Renewed by the measuring worker; silent too long, the sweeper fails the
    # profile (campaigns.profiles.services.profiles_fail_stale) instead of leaving it "running".
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]


class Estimate(models.Model):
    """The whole corpus projected from one profile: hours, memory tier, a rental plan."""

    profile = models.OneToOneField(Profile, on_delete=models.CASCADE, related_name="estimate")
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="+")
    device = models.CharField(max_length=200)
    units = models.PositiveIntegerField()
    batch_size = models.PositiveIntegerField()
    # Hours on the measured device, from the corpus's own cost distribution,
    # and the naive figure (sample mean) it replaces, kept for comparison.
    hours_measured_device = models.FloatField()
    hours_naive = models.FloatField()
    peak_memory = models.BigIntegerField()
    memory_tier_gb = models.PositiveIntegerField()
    output_bytes = models.BigIntegerField()
    # Per catalog GPU: projected hours (labelled as projections).
    projections = models.JSONField(default=list)
    # The recommended rental.
    gpu_name = models.CharField(max_length=100, blank=True)
    quantity = models.PositiveIntegerField(null=True, blank=True)
    duration_days = models.PositiveIntegerField(null=True, blank=True)
    reasoning = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)
