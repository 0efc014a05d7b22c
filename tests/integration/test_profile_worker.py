"""Pressing Profile: a real worker process builds the sample, measures and estimates."""

from __future__ import annotations

import pytest

from campaigns.models import Profile
from campaigns.profiles.services import profile_start
from tests.worker import wait_until

pytestmark = pytest.mark.integration


def test_a_worker_runs_a_queued_profile_to_its_estimate(start_worker, make_campaign, catalog):
    campaign = make_campaign("profiled")
    worker = start_worker()
    profile = profile_start(campaign=campaign, margin=0.25, max_batch_size=4)

    def finished() -> bool:
        profile.refresh_from_db()
        return profile.state in (Profile.State.DONE, Profile.State.FAILED)

    wait_until(finished, timeout=240, worker=worker)
    assert profile.state == Profile.State.DONE, profile.error
    assert profile.sample and profile.heavy  # built by the worker
    assert profile.chosen_batch_size == 4
    assert profile.estimate.units == campaign.units.count()


def test_a_profile_whose_worker_is_killed_fails_and_keeps_what_it_measured(
    start_worker, make_campaign, catalog, settings
):
    """The kernel's OOM killer, or a lost machine, takes the worker mid-profile:
    the sweeper of another worker notices the silence and the report says so,
    with the batches measured before — not "Running" for ever."""
    beat = {"PROFILE_HEARTBEAT_SECONDS": "0.5"}
    settings.PROFILE_HEARTBEAT_SECONDS = 0.5
    campaign = make_campaign("killed")
    worker = start_worker(env_extra=beat)
    # Batches up to 1,024 of the heaviest texts: minutes on a CPU, time to kill it.
    profile = profile_start(campaign=campaign, max_batch_size=1024)
    wait_until(
        lambda: len(Profile.objects.get(pk=profile.pk).steps) >= 3, timeout=240, worker=worker
    )
    worker.kill()
    profile.refresh_from_db()
    assert profile.state == Profile.State.RUNNING  # as the dead worker left it
    measured = len(profile.steps)

    survivor = start_worker(beat=True, env_extra=beat)
    wait_until(
        lambda: Profile.objects.get(pk=profile.pk).state == Profile.State.FAILED,
        timeout=60,
        worker=survivor,
    )
    profile.refresh_from_db()
    assert "stopped answering" in profile.error
    assert f"after {measured} measured" in profile.error
    assert len(profile.steps) == measured and profile.finished_at is not None
