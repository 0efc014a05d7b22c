"""A heartbeat's renewal never waits on a row lock: the task that stops the
heartbeat joins its thread, and may itself hold that lock."""

from __future__ import annotations

import threading

import pytest
from django.db import DatabaseError, connection, connections, transaction
from django.utils import timezone

from campaigns.models import Profile
from gpuworker.heartbeat import update_without_waiting

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's row locks and lock_timeout"
)


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_renewal_gives_up_on_a_row_another_transaction_holds(make_campaign):
    campaign = make_campaign("held")
    profile = Profile.objects.create(
        campaign=campaign, version=campaign.current_version, state=Profile.State.RUNNING
    )
    outcome: list = []

    def renew() -> None:
        try:
            rows = Profile.objects.filter(pk=profile.pk)
            outcome.append(update_without_waiting(rows, heartbeat_at=timezone.now()))
        except DatabaseError as exc:
            outcome.append(exc)
        finally:
            connections.close_all()

    with transaction.atomic():
        # The lock the task's own transaction would hold while it stops the heartbeat.
        Profile.objects.select_for_update().get(pk=profile.pk)
        renewal = threading.Thread(target=renew)
        renewal.start()
        renewal.join(timeout=60)
        still_waiting = renewal.is_alive()
    renewal.join()
    assert not still_waiting  # it gave up while the lock was still held
    assert len(outcome) == 1 and isinstance(outcome[0], DatabaseError)
    assert "lock timeout" in str(outcome[0])


@pytest.mark.django_db(transaction=True)
def test_a_renewal_of_a_free_row_renews_it(make_campaign):
    campaign = make_campaign("free")
    profile = Profile.objects.create(
        campaign=campaign, version=campaign.current_version, state=Profile.State.RUNNING
    )
    now = timezone.now()
    assert update_without_waiting(Profile.objects.filter(pk=profile.pk), heartbeat_at=now) == 1
    profile.refresh_from_db()
    assert profile.heartbeat_at == now
