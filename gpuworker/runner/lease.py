"""The heartbeat that keeps a running batch's lease alive while its worker lives."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import threading
import time

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from campaigns.models import Batch
from gpuworker.heartbeat import update_without_waiting

log = logging.getLogger(__name__)


def lease_deadline() -> dt.datetime:
    return timezone.now() + dt.timedelta(seconds=settings.BATCH_LEASE_SECONDS)


def renewal_interval() -> float:
    """A quarter lease: three quarters are left when a renewal is missed."""
    return max(0.2, float(settings.BATCH_LEASE_SECONDS) / 4)


class LeaseKeeper:
    """Renews a batch's lease every quarter lease, until the batch is recorded.

    If this process is killed, the renewals stop with it, the lease runs
    out, and the sweeper requeues the batch. A database that does not answer
    (a restart) does not stop them: the next renewal tries again. The
    renewals of every batch a process holds come from one thread of the
    process (`renewals`): a thread a batch cost a start and a join each,
    whether or not the batch lasted long enough to renew anything.
    """

    def __init__(self, batch_id: int, token: str):
        self.batch_id, self.token = batch_id, token

    def start(self) -> None:
        renewals.hold(self.batch_id, self.token)

    def stop(self) -> None:
        """Idempotent: a batch's lease stops when it is recorded, or when it
        cannot be. Once it returns, no renewal of this lease runs any more."""
        renewals.release(self.batch_id, self.token)


class _Renewals:
    """The process's thread that renews the leases its batches hold, each a
    quarter lease after it was taken or last renewed. Renewals run one after
    another: one that waits on a row lock (at most heartbeat.LOCK_WAIT, 5 s
    on PostgreSQL) holds up the next by as much, well inside the three
    quarters of a lease (45 s by default) left when a renewal is due."""

    def __init__(self) -> None:
        self._forget()
        # A process forked from this one (a prefork pool child) has none of
        # its threads: its own starts with its first batch.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._changed = threading.Condition()
        self._due: dict[tuple[int, str], float] = {}  # (batch, token) -> when to renew
        self._renewing: tuple[int, str] | None = None
        self._thread: threading.Thread | None = None
        self._wakes_at: float | None = None  # None: idle, waiting for a lease
        self._connected = False  # renewed since it was last idle: a connection is open

    def hold(self, batch_id: int, token: str) -> None:
        due = time.monotonic() + renewal_interval()
        with self._changed:
            self._due[batch_id, token] = due
            if self._thread is None or not self._thread.is_alive():
                # The first lease, or one after the thread died: a lease
                # never renewed would be swept from under its batch.
                self._thread = threading.Thread(
                    target=self._run, name="lease-renewals", daemon=True
                )
                self._thread.start()
            elif self._wakes_at is None or due < self._wakes_at:
                self._changed.notify()

    def release(self, batch_id: int, token: str) -> None:
        key = (batch_id, token)
        with self._changed:
            self._due.pop(key, None)
            while self._renewing == key:  # as a join would: none runs after this
                self._changed.wait()
            if not self._due and self._connected:
                self._changed.notify()  # to close its connection until the next lease

    def held(self) -> list[int]:
        """The batches whose leases this process renews."""
        with self._changed:
            return [batch_id for batch_id, _ in self._due]

    def _run(self) -> None:
        try:
            self._renew_while_held()
        except BaseException:
            log.exception("lease renewals stopped; the next lease taken starts them again")
            raise
        finally:
            with self._changed:
                # A release waiting on a renewal this thread will not finish.
                self._renewing = None
                self._changed.notify_all()

    def _renew_while_held(self) -> None:
        while True:
            with self._changed:
                idle = not self._due
                if idle:
                    self._wakes_at = None
                    close, self._connected = self._connected, False
            if idle:
                if close:  # no connection held between one lease and the next
                    with contextlib.suppress(Exception):
                        connection.close()
                with self._changed:
                    while not self._due:
                        self._changed.wait()
                continue
            with self._changed:
                if not self._due:
                    continue
                self._wakes_at = min(self._due.values())
                wait = self._wakes_at - time.monotonic()
                if wait > 0:
                    self._changed.wait(wait)
                    continue
                key = min(self._due, key=self._due.__getitem__)
                self._due[key] = time.monotonic() + renewal_interval()
                self._renewing, self._connected = key, True
            kept = True
            try:
                kept = self._renew(*key)
            finally:
                with self._changed:
                    self._renewing = None
                    if not kept:
                        self._due.pop(key, None)
                    self._changed.notify_all()

    @staticmethod
    def _renew(batch_id: int, token: str) -> bool:
        """False once the lease is not this worker's any more (swept after a
        stall: the result is dropped at recording)."""
        try:
            return bool(
                update_without_waiting(
                    Batch.objects.filter(pk=batch_id, state=Batch.State.RUNNING, lease_token=token),
                    lease_expires_at=lease_deadline(),
                )
            )
        except DatabaseError as exc:
            # Three quarters of the lease are left: if the database is back
            # before they run out, the batch keeps its worker.
            log.warning("batch %s: cannot renew the lease: %s", batch_id, exc)
            with contextlib.suppress(Exception):
                connection.close()  # the next try connects anew
            return True
        except Exception:  # the thread renews the other leases all the same
            log.exception("batch %s: cannot renew the lease", batch_id)
            return True


renewals = _Renewals()
