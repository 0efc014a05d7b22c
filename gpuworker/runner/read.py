"""A batch's inputs read, checked against their import's hash and prepared
for the model; or taken from what the prefetch prepared, or an output an
earlier claim wrote adopted instead."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from campaigns.intake.inputs import WHOLE, InputBytes, InputError, ReadLimits, read_bytes
from campaigns.intake.record_reads import read_records
from campaigns.intake.records import parse_locator
from campaigns.models import ErrorClass
from gpuworker.processors.base import Processor
from gpuworker.runner.check import NOTHING, Adoption
from gpuworker.runner.claim import Outcome
from gpuworker.runner.prefetch import Prepared
from gpuworker.runner.threads import in_threads

# `prepare_unit`'s answer for a unit that does not go to the model.
SKIP = object()
_NOT_PREPARED = object()


def prepare_unit(
    processor: Processor,
    root: Path,
    real_root: str | None,
    outcome: Outcome,
    adoption: Adoption = NOTHING,
    ahead: Prepared | None = None,
    limits: ReadLimits = WHOLE,
    campaign_name: str = "",
    given: InputBytes | InputError | None = None,
) -> object:
    """The unit's model input, or SKIP when it failed or its output was adopted.

    `adoption`: what an earlier claim of the batch wrote and vouched for
    (check.adoption_for), taken back only once the input read here is the
    unit's. `ahead`: the unit's input as the prefetch prepared it while the
    last batch ran; it goes through the same hash check and adoption as one
    read here. `limits`: how much of the input is read (the version's
    `ProcessorSpec.input_limits`, with the whole file's digest).
    `campaign_name`: said in the remedy of a record unit whose row changed.
    `given`: the input already read (a record's row, `rows_of`), or its error.
    """
    unit = outcome.unit
    try:
        # Prepared bytes other than the import's are read again: only this
        # batch's own reading says an input changed.
        if ahead is not None and (ahead.source_path, ahead.sha256) == (
            unit.source_path,
            unit.sha256 or ahead.sha256,
        ):
            outcome.input_sha256, made = ahead.sha256, ahead.item
            outcome.prefetched = True
        else:
            if isinstance(given, InputError):
                raise given
            data = (
                given
                if given is not None
                else read_bytes(root, unit.source_path, real_root, limits)
            )
            outcome.input_sha256, made = _digest(data), _NOT_PREPARED
        if unit.sha256 and outcome.input_sha256 != unit.sha256:
            raise InputError(
                ErrorClass.INPUT_CHANGED,
                "input changed since import (sha256 differs); "
                "resume --retry-failed processes the new content",
            )
        if adoption.adopt(outcome):
            return SKIP
        if made is _NOT_PREPARED:
            return processor.prepare(data)
        if isinstance(made, InputError):
            raise made
        return made
    except InputError as exc:
        message = exc.message
        if exc.error_class == ErrorClass.INPUT_CHANGED and parse_locator(unit.source_path):
            message = _row_changed(exc, campaign_name)
        outcome.fail(exc.error_class, message)
        return SKIP


def rows_of(
    root: Path, real_root: str | None, units: list[tuple[int, str]], limits: ReadLimits
) -> dict[int, InputBytes | InputError]:
    """{unit pk: its text or InputError} for the record units among `units`
    ((pk, source path) pairs): each record file opened once for all its rows
    (campaigns/intake/record_reads.py `read_records`)."""
    records = [(pk, path, at) for pk, path in units if (at := parse_locator(path)) is not None]
    if not records:
        return {}
    read = read_records(root, [at for _, _, at in records], limits, real_root)
    found: dict[int, InputBytes | InputError] = {}
    for (pk, path, _), data in zip(records, read, strict=True):
        if isinstance(data, InputBytes):
            # As read_bytes leaves it: the row can be read again from its place.
            data._where = (root, path, real_root, limits)
        found[pk] = data
    return found


def _row_changed(exc: InputError, campaign_name: str) -> str:
    """A record unit's input_changed, with its remedy: the import finds each row
    again (by its id) and records its text anew; then the retry runs it."""
    what = exc.message.split("; ", 1)[0]
    if what.startswith("input changed since import (sha256 differs)"):
        what = "the row's text at its recorded place changed since import (sha256 differs)"
    name = campaign_name or "NAME"
    return (
        f"{what}; run `campaign import {name}` (it finds each row again by its id), "
        "then `resume --retry-failed`"
    )


def prepare_ahead(
    processor: Processor,
    root: Path,
    real_root: str | None,
    units: list[tuple[int, str]],
    stop: threading.Event,
    limits: ReadLimits = WHOLE,
) -> dict[int, Prepared]:
    """The prefetch's reader: the units' inputs read, hashed and prepared
    as `prepare_unit` does, without a claim. An input that cannot be read is
    left for the batch's own reading, which classifies it then."""

    rows = rows_of(root, real_root, units, limits)

    def one(unit: tuple[int, str]) -> tuple[int, Prepared] | None:
        pk, source_path = unit
        if stop.is_set():
            return None
        try:
            given = rows.get(pk)
            if isinstance(given, InputError):
                return None
            data = given if given is not None else read_bytes(root, source_path, real_root, limits)
        except InputError:
            return None
        try:
            made = processor.prepare(data)
        except InputError as exc:
            made = exc  # refused now as it would be then: the same bytes
        except Exception:
            return None  # the batch's own prepare raises it, where it is handled
        return pk, Prepared(source_path, _digest(data), made)

    return dict(
        found
        for found in in_threads(one, units, threaded=len(rows) < len(units))
        if found is not None
    )


def _digest(data: bytes) -> str:
    """The whole input's sha256: a cut read's was taken as the rest streamed by."""
    return getattr(data, "sha256", None) or hashlib.sha256(data).hexdigest()
