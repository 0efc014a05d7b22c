"""The heartbeat that tells the sweepers a long task's worker is still alive.

Trainings and batch-size profiles run for minutes to hours in one task: the
worker renews the row's `heartbeat_at` from a thread (a single step may take
minutes), and a sweeper acts on a row whose beat stopped — the worker was
killed, perhaps by the kernel for memory, or its machine went away.
"""

from __future__ import annotations

import contextlib
import logging
import threading

from django.db import DatabaseError, connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

log = logging.getLogger(__name__)

#: How long a renewal waits for a row another transaction holds (PostgreSQL).
LOCK_WAIT = "5s"


def update_without_waiting(rows: QuerySet, **values) -> int:
    """`rows.update(**values)` from a heartbeat's thread, which must not wait on
    a row lock: a renewal that waited would hold up the task that stops it
    (joining the thread) for as long as the lock is held — for ever, if that
    task's own transaction holds it. On PostgreSQL it gives up after
    LOCK_WAIT with a DatabaseError, a missed beat; SQLite's busy timeout bounds
    its wait already."""
    if connection.vendor != "postgresql":
        return rows.update(**values)
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_WAIT}'")
        return rows.update(**values)


class Heartbeat:
    """Renews `heartbeat_at` on `rows` (the one row, while this worker holds
    it) every `interval` seconds from a thread, between `with` and its end.

    If a renewal finds no row (the sweeper gave it to another worker, or
    failed it, because this one looked dead), `beat` sets `lost`: the task
    stops at its next step without writing more.
    """

    def __init__(self, rows: QuerySet, interval: float, name: str):
        self.rows, self.interval, self.name = rows, max(0.2, interval), name
        self.lost = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{name}-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def renew(self) -> int:
        return update_without_waiting(self.rows, heartbeat_at=timezone.now())

    def beat(self) -> None:
        """From the task's own loop, between steps: renew, and notice a takeover."""
        if not self.renew():
            self.lost = True

    def _run(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                try:
                    self.renew()  # during a long step; the task's loop judges a takeover
                except DatabaseError as exc:
                    log.warning("%s: heartbeat failed: %s", self.name, exc)
                    with contextlib.suppress(DatabaseError):
                        connection.close()
        finally:
            connection.close()  # this thread's own connection
