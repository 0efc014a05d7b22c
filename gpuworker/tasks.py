"""Celery tasks: thin adapters that take ids and call the batch runner."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import shared_task, signals
from celery.exceptions import Reject
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connections

from gpuworker import beat  # noqa: F401  (each worker process's heartbeat row)
from gpuworker.runner.batch import run_batch as _run_batch
from gpuworker.runner.pipeline import finisher, pipeline_enabled
from gpuworker.runner.prefetch import prefetch

log = logging.getLogger(__name__)

# How long a worker waits, once the database stopped answering, before it
# hands the message back and takes the next one.
DATABASE_RETRY_SECONDS = 5


def _put_back_while_database_down(what: str, run: Callable[[], str]) -> str:
    """Run `run`; if the database does not answer, give the message back to the broker.

    A task that raises is acknowledged and its message is gone: during a
    database restart a worker would take every queued message in turn, fail
    each in a millisecond, and leave the batches queued with nothing to start
    them. Rejected with requeue, the message stays in the broker, and the
    pause keeps the worker from spinning through the queue. A batch that was
    already claimed when the database went is not lost either: its lease runs
    out and the sweeper requeues it.
    """
    try:
        return run()
    except (OperationalError, InterfaceError) as exc:
        log.warning(
            "%s: database unavailable (%s); message back to the queue in %s s",
            what,
            str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__,
            DATABASE_RETRY_SECONDS,
        )
        for conn in connections.all(initialized_only=True):
            with contextlib.suppress(DatabaseError):
                conn.close()
        time.sleep(DATABASE_RETRY_SECONDS)
        raise Reject(exc, requeue=True) from exc


@shared_task(
    name="gpuworker.tasks.run_batch",
    acks_late=True,
    soft_time_limit=settings.BATCH_TIME_LIMIT,  # units end as `timeout`
    time_limit=settings.BATCH_TIME_LIMIT + 60,  # then the pool child is killed
)
def run_batch(batch_id: int) -> str:
    # Idempotent: the runner claims the batch by update, so a redelivery
    # of this message finds it no longer queued and returns quietly.
    return _put_back_while_database_down(
        f"batch {batch_id}", lambda: _run_batch(batch_id, hand_off=pipeline_enabled())
    )


@signals.worker_process_shutdown.connect  # a prefork pool child, as it exits
@signals.worker_shutdown.connect  # the main process (the solo pool runs tasks there)
def _finish_handed_off_batches(**_) -> None:
    """A warm shutdown records the batches whose model already ran before the
    process goes: their units are neither lost nor run twice. A prefetch
    under way is stopped: its batch was not claimed, another worker runs it."""
    prefetch.drop()
    finisher.drain()


# A pool child that had a SIGTERM while busy leaves this long after its last
# task, unless the parent's shutdown ends it first (the usual way): without a
# parent that sends it no more work (a cold shutdown), nothing else would.
SIGTERM_LEAVE_AFTER_SECONDS = 3.0


class _GroupSigterm:
    """SIGTERM in a prefork pool child: the batch under way is finished first.

    systemd's default KillMode=control-group, `kill -TERM -PGID` and
    Kubernetes send SIGTERM to every process of the worker at once. The main
    process starts its warm shutdown and waits for the running task, but the
    pool child used to die at once (WorkerLostError), its batch left to the
    lease. Here a busy child notes the signal and goes on; the warm shutdown
    ends it once the task is done, after the batches it handed off are
    recorded (_finish_handed_off_batches). An idle child leaves at once
    through billiard's own handler, as before.

    The handler goes in at the child's first task: billiard replaces any
    handler but SIG_IGN after worker_process_init, and a child that ignored
    SIGTERM would never leave a cold shutdown (billiard stops children with it).
    """

    def __init__(self) -> None:
        self.pool_child = self.busy = self.asked = False
        self.previous: Any = None

    def child_started(self, **_) -> None:
        self.pool_child, self.busy, self.asked, self.previous = True, False, False, None

    def task_started(self, **_) -> None:
        self.busy = True
        if self.pool_child and self.previous is None:
            self.previous = signal.signal(signal.SIGTERM, self.on_sigterm)

    def on_sigterm(self, signum, frame) -> None:
        self.asked = True
        if self.busy:
            log.warning("SIGTERM: this worker process finishes its batch first")
            return
        _finish_handed_off_batches()
        signal.signal(signal.SIGTERM, self.previous or signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)

    def task_ended(self, **_) -> None:
        self.busy = False
        if self.asked:
            timer = threading.Timer(SIGTERM_LEAVE_AFTER_SECONDS, self.leave_if_idle)
            timer.daemon = True
            timer.start()

    def leave_if_idle(self) -> None:
        # From the timer's thread: the handler, in the main thread, leaves.
        if not self.busy:
            os.kill(os.getpid(), signal.SIGTERM)


_sigterm = _GroupSigterm()
signals.worker_process_init.connect(_sigterm.child_started, weak=False)
signals.task_prerun.connect(_sigterm.task_started, weak=False)
signals.task_postrun.connect(_sigterm.task_ended, weak=False)


@signals.worker_init.connect
def _warn_unshared_device(sender=None, **_) -> None:
    """`-c N` pool processes that each think the device is theirs: each profile
    measures against all of its memory, and on a CPU each takes all the cores."""
    concurrency = getattr(sender, "concurrency", 1) or 1
    prefork = "prefork" in str(getattr(sender, "pool_cls", "prefork"))
    if prefork and concurrency > settings.WORKERS_PER_DEVICE:
        log.warning(
            "%s pool processes share this worker's device but WORKERS_PER_DEVICE is %s: "
            "set WORKERS_PER_DEVICE=%s so each keeps to its share of the device "
            "(docs/deployment.md)",
            concurrency,
            settings.WORKERS_PER_DEVICE,
            concurrency,
        )


@shared_task(name="gpuworker.tasks.run_profile", acks_late=True)
def run_profile(profile_id: int) -> str:
    # Claimed by update like a batch: a redelivered message finds it running.
    from gpuworker.profiler import profile_run

    return _put_back_while_database_down(f"profile {profile_id}", lambda: profile_run(profile_id))
