"""The next batch's inputs, read and prepared while the model runs this one.

Without it the device waits, between two batches, for the next batch's files
to be read, hashed and decoded (an image's decode and resize take longer than
its forward pass on a GPU). While batch N's model runs, a thread of the worker
process guesses the batch it will run next — the campaign's lowest queued
batch of the same version after N, as the dispatcher sends them in that order
— and prepares its inputs. When that batch's task comes, the units it claimed
take their prepared input instead of reading it; a guess that was wrong (a
peer process claimed that batch) is dropped and costs only the CPU it used.

Nothing is claimed or recorded here: the batch's own task still claims it,
checks every input's hash against its import and adopts what a dead worker
wrote, so a prefetch can be lost at any moment without losing anything.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from django.db import connection

from campaigns.models import Batch, Unit, UnitState

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Prepared:
    """One unit's input, read and prepared ahead of its batch."""

    source_path: str
    sha256: str
    item: object  # what the processor's prepare returned, or the InputError it raised


# (unit pk, source path) pairs, and an event set when the reading should stop
# -> {unit pk: Prepared} of those it prepared.
Reader = Callable[[list[tuple[int, str]], threading.Event], dict[int, Prepared]]


class _Guess:
    """One prefetch: which batch it guessed (once known), and a way to stop it."""

    def __init__(self) -> None:
        self.batch_id: int | None = None
        self.known = threading.Event()
        self.stop = threading.Event()
        self.future: Future[dict[int, Prepared]] | None = None


class InputPrefetch:
    """One guess at a time, in one thread of the worker process."""

    def __init__(self) -> None:
        self._forget()
        # A process forked from this one (a pool child) has none of its
        # threads: its own is made on its first batch.
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._pool: ThreadPoolExecutor | None = None
        self._guess: _Guess | None = None  # the one not yet taken
        self._last: _Guess | None = None  # the one last started, taken or not

    def start(self, batch: Batch, read: Reader) -> None:
        """Begin preparing the batch likely to follow `batch` in this process.

        One thread: a guess that turned out wrong finishes (stopped) before
        the next one starts, so two never hold the processor's inputs at once.
        """
        if self._guess is not None:
            self._guess.stop.set()
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="input-prefetch")
        guess = self._guess = self._last = _Guess()
        guess.future = self._pool.submit(self._prepare_next, batch, read, guess)

    def take(self, batch_id: int) -> dict[int, Prepared]:
        """The prepared inputs of `batch_id` if it was the guess (waiting for
        the rest of them: they are under way), else none, at once."""
        guess, self._guess = self._guess, None
        if guess is None:
            return {}
        guess.known.wait()
        if guess.batch_id != batch_id:
            guess.stop.set()
            return {}
        assert guess.future is not None  # set by start, with the guess
        return guess.future.result()

    def drop(self) -> None:
        """Stop the guess under way, taken (a wrong one) or not, and wait for
        its thread (worker shutdown)."""
        guess, self._guess, self._last = self._last, None, None
        if guess is not None:
            guess.stop.set()
            assert guess.future is not None  # set by start, with the guess
            guess.future.result()

    @staticmethod
    def _prepare_next(batch: Batch, read: Reader, guess: _Guess) -> dict[int, Prepared]:
        try:
            try:
                guess.batch_id = next_queued_batch(batch)
                units = queued_inputs(guess.batch_id) if guess.batch_id else []
            finally:
                # This thread's connection, once a guess: a worker keeps no idle
                # one for it, and one broken by a database restart is not reused.
                connection.close()
                guess.known.set()
            return read(units, guess.stop) if units else {}
        except Exception:
            # A guess is an optimisation: the batch's own task reads what it must.
            log.warning("could not prefetch the batch after %s", batch.pk, exc_info=True)
            return {}


def next_queued_batch(batch: Batch) -> int | None:
    return (
        Batch.objects.filter(
            campaign_id=batch.campaign_id,
            version_id=batch.version_id,
            state=Batch.State.QUEUED,
            pk__gt=batch.pk,
        )
        .order_by("pk")
        .values_list("pk", flat=True)
        .first()
    )


def queued_inputs(batch_id: int) -> list[tuple[int, str]]:
    return list(
        Unit.objects.filter(batch_id=batch_id, state=UnitState.QUEUED)
        .order_by("pk")
        .values_list("pk", "source_path")
    )


prefetch = InputPrefetch()
