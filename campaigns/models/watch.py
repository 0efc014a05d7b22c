"""Watching runs: the worker processes' heartbeats (WorkerBeat), the events a
run raised and how each was delivered (Notification), and what a project
wants to be told and where (ProjectAlerts)."""

from __future__ import annotations

import secrets

from django.db import models

from campaigns.models.campaign import Campaign, Project


class WorkerBeat(models.Model):
    """A worker process, as its own heartbeat thread last described it
    (gpuworker/beat.py): the live workers panel and the stall rules read it."""

    # host:pid, as Batch.worker names the process that holds a batch.
    name = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200)
    pid = models.PositiveIntegerField()
    device = models.CharField(max_length=200, blank=True)
    queues = models.CharField(max_length=200, blank=True)
    batches_done = models.PositiveIntegerField(default=0)
    started_at = models.DateTimeField()
    beat_at = models.DateTimeField(db_index=True)
    # Set by a worker that shut down cleanly; a killed one just stops beating.
    stopped_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["host", "pid"]

    def __str__(self) -> str:
        return self.name


class Notification(models.Model):
    """An event a run raised, recorded once (the key) and delivered by e-mail
    and webhook as the project asked (campaigns/watch/notify.py)."""

    class Event(models.TextChoices):
        CHECKPOINT = "checkpoint", "checkpoint waiting for a decision"
        STALL = "stall", "run stalled"
        DONE = "done", "campaign done"
        FAILURES = "failures", "failure share above the threshold"
        RENTAL_ENDING = "rental_ending", "rental ending, outputs not exported"

    class Delivery(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"  # given up after the tries
        OFF = "off"  # switched off for the project, or nowhere to send

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="notifications")
    event = models.CharField(max_length=20, choices=Event.choices)
    # What makes two raisings the same event: the checkpoint's id, the last
    # batch finished before a stall, the order whose rental ends.
    key = models.CharField(max_length=200)
    title = models.CharField(max_length=300)
    message = models.TextField()
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField(auto_now_add=True)
    email = models.CharField(max_length=10, choices=Delivery.choices, default=Delivery.PENDING)
    email_at = models.DateTimeField(null=True, blank=True)
    webhook = models.CharField(max_length=10, choices=Delivery.choices, default=Delivery.PENDING)
    webhook_at = models.DateTimeField(null=True, blank=True)
    webhook_status = models.PositiveIntegerField(null=True, blank=True)
    tries = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.UniqueConstraint(fields=["campaign", "key"], name="notification_once"),
        ]
        indexes = [
            models.Index(fields=["email", "webhook"], name="notification_delivery"),
        ]

    def __str__(self) -> str:
        return f"{self.campaign.name}: {self.title}"


def new_webhook_secret() -> str:
    return secrets.token_hex(32)


def all_events() -> list[str]:
    return list(Notification.Event.values)


class ProjectAlerts(models.Model):
    """What a project's members are told about its runs, and where. A project
    without a row gets the defaults (every event by e-mail, no webhook)."""

    project = models.OneToOneField(Project, on_delete=models.CASCADE, related_name="alerts")
    events = models.JSONField(default=all_events, blank=True)
    email = models.BooleanField(default=True)
    webhook_url = models.URLField(max_length=500, blank=True)
    # The key the webhook's body is signed with (HMAC-SHA256): the receiver
    # checks the signature with it. Shown to members on the alerts page.
    webhook_secret = models.CharField(max_length=64, default=new_webhook_secret)
    # A failure share above this (of the units processed, once enough are)
    # raises the failures event.
    failure_share = models.FloatField(default=0.1)

    class Meta:
        verbose_name_plural = "project alerts"

    def __str__(self) -> str:
        return f"alerts of {self.project.name}"

    def wants(self, event: str) -> bool:
        return event in (self.events or [])
