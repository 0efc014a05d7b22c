"""A profile's life: created (here, or queued for a worker), run again on the same
sample, and failed when its worker goes silent.

The measuring itself is gpuworker/profiler.py, reached through the Celery task
`gpuworker.tasks.run_profile` by name: campaigns does not import the worker.
"""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from campaigns.intake.project_folders import campaign_folder_refusal
from campaigns.models import Campaign, Profile
from campaigns.profiles.sample import sample_build
from campaigns.runs.start import work_send

log = logging.getLogger(__name__)

PROFILE_TASK = "gpuworker.tasks.run_profile"


def profile_create(
    *,
    campaign: Campaign,
    margin: float = 0.2,
    memory_budget: int | None = None,
    max_batch_size: int = 1024,
    sample_size: int = 48,
    heavy: int = 12,
) -> Profile:
    """A profile to run in this process (`campaign profile`), its sample built now."""
    if not 0 <= margin < 1:
        raise ValueError("margin is a fraction of memory between 0 and 1 (0.2 keeps 20% free)")
    _folder_readable(campaign)
    version = campaign.current_version
    sample, heaviest = sample_build(
        campaign=campaign, size=sample_size, heavy=heavy, version=version
    )
    if not sample:
        raise ValueError(f"campaign {campaign.name} has no unit to profile")
    return Profile.objects.create(
        campaign=campaign,
        version=version,
        sample=sample,
        heavy=heaviest,
        margin=margin,
        memory_budget=memory_budget,
        max_batch_size=max_batch_size,
    )


def profile_rerun(*, profile: Profile, memory_budget: int | None = None) -> Profile:
    """The same sample, parameter version and settings again, queued, to compare
    (another device, another day, another worker).

    The memory budget carries over only when it was given (a CPU budget, or a
    smaller card emulated on a larger one): one read from the device's memory
    is the next device's to read again.
    """
    if not profile.sample:
        raise ValueError(f"profile {profile.pk} has no saved sample to run again")
    _folder_readable(profile.campaign)
    if memory_budget is None and profile.runtime.get("budget_source") == "given":
        memory_budget = profile.memory_budget
    return Profile.objects.create(
        campaign=profile.campaign,
        version=profile.version,
        sample=profile.sample,
        heavy=profile.heavy,
        margin=profile.margin,
        memory_budget=memory_budget,
        max_batch_size=profile.max_batch_size,
    )


def _folder_readable(campaign: Campaign) -> None:
    """A profile reads the campaign's inputs, as a run does: refused on the same terms."""
    refusal = campaign_folder_refusal(campaign)
    if refusal is not None:
        raise ValueError(refusal)


def latest_profile(*, campaign: Campaign) -> Profile | None:
    """The campaign's newest profile, whatever its state (the page shows it)."""
    return Profile.objects.filter(campaign=campaign).order_by("-created_at", "-pk").first()


def profiles_fail_stale(*, now: dt.datetime | None = None) -> list[int]:
    """Fail the running profiles whose worker stopped beating: killed (on a CPU
    a profile grows its batches until memory runs short, so perhaps by the
    kernel for memory) or its machine lost. Failed, not sent again: what
    killed the worker would likely kill the next one; the report keeps the
    steps measured and offers to profile again."""
    now = now or timezone.now()
    stale = now - dt.timedelta(seconds=settings.PROFILE_HEARTBEAT_SECONDS * 3)
    # A profile without a heartbeat yet counts from when it was queued.
    silent = Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True, created_at__lt=stale)
    failed = []
    running = Profile.objects.filter(silent, state=Profile.State.RUNNING)
    for profile in running.only("pk", "heartbeat_at", "created_at", "steps"):
        since = profile.heartbeat_at or profile.created_at
        moved = Profile.objects.filter(
            pk=profile.pk, state=Profile.State.RUNNING, heartbeat_at=profile.heartbeat_at
        ).update(
            state=Profile.State.FAILED,
            finished_at=now,
            error=(
                f"its worker stopped answering (no heartbeat since "
                f"{since:%Y-%m-%d %H:%M:%S} UTC) after {len(profile.steps)} measured "
                "batch(es): it was killed, perhaps for memory, or its machine was lost. "
                "The batches measured are below; profile again."
            ),
        )
        if moved:
            log.warning("profile %s: worker silent since %s; failed", profile.pk, since)
            failed.append(profile.pk)
    return failed


def _queue(profile: Profile) -> None:
    # A broker that does not answer leaves the profile queued for the
    # lost-message sweep (campaigns/runs/start.py, work_send).
    transaction.on_commit(
        lambda: work_send(task=PROFILE_TASK, args=[profile.pk], what="the profile")
    )


def profile_start(
    *, campaign: Campaign, margin: float = 0.2, max_batch_size: int = 1024
) -> Profile:
    """Queue a profile for a worker: the sample is built there (it measures every
    unit's cost, which is no work for a web request on a large corpus)."""
    if not 0 <= margin < 1:
        raise ValueError("margin is a fraction of memory between 0 and 1 (0.2 keeps 20% free)")
    _folder_readable(campaign)
    profile = Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        margin=margin,
        max_batch_size=max_batch_size,
    )
    _queue(profile)
    return profile


def profile_rerun_start(*, profile: Profile) -> Profile:
    """Queue the same sample again for a worker (the page's "Re-run this sample")."""
    again = profile_rerun(profile=profile)
    _queue(again)
    return again
