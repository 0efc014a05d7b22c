"""The heartbeat that keeps a running batch's lease alive while its worker lives."""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import threading

from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from campaigns.models import Batch
from gpuworker.heartbeat import update_without_waiting

log = logging.getLogger(__name__)


def lease_deadline() -> dt.datetime:
    return timezone.now() + dt.timedelta(seconds=settings.BATCH_LEASE_SECONDS)


class LeaseKeeper:
    """Renews the lease every quarter lease from a thread, until the batch is recorded.

    If this process is killed, the renewals stop with it, the lease runs
    out, and the sweeper requeues the batch. A database that does not answer
    (a restart) does not stop them: the next renewal tries again.
    """

    def __init__(self, batch_id: int, token: str):
        self.batch_id, self.token = batch_id, token
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"lease-{batch_id}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Idempotent: a batch's lease stops when it is recorded, or when it cannot be."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        interval = max(0.2, settings.BATCH_LEASE_SECONDS / 4)
        try:
            while not self._stop.wait(interval):
                try:
                    renewed = update_without_waiting(
                        Batch.objects.filter(
                            pk=self.batch_id, state=Batch.State.RUNNING, lease_token=self.token
                        ),
                        lease_expires_at=lease_deadline(),
                    )
                except DatabaseError as exc:
                    # Three quarters of the lease are left: if the database is
                    # back before they run out, the batch keeps its worker.
                    log.warning("batch %s: cannot renew the lease: %s", self.batch_id, exc)
                    with contextlib.suppress(DatabaseError):
                        connection.close()  # the next try connects anew
                    continue
                if not renewed:
                    return  # swept after a stall: the result is dropped at recording

        finally:
            connection.close()  # this thread's own connection
