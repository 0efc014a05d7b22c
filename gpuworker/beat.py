"""Each worker process says it is alive: a WorkerBeat row renewed from a
thread, which the live workers panel and the stall rules read
(campaigns/watch/). Celery's own worker heartbeats travel as broker events
that only a monitor (Flower) listening at the time sees; a row answers "who
is working" from the database, after the fact and with the broker down.

A prefork pool child starts its thread when it starts (worker_process_init);
a solo or threads pool runs tasks in the main process, which starts it at
worker_ready. A warm shutdown marks the row stopped; a killed process just
stops beating.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import threading

from celery import signals
from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from campaigns.models import WorkerBeat
from gpuworker.heartbeat import update_without_waiting

log = logging.getLogger(__name__)


class _Beat:
    def __init__(self) -> None:
        self.batches_done = 0
        self.thread: threading.Thread | None = None
        self.stop = threading.Event()
        self.pid = 0
        self.started_at = timezone.now()

    def start(self) -> None:
        if self.thread is not None and self.pid == os.getpid():
            return
        self.pid, self.batches_done = os.getpid(), 0
        # Once: a row registered again (removed by an operator, a database
        # that was down) keeps the process's start, which says which batches
        # it may hold (campaigns/watch/stall.py).
        self.started_at = timezone.now()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="worker-beat", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self._register()
            while not self.stop.wait(max(0.2, settings.WORKER_BEAT_SECONDS)):
                try:
                    self._beat()
                except Exception:  # a beat that fails must not end the beating
                    log.exception("worker beat")
        finally:
            connection.close()  # this thread's own connection

    def _register(self) -> None:
        now = timezone.now()
        try:
            WorkerBeat.objects.update_or_create(
                name=name(),
                defaults={
                    "host": socket.gethostname(),
                    "pid": os.getpid(),
                    "device": device(),
                    "queues": queues(),
                    "batches_done": self.batches_done,
                    "started_at": self.started_at,
                    "beat_at": now,
                    "stopped_at": None,
                },
            )
        except DatabaseError as exc:  # the next beat tries again
            log.warning("worker beat: cannot register: %s", exc)
            with contextlib.suppress(DatabaseError):
                connection.close()

    def _beat(self) -> None:
        try:
            if not update_without_waiting(
                WorkerBeat.objects.filter(name=name()),
                beat_at=timezone.now(),
                batches_done=self.batches_done,
            ):
                self._register()  # the row was removed (an operator's clean-up)
        except DatabaseError as exc:
            log.warning("worker beat: %s", exc)
            with contextlib.suppress(DatabaseError):
                connection.close()

    def stopped(self) -> None:
        if self.thread is None or self.pid != os.getpid():
            return
        self.stop.set()
        with contextlib.suppress(DatabaseError):
            WorkerBeat.objects.filter(name=name()).update(
                stopped_at=timezone.now(), batches_done=self.batches_done
            )


_beat = _Beat()


def name() -> str:
    # As Batch.worker says it (gpuworker/runner/claim.py, worker_name).
    return f"{socket.gethostname()}:{os.getpid()}"


def batch_done() -> None:
    """A batch this process ran was recorded."""
    _beat.batches_done += 1


def device() -> str:
    try:
        return _device()
    except Exception as exc:  # a device that errors still has a worker to show
        log.warning("worker beat: cannot name the device: %s", exc)
        return "unknown"


def _device() -> str:
    # Named, not taken: work_device() takes the process's share (torch's
    # threads, the memory fraction) and is cached, and torch.set_num_threads
    # called from this thread would set this thread's count only, leaving the
    # process's batches on all the cores.
    import torch

    if torch.cuda.is_available():
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return f"cuda{':' + visible if visible else ''} {torch.cuda.get_device_name(0)}"
    return f"cpu ({os.cpu_count()} cores)"


def queues() -> str:
    """The queues this worker consumes: its -Q/--queues, else those Celery
    set it up with (the configuration's; a pool child inherits them)."""
    named = _queues_from_argv()
    if named:
        return named
    try:
        from celery import current_app

        names = sorted(current_app.amqp.queues.consume_from or {})
    except Exception:  # noqa: BLE001 — Celery's default queue, then
        names = []
    return ",".join(names) or "celery"


def _queues_from_argv() -> str:
    argv = sys.argv
    for i, arg in enumerate(argv):
        if arg in ("-Q", "--queues") and i + 1 < len(argv):
            return argv[i + 1]
        for prefix in ("--queues=", "-Q"):
            if arg.startswith(prefix) and len(arg) > len(prefix):
                return arg[len(prefix) :]
    return ""


@signals.worker_process_init.connect
def _child_started(**_) -> None:
    _beat.start()


@signals.worker_ready.connect
def _ready(sender=None, **_) -> None:
    pool = str(getattr(getattr(sender, "controller", None), "pool_cls", "prefork"))
    if "prefork" not in pool:
        _beat.start()


@signals.worker_process_shutdown.connect
@signals.worker_shutdown.connect
def _shutdown(**_) -> None:
    _beat.stopped()
