"""The leases a worker process holds are renewed by one thread of the process:
each every quarter lease while its batch runs, none once it is recorded."""

from __future__ import annotations

import threading
import time

import pytest
from django.utils import timezone

from campaigns.models import Batch
from gpuworker.runner import lease
from gpuworker.runner.lease import LeaseKeeper, renewals

# Committed rows: the renewing thread has its own connection and must see the batches.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def running(make_campaign, settings):
    """Two batches this worker holds, leases of a second (renewed every 0.25 s)."""
    settings.BATCH_LEASE_SECONDS = 1
    campaign = make_campaign("leased", batch_size=20)
    batches = [
        Batch.objects.create(
            campaign=campaign,
            version=campaign.current_version,
            size=0,
            state=Batch.State.RUNNING,
            started_at=timezone.now(),
            lease_token=f"token-{n}",
            lease_expires_at=timezone.now(),
        )
        for n in range(2)
    ]
    return batches


def expiry(batch: Batch):
    return Batch.objects.get(pk=batch.pk).lease_expires_at


def until(condition, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_two_leases_are_renewed_by_one_thread_and_a_stopped_one_no_more(running):
    first, second = running
    keepers = [LeaseKeeper(b.pk, b.lease_token) for b in running]
    before = [expiry(b) for b in running]
    for keeper in keepers:
        keeper.start()
    try:
        assert until(lambda: all(expiry(b) > old for b, old in zip(running, before, strict=True)))
        renewing = [t for t in threading.enumerate() if t.name.startswith("lease")]
        assert len(renewing) == 1, [t.name for t in renewing]

        keepers[0].stop()
        stopped_at = expiry(first)
        kept_at = expiry(second)
        assert until(lambda: expiry(second) > kept_at)
        time.sleep(0.3)  # more than a renewal's interval
        assert expiry(first) == stopped_at
        assert first.pk not in renewals.held() and second.pk in renewals.held()
    finally:
        for keeper in keepers:
            keeper.stop()
    assert not {first.pk, second.pk} & set(renewals.held())


def test_a_lease_taken_by_another_worker_is_no_longer_renewed(running):
    first, _ = running
    keeper = LeaseKeeper(first.pk, first.lease_token)
    keeper.start()
    try:
        # The sweeper gave the batch to another worker: the renewal finds no row.
        Batch.objects.filter(pk=first.pk).update(lease_token="someone-else")
        assert until(lambda: first.pk not in renewals.held())
    finally:
        keeper.stop()
    assert Batch.objects.get(pk=first.pk).lease_token == "someone-else"


class _Killed(BaseException):
    """What no handler of the renewal thread's catches."""


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_renewal_thread_that_died_is_started_again_by_the_next_lease(running, monkeypatch):
    first, second = running
    renewed: list[int] = []

    def renew(batch_id: int, token: str) -> bool:
        if not renewed:
            renewed.append(-batch_id)
            raise _Killed
        renewed.append(batch_id)
        return True

    monkeypatch.setattr(lease._Renewals, "_renew", staticmethod(renew))
    dying = LeaseKeeper(first.pk, first.lease_token)
    dying.start()
    assert until(lambda: renewed == [-first.pk])
    assert until(lambda: not any(t.name == "lease-renewals" for t in threading.enumerate()))
    dying.stop()  # returns: nothing is renewing it

    kept = LeaseKeeper(second.pk, second.lease_token)
    kept.start()
    try:
        assert until(lambda: second.pk in renewed)
    finally:
        kept.stop()
