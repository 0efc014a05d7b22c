"""Redis restarts under a running campaign: the worker reconnects and goes on; queued
batches survive with appendonly, and the sweeper sends again those lost without it."""

from __future__ import annotations

import contextlib
import datetime as dt
import shutil
import signal
import subprocess
import time
from pathlib import Path
from unittest import mock

import pytest
import redis
from django.utils import timezone

from campaigns.models import Batch, UnitState
from campaigns.runs import leases, start
from tests.conftest import services_required
from tests.integration.test_several_workers import (
    assert_each_unit_succeeded_once,
    image_campaign,
    image_corpus,
    unfinished,
    units_in,
)
from tests.worker import free_port, purge_queue, use_broker, wait_until

# Seconds Redis stays down: the worker notices, and retries at least once.
DOWNTIME = 4


class PrivateRedis:
    """A redis-server of this test's own, on a free port: restarting the shared
    one on 6379 would pull the broker from under everyone else's tests."""

    def __init__(self, folder: Path, *, appendonly: bool, extra: tuple[str, ...] = ()):
        self.folder, self.appendonly, self.extra = folder, appendonly, extra
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        folder.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        args = [binary, "--bind", "127.0.0.1", "--port", str(self.port), "--save", ""]
        args += ["--dir", str(self.folder), "--logfile", str(self.folder / "redis.log")]
        # appendfsync always: a message is on disk before Redis answers the
        # send, so a SIGKILL right after loses none (production's everysec
        # may lose the last second; the sweeper then sends those again).
        args += ["--appendonly", "yes" if self.appendonly else "no", "--appendfsync", "always"]
        args += list(self.extra)
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_timeout=1)

        def answers() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError((self.folder / "redis.log").read_text()[-2000:])
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(answers, timeout=20, interval=0.1)

    def kill(self) -> None:
        """SIGKILL: a crash or a lost machine, nothing flushed on the way out."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=20)


@pytest.fixture
def private_redis(tmp_path):
    if shutil.which("redis-server") is None:
        message = "redis-server is not installed (apt-get install redis-server)"
        if services_required():
            pytest.fail(message)
        pytest.skip(message)
    servers: list[PrivateRedis] = []

    def start(*, appendonly: bool, extra: tuple[str, ...] = ()) -> PrivateRedis:
        server = PrivateRedis(
            tmp_path / f"redis-{len(servers)}", appendonly=appendonly, extra=extra
        )
        servers.append(server)
        server.start()
        return server

    yield start
    for server in servers:
        server.kill()


def _run_through_a_restart(server, campaign, n, worker) -> int:
    """Start the campaign, kill Redis while batches wait in it, restart it.

    Returns the succeeded count at the restart, after checking that batches
    were still waiting when Redis went away.
    """
    batches = start.campaign_run(campaign=campaign)
    assert batches == n // 2
    wait_until(
        lambda: units_in(campaign, UnitState.SUCCEEDED) >= 4,
        timeout=60,
        interval=0.02,
        worker=worker,
    )
    server.kill()
    waiting = Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).count()
    assert waiting >= 10, f"only {waiting} batches were still queued: the campaign ran too fast"
    time.sleep(DOWNTIME)
    at_restart = units_in(campaign, UnitState.SUCCEEDED)
    server.start()
    # The worker outlived the outage (Celery reconnects by itself), and consumes again.
    assert worker.proc.poll() is None, worker.output()[-3000:]
    wait_until(
        lambda: units_in(campaign, UnitState.SUCCEEDED) > at_restart,
        timeout=90,
        worker=worker,
    )
    return at_restart


@pytest.mark.integration
def test_after_redis_restarts_the_worker_resumes_and_persisted_batches_all_run(
    private_redis, start_worker, project, tmp_path, output_root
):
    # given: Redis with appendonly, a worker without the sweeper (only Redis
    # can bring the queued batches back), 160 images in batches of 2
    server = private_redis(appendonly=True)
    n = 160
    image_corpus(tmp_path / "images", n)
    campaign = image_campaign(project, tmp_path / "images", name="redis-restart", batch_size=2)
    with use_broker(server.url):
        purge_queue()
        worker = start_worker()
        worker.wait_ready()

        # when: Redis is killed mid-run and comes back on the same port
        _run_through_a_restart(server, campaign, n, worker)

        # then: every batch queued before the crash ran, once; all but at most
        # the one whose message the worker was taking when Redis died: kombu
        # pops a message, then files it among the unacknowledged, and a crash
        # between the two leaves it in the worker's hands only (prefetch 1:
        # never more than one). The lost-message sweep (beat, not running
        # here) sends such a batch again; the test does that once.
        wait_until(lambda: unfinished(campaign) <= 2, timeout=120, worker=worker)
        with contextlib.suppress(AssertionError):
            wait_until(lambda: unfinished(campaign) == 0, timeout=15, worker=worker)
        if unfinished(campaign):
            left = list(Batch.objects.filter(campaign=campaign).exclude(state=Batch.State.DONE))
            assert [b.state for b in left] == [Batch.State.QUEUED], left
            assert leases.broker_queue_waiting(leases.BATCH_QUEUE) == 0
            assert leases.batches_resend_lost(grace=0) == [left[0].pk]
            wait_until(lambda: unfinished(campaign) == 0, timeout=60, worker=worker)
    assert_each_unit_succeeded_once(campaign, output_root, n)
    assert "Connection to broker lost" in worker.output()
    assert "sending again" not in worker.output()


@pytest.mark.integration
def test_batches_lost_with_a_redis_without_persistence_are_sent_again(
    private_redis, start_worker, project, tmp_path, output_root, settings
):
    # given: Redis without persistence, a worker with the sweeper every second
    settings.BATCH_LEASE_SECONDS = 2
    server = private_redis(appendonly=False)
    n = 160
    image_corpus(tmp_path / "images", n)
    campaign = image_campaign(project, tmp_path / "images", name="redis-lost", batch_size=2)
    with use_broker(server.url):
        purge_queue()
        worker = start_worker(beat=True)
        worker.wait_ready()

        # when: Redis is killed mid-run and comes back empty
        _run_through_a_restart(server, campaign, n, worker)

        # then: the sweeper saw queued batches with no message and sent them again
        wait_until(lambda: unfinished(campaign) == 0, timeout=120, worker=worker)
    assert_each_unit_succeeded_once(campaign, output_root, n)
    assert "sending again" in worker.output()


# --- the sweep that sends lost messages again, without a broker ---------------


@pytest.fixture
def queued(make_campaign, django_capture_on_commit_callbacks):
    """Two queued batches of the demo corpus, created two minutes ago."""
    campaign = make_campaign("queued", batch_size=20)
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
    Batch.objects.filter(campaign=campaign).update(
        created_at=timezone.now() - dt.timedelta(minutes=2)
    )
    return sorted(Batch.objects.filter(campaign=campaign).values_list("pk", flat=True))


def _sweep(waiting: int | None):
    with (
        mock.patch.object(leases, "broker_queue_waiting", return_value=waiting),
        mock.patch.object(start.celery_app, "send_task") as send,
    ):
        resent = leases.batches_resend_lost(confirm_after=0)
    return resent, sorted(call.kwargs["args"][0] for call in send.call_args_list)


@pytest.mark.django_db
def test_queued_batches_missing_from_the_broker_are_sent_again(queued):
    assert _sweep(waiting=0) == (queued, queued)
    # one message for two batches: which one lost its message, the broker cannot say
    assert _sweep(waiting=1) == (queued, queued)


@pytest.mark.django_db
def test_queued_batches_whose_messages_wait_are_left_alone(queued):
    assert _sweep(waiting=2) == ([], [])
    assert _sweep(waiting=None) == ([], [])  # the broker does not answer: nothing is known


@pytest.mark.django_db
def test_a_batch_queued_moments_ago_is_left_to_its_message(queued):
    Batch.objects.filter(pk=queued[0]).update(created_at=timezone.now())
    assert _sweep(waiting=0) == ([queued[1]], [queued[1]])


@pytest.mark.django_db
def test_the_periodic_sweep_sends_lost_batches_and_resume_leaves_it_to_itself(queued):
    with (
        mock.patch.object(leases, "batches_resend_lost") as resend,
        mock.patch.object(start.celery_app, "send_task"),
    ):
        leases.batches_requeue_expired()
        assert resend.call_count == 1
        leases.batches_requeue_expired(campaign=Batch.objects.get(pk=queued[0]).campaign)
        assert resend.call_count == 1


def test_the_broker_says_how_many_messages_wait_or_none_when_down():
    # An empty queue on the configured broker (filesystem, or Redis in the services pass).
    assert leases.broker_queue_waiting("briefgpu-queue-never-used") == 0
    with use_broker(f"redis://127.0.0.1:{free_port()}/0"):
        assert leases.broker_queue_waiting(leases.BATCH_QUEUE) is None


def test_a_worker_refuses_a_redis_that_would_evict_queued_messages(private_redis, start_worker):
    # given: a Redis that drops keys when short of memory, as a cache would
    server = private_redis(appendonly=True, extra=("--maxmemory-policy", "allkeys-lru"))
    with use_broker(server.url):
        worker = start_worker()
        # then: the worker exits at once, saying why, and never consumes
        assert worker.proc.wait(timeout=120) != 0
    assert "refusing to start: portal.E006" in worker.output()
    assert " ready." not in worker.output()


def test_a_worker_starts_on_a_redis_without_persistence_but_says_so(private_redis, start_worker):
    server = private_redis(appendonly=False)
    with use_broker(server.url):
        worker = start_worker()
        worker.wait_ready()
    assert "portal.W006" in worker.output()
    assert "refusing to start" not in worker.output()
