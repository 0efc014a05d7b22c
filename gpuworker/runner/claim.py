"""A batch's claim: its lease taken by update, its units set running, each
unit's `Outcome` for the phases after to fill."""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from django.utils import timezone

from campaigns.db.batch_statements import claim_batch, claimed_units
from campaigns.models import Batch
from campaigns.review.queue import REVIEWED_OUT, units_release_reviewed
from campaigns.runs.recording import UnitOutcome
from gpuworker.runner.lease import lease_deadline

log = logging.getLogger(__name__)


def worker_name() -> str:
    # Per call: prefork children import this module before they fork.
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass
class Outcome(UnitOutcome):
    """A unit's result (what campaigns records), with where this worker writes it."""

    target: str = ""  # where this unit's output goes, relative to OUTPUT_ROOT
    path: Path | None = None  # the same, absolute (made once: Path parsing adds up)
    prefetched: bool = False  # its input was prepared while the last batch ran


def batch_claim(batch: Batch) -> tuple[str, list[Outcome]] | None:
    """(lease token, an outcome per unit to run) once this worker holds the
    batch, None when it is not runnable (another delivery claimed it)."""
    batch_id = batch.pk
    # Claim by update: a second delivery of the same message finds nothing to do.
    token = uuid.uuid4().hex
    claimed = claim_batch(
        batch_id,
        started_at=timezone.now(),
        worker=worker_name(),
        lease_token=token,
        lease_expires_at=lease_deadline(),
    )
    if not claimed:
        return None
    units = claimed_units(batch_id, batch.version_id, REVIEWED_OUT)
    # A unit a reviewer rejected or requeued under this version is neither run
    # nor adopted under it again: its output here is the one reviewed.
    suspects = [u.pk for u in units if u.reviewed_out]
    released = (
        units_release_reviewed(unit_ids=suspects, version_id=batch.version_id)
        if suspects
        else set()
    )
    if released:
        log.warning(
            "batch %s: %d unit(s) reviewed out under this version, not run", batch_id, len(released)
        )
        units = [u for u in units if u.pk not in released]
    started = time.time()  # one instant for the batch's units: they start together
    return token, [Outcome(unit=u, started=started) for u in units]
