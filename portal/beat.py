"""Celery beat's scheduler: the database sweeps run in the beat process itself.

A sweep sent as a message waits in a queue behind whatever is there: on the
`gpu` queue behind every queued batch (a batch whose worker died came back
minutes after its lease ran out), on `portal` behind a plan or an e-mail. Beat
runs no batches, so a sweep it calls on its own tick starts on time however
much work is queued. The other entries (the order sweeps) are sent as usual.

Both `celery -A portal beat` and the beat a worker embeds (`-B`, `make run`)
use this scheduler (CELERY_BEAT_SCHEDULER in portal/settings.py).
"""

from __future__ import annotations

import logging
import time

from celery.beat import PersistentScheduler
from django.conf import settings
from django.db import close_old_connections, connections

log = logging.getLogger(__name__)


class SweepScheduler(PersistentScheduler):
    """PersistentScheduler that calls the tasks named in BEAT_IN_PROCESS here
    instead of sending them."""

    def __init__(self, *args, **kwargs):
        # The beat a worker embeds is a process forked from the worker, which
        # closed every inherited file but the logs: a database connection the
        # worker had opened is dead here. Forgotten without a word to the server
        # (its socket is the worker's); the first sweep opens its own.
        for connection in connections.all(initialized_only=True):
            connection.connection = None
        super().__init__(*args, **kwargs)

    def apply_entry(self, entry, producer=None):
        if entry.task not in settings.BEAT_IN_PROCESS:
            return super().apply_entry(entry, producer=producer)
        return sweep_here(self.app, entry.task)


def sweep_here(app, task_name: str):
    """Run the task `task_name` in this process. A failure is logged and the
    next tick tries again: beat itself must not stop on a database restart."""
    close_old_connections()
    started = time.monotonic()
    try:
        result = app.tasks[task_name]()
    except Exception:
        log.exception("sweep %s failed; the next tick tries again", task_name)
        result = None
    finally:
        # A connection that errored is closed here, not reused by the next tick.
        close_old_connections()
    log.debug("sweep %s took %.3f s", task_name, time.monotonic() - started)
    return result
