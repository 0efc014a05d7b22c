"""Celery tasks: thin adapters that take ids and call the batch runner."""

from __future__ import annotations

from celery import shared_task
from django.conf import settings

from .batch_runner import run_batch as _run_batch


@shared_task(
    name="gpuworker.tasks.run_batch",
    acks_late=True,
    soft_time_limit=settings.BATCH_TIME_LIMIT,  # units end as `timeout`
    time_limit=settings.BATCH_TIME_LIMIT + 60,  # then the pool child is killed
)
def run_batch(batch_id: int) -> str:
    # Idempotent: the runner claims the batch by update, so a redelivery
    # of this message finds it no longer queued and returns quietly.
    return _run_batch(batch_id)


@shared_task(name="gpuworker.tasks.run_profile", acks_late=True)
def run_profile(profile_id: int) -> str:
    # Claimed by update like a batch: a redelivered message finds it running.
    from .profiler import profile_run

    return profile_run(profile_id)
