"""Pressing Profile: a real worker process builds the sample, measures and estimates."""

from __future__ import annotations

import pytest

from campaigns import profiling
from campaigns.models import Profile
from tests.worker import wait_until

pytestmark = pytest.mark.integration


def test_a_worker_runs_a_queued_profile_to_its_estimate(start_worker, make_campaign, catalog):
    campaign = make_campaign("profiled")
    worker = start_worker()
    profile = profiling.profile_start(campaign=campaign, margin=0.25, max_batch_size=4)

    def finished() -> bool:
        profile.refresh_from_db()
        return profile.state in (Profile.State.DONE, Profile.State.FAILED)

    wait_until(finished, timeout=240, worker=worker)
    assert profile.state == Profile.State.DONE, profile.error
    assert profile.sample and profile.heavy  # built by the worker
    assert profile.chosen_batch_size == 4
    assert profile.estimate.units == campaign.units.count()
