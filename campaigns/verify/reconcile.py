"""verify: the database against the disk, one verdict per unit.

The deliverable of a campaign is this procedure, not a folder that happens to
hold outputs: a file counts only if it is where the unit says, whole, and (with
--deep) has the recorded checksum and content; a missing *input* is never
confused with a missing *output*. A damaged output is set aside (moved under
the version's `.damaged/` folder), so no later run can mistake it for a result.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from campaigns.intake.inputs import InputError, corpus_real_path, input_fd, sha256_of
from campaigns.intake.record_reads import check_record
from campaigns.intake.records import parse_locator
from campaigns.models import (
    INPUT_ERRORS,
    Attempt,
    Batch,
    Campaign,
    ErrorClass,
    Reconciliation,
    Unit,
    UnitState,
)
from campaigns.specs.processors import get_spec
from campaigns.storage.lease_records import batch_of
from campaigns.storage.outputs import InvalidOutput, file_sha256, is_temp_file
from campaigns.storage.paths import (
    DAMAGED_FOLDER,
    LEASES_FOLDER,
    damaged_relpath,
    output_name,
)
from campaigns.storage.row_shards import is_row_shard
from campaigns.storage.vector_shards import MARK, DeepRowCheck, ShardChecker, split_member

log = logging.getLogger(__name__)


class Verdict:
    VALID = "valid"
    OUTPUT_MISSING = "output_missing"
    OUTPUT_INCOMPLETE = "output_incomplete"
    INPUT_MISSING = "input_missing"
    INPUT_CHANGED = "input_changed"
    INPUT_UNREADABLE = "input_unreadable"
    INPUT_INVALID = "input_invalid"
    FAILED = "failed"
    PENDING = "pending"
    IN_PROGRESS = "in_progress"
    NEEDS_REVIEW = "needs_review"

    ALL = (
        VALID,
        OUTPUT_MISSING,
        OUTPUT_INCOMPLETE,
        INPUT_MISSING,
        INPUT_CHANGED,
        INPUT_UNREADABLE,
        INPUT_INVALID,
        FAILED,
        PENDING,
        IN_PROGRESS,
        NEEDS_REVIEW,
    )


#: The verdict of an input the import or the worker failed, or verify finds so.
_INPUT_VERDICTS: dict[str, str] = {
    ErrorClass.INPUT_MISSING: Verdict.INPUT_MISSING,
    ErrorClass.INPUT_CHANGED: Verdict.INPUT_CHANGED,
    ErrorClass.INPUT_UNREADABLE: Verdict.INPUT_UNREADABLE,
    ErrorClass.INPUT_INVALID: Verdict.INPUT_INVALID,
}

SAMPLES_PER_VERDICT = 20
# Under a campaign's output folder: where an adaptation campaign's checkpoints go.
CHECKPOINTS_FOLDER = "checkpoints"
_CHUNK = 2000


@dataclass
class VerifyReport:
    campaign: str
    deep: bool
    counts: Counter = field(default_factory=Counter)
    samples: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))
    orphans: int = 0
    orphan_samples: list[str] = field(default_factory=list)
    stale_temp_removed: int = 0
    damaged_set_aside: int = 0
    corrected: int = 0
    seconds: float = 0.0
    checkpoints: int = 0
    damaged_checkpoints: list[dict] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.counts[v] for v in Verdict.ALL)

    def note(self, verdict: str, uid: str, reason: str = "") -> None:
        self.counts[verdict] += 1
        if len(self.samples[verdict]) < SAMPLES_PER_VERDICT:
            self.samples[verdict].append({"id": uid, "reason": reason})

    def as_dict(self) -> dict:
        return {
            "campaign": self.campaign,
            "total": self.total,
            **{v: self.counts[v] for v in Verdict.ALL},
            "orphan_outputs": self.orphans,
            "stale_temp_files_removed": self.stale_temp_removed,
            "damaged_set_aside": self.damaged_set_aside,
            "corrected": self.corrected,
            "deep": self.deep,
            "seconds": round(self.seconds, 3),
            "samples": {k: v for k, v in self.samples.items() if v},
            "orphan_samples": self.orphan_samples,
            "checkpoints": self.checkpoints,
            "damaged_checkpoints": self.damaged_checkpoints,
        }


_FIELDS = (
    "pk",
    "uid",
    "source_path",
    "size",
    "mtime_ns",
    "sha256",
    "state",
    "error_class",
    "error_message",
    "output_path",
    "output_size",
    "output_sha256",
)


def campaign_verify(*, campaign: Campaign, deep: bool = False) -> VerifyReport:
    """Give every unit one verdict and correct the states the disk contradicts."""
    started = time.perf_counter()
    report = VerifyReport(campaign=campaign.name, deep=deep)
    spec = get_spec(campaign.processor)
    versions = {v.label: v.params for v in campaign.versions.all()}
    suffixes = {spec.suffix(params) for params in versions.values()} or {spec.output_suffix}
    root = Path(campaign.input_root)
    real_root = corpus_real_path(root)  # once a verify, not once an input
    output_root = str(settings.OUTPUT_ROOT)
    fixes: dict[tuple, list[int]] = defaultdict(list)
    # '<shard>/<name>' of every unit: any other file in a version folder is an orphan.
    claimed: set[str] = set()
    shards = ShardChecker(output_root)
    damaged_shards: set[str] = set()

    last_pk = 0
    while True:
        rows = list(
            Unit.objects.filter(campaign=campaign, pk__gt=last_pk)
            .order_by("pk")
            .values_list(*_FIELDS)[:_CHUNK]
        )
        if not rows:
            break
        last_pk = rows[-1][0]
        for row in rows:
            unit = dict(zip(_FIELDS, row, strict=True))
            for suffix in suffixes:
                claimed.add(output_name(unit["uid"], suffix))
            verdict, reason = _judge(unit, spec, versions, (root, real_root), shards, deep)
            if verdict == Verdict.OUTPUT_INCOMPLETE:
                reason = _set_aside(unit, reason, versions, shards, report, damaged_shards)
            report.note(verdict, unit["uid"], reason)
            fix = _correction(unit, verdict, reason)
            if fix is not None:
                fixes[fix].append(unit["pk"])
    report.corrected = _apply(campaign, fixes)
    for rel in sorted(damaged_shards):
        report.damaged_set_aside += _move_aside(Path(output_root), rel) is not None
    claimed.update(_shards_in_use(campaign))
    report.orphans, report.orphan_samples, report.stale_temp_removed = _scan_output_folder(
        campaign, Path(output_root), claimed
    )
    if spec.training:
        report.checkpoints, report.damaged_checkpoints = verify_checkpoints(campaign)
    report.seconds = time.perf_counter() - started
    data = report.as_dict()
    Reconciliation.objects.create(
        campaign=campaign,
        deep=deep,
        seconds=report.seconds,
        counts={k: v for k, v in data.items() if isinstance(v, int)},
        samples={
            **data["samples"],
            _ORPHANS: [{"id": rel, "reason": ""} for rel in report.orphan_samples],
        },
    )
    return report


# The key of the orphan outputs' samples in a stored report (with the verdicts').
_ORPHANS = "orphan_outputs"


def last_report(*, campaign: Campaign) -> tuple[VerifyReport, datetime] | None:
    """The newest stored verify report and when it ran, or None: read back,
    nothing is checked again (a verify moves the damaged units' states, so
    what it found is read here, not found again)."""
    record = campaign.reconciliations.order_by("-created_at", "-pk").first()
    if record is None:
        return None
    counts, samples = record.counts, dict(record.samples)
    report = VerifyReport(
        campaign=campaign.name,
        deep=record.deep,
        counts=Counter({v: counts.get(v, 0) for v in Verdict.ALL}),
        orphans=counts.get(_ORPHANS, 0),
        orphan_samples=[s["id"] for s in samples.pop(_ORPHANS, [])],
        stale_temp_removed=counts.get("stale_temp_files_removed", 0),
        damaged_set_aside=counts.get("damaged_set_aside", 0),
        corrected=counts.get("corrected", 0),
        seconds=record.seconds,
        checkpoints=counts.get("checkpoints", 0),
    )
    report.samples.update(samples)
    return report, record.created_at


def verify_checkpoints(campaign: Campaign) -> tuple[int, list[dict]]:
    """Every kept checkpoint against its sidecar's checksums and its row's record
    of them; a damaged one is marked and never loaded again (a training resumes
    from an earlier one, a version using it fails its batches, saying why). It
    stays in place: a version's model may name its folder, and its batches then
    fail with the reason rather than with a missing folder."""
    from campaigns.models import ModelCheckpoint
    from campaigns.storage.checkpoint_files import against_record, problems

    checked, damaged = 0, []
    for checkpoint in ModelCheckpoint.objects.filter(
        training__campaign=campaign, state=ModelCheckpoint.State.KEPT
    ):
        checked += 1
        folder = Path(settings.OUTPUT_ROOT) / checkpoint.path
        found = problems(folder) or against_record(
            folder,
            weights_sha256=checkpoint.weights_sha256,
            sidecar_sha256=checkpoint.linkage.get("sidecar_sha256", ""),
        )
        if found:
            message = "; ".join(found)
            ModelCheckpoint.objects.filter(pk=checkpoint.pk).update(
                state=ModelCheckpoint.State.DAMAGED, problem=message[:2000]
            )
            damaged.append({"step": checkpoint.step, "problem": message})
    return checked, damaged


def _shards_in_use(campaign: Campaign) -> set[str]:
    """'shards/…/b12-….npz' of every shard a unit's result or an attempt (a
    review item's output) points into; any other shard is an orphan."""
    rels: set[str] = set()
    for model in (Unit, Attempt):
        owner = {"campaign": campaign} if model is Unit else {"unit__campaign": campaign}
        rels.update(
            model.objects.filter(**owner, output_path__contains=MARK)
            .order_by()
            .values_list("output_path", flat=True)
            .distinct()
            .iterator(chunk_size=_CHUNK)
        )
    return {"/".join(split_member(rel)[0].split("/")[2:]) for rel in rels}


def _judge(
    unit, spec, versions, corpus: tuple[Path, str | None], shards: ShardChecker, deep
) -> tuple[str, str]:
    state = unit["state"]
    if state in (UnitState.QUEUED, UnitState.RUNNING):
        return Verdict.IN_PROGRESS, ""
    if state == UnitState.NEEDS_REVIEW:
        return Verdict.NEEDS_REVIEW, ""
    if state == UnitState.FAILED and unit["error_class"] in INPUT_ERRORS:
        verdict = _INPUT_VERDICTS.get(unit["error_class"], Verdict.INPUT_INVALID)
        return verdict, unit["error_message"]

    # The input first: a vanished source is not a vanished result.
    input_verdict = _check_input(unit, *corpus, deep)
    if input_verdict is not None:
        return input_verdict
    if state == UnitState.PENDING:
        # What an earlier verify found ("output missing at verify: …") stays
        # named until the unit runs again, so a second verify still says it.
        return Verdict.PENDING, unit["error_message"]
    if state == UnitState.FAILED:
        return Verdict.FAILED, unit["error_message"]

    if spec.training:
        return Verdict.VALID, ""  # an example, not an output: its input is what counts
    # Succeeded: the output must be there and whole.
    rel = unit["output_path"]
    if not rel:
        return Verdict.OUTPUT_MISSING, "succeeded without an output path"
    file_rel, row = split_member(rel)
    path = os.path.join(shards.root, file_rel)
    parts = rel.split("/")
    params = versions.get(parts[1]) if len(parts) > 1 else None
    try:
        if params is None:
            os.stat(path)  # gone is gone, whatever folder it was recorded in
            raise InvalidOutput(f"output is not under a known parameter version: {rel}")
        if row is not None:
            return _judge_row(unit, spec, params, shards, file_rel, row, deep)
        spec.quick_check(Path(path), unit["output_size"], params)
        if deep:
            if unit["output_sha256"] and file_sha256(path) != unit["output_sha256"]:
                raise InvalidOutput("checksum differs from the one recorded")
            spec.deep_check(Path(path), params)
    except FileNotFoundError:
        return Verdict.OUTPUT_MISSING, f"output file gone: {rel}"
    except InvalidOutput as exc:
        return Verdict.OUTPUT_INCOMPLETE, str(exc)
    return Verdict.VALID, ""


def _judge_row(unit, spec, params, shards: ShardChecker, file_rel: str, row: int, deep):
    """A row of a batch's vector shard: there and this unit's (quick), the very
    vector recorded and still passing its check (deep). Raises as _judge's checks do."""
    check = None
    if deep:
        rows = None
        if is_row_shard(file_rel):
            if spec.record_check is not None:
                rows = functools.partial(_record_problems, spec.record_check, params)
        elif spec.row_check is not None:
            rows = functools.partial(_vector_problems, spec.row_check, params)
        check = DeepRowCheck(sha256=unit["output_sha256"], row_check=rows)
    shards.check(file_rel, row, unit["uid"], expected_size=unit["output_size"], deep=check)
    return Verdict.VALID, ""


def _vector_problems(check, params: dict, vectors) -> list:
    return check(vectors, params)


def _record_problems(check, params: dict, records: list[dict]) -> list:
    """Each JSON row's defect under the processor's record check, or None."""
    problems: list = []
    for record in records:
        try:
            check(record, params)
        except InvalidOutput as exc:
            problems.append(exc)
        else:
            problems.append(None)
    return problems


def _set_aside(unit, reason, versions, shards: ShardChecker, report, damaged_shards) -> str:
    """A damaged output is nobody's result once verify corrects its unit: it is
    moved aside, where no later run adopts it and a person can still look at it.
    Returns the verdict's reason, saying where it went.

    A unit's own file moves now, while its unit is still recorded as succeeded
    and so in no batch. A shard moves once every unit is judged, and only when
    it cannot be read at all: a shard that reads holds other units' valid rows,
    and its damaged row is never adopted (only the batch that wrote a shard
    adopts from it, check.adoption_for)."""
    file_rel, row = split_member(unit["output_path"])
    parts = file_rel.split("/")
    if len(parts) < 3 or parts[1] not in versions:
        return reason  # not in a version folder of this campaign: left where it is
    if row is not None:
        if not shards.damaged_whole(file_rel):
            return reason
        damaged_shards.add(file_rel)
        return f"{reason}; the shard is set aside as {damaged_relpath(file_rel)}"
    aside = _move_aside(Path(shards.root), file_rel)
    if aside is None:
        return reason
    report.damaged_set_aside += 1
    return f"{reason}; set aside as {aside}"


def _move_aside(output_root: Path, rel: str) -> str | None:
    """Move a damaged output under its version's DAMAGED_FOLDER, keeping the
    rest of its path (a newer damaged copy replaces an older one); returns
    where, or None when it could not move (it stays: adoption refuses it anyway)."""
    aside = damaged_relpath(rel)
    if aside is None:
        return None
    try:
        (output_root / aside).parent.mkdir(parents=True, exist_ok=True)
        os.replace(output_root / rel, output_root / aside)
    except OSError as exc:
        log.warning("cannot set the damaged output %s aside: %s", rel, exc)
        return None
    return aside


def _check_input(unit, root: Path, real_root: str | None, deep: bool) -> tuple[str, str] | None:
    """The input's verdict where something is wrong with it: opened by the
    rules the worker reads it by (campaigns/intake/inputs.py), so a FIFO, a
    device, a folder or a symlink out of the corpus in an input's place is
    input_invalid with the worker's reason, and no read waits or runs on."""
    if not unit["source_path"]:
        return None
    if "#" in unit["source_path"] and (row := parse_locator(unit["source_path"])):
        return check_record(root, real_root, row, unit["sha256"], deep)  # a row of a records file
    try:
        fd = input_fd(root, unit["source_path"], real_root)
    except InputError as exc:
        return _INPUT_VERDICTS.get(exc.error_class, Verdict.INPUT_INVALID), exc.message
    try:
        st = os.fstat(fd)
        if unit["size"] is not None and st.st_size != unit["size"]:
            return Verdict.INPUT_CHANGED, f"input size {st.st_size} bytes, recorded {unit['size']}"
        # Same size: a new mtime (or --deep) earns a checksum, which decides.
        touched = unit["mtime_ns"] is not None and st.st_mtime_ns != unit["mtime_ns"]
        if (deep or touched) and unit["sha256"]:
            try:
                sha256 = sha256_of(fd, st.st_size)
            except OSError as exc:
                return Verdict.INPUT_UNREADABLE, f"cannot read input: {exc.strerror or exc}"
            if sha256 != unit["sha256"]:
                return Verdict.INPUT_CHANGED, "input content changed since import (sha256 differs)"
    finally:
        os.close(fd)
    return None


def _correction(unit, verdict: str, reason: str) -> tuple | None:
    """The state the disk says the unit is in, as (state, error_class, message, clear_output)."""
    if verdict in (Verdict.OUTPUT_MISSING, Verdict.OUTPUT_INCOMPLETE):
        # Recomputed by resume; the old result is no result.
        return (UnitState.PENDING, "", f"{verdict.replace('_', ' ')} at verify: {reason}", True)
    if verdict == Verdict.INPUT_MISSING and unit["error_class"] != ErrorClass.INPUT_MISSING:
        return (UnitState.FAILED, ErrorClass.INPUT_MISSING, reason, False)
    if verdict == Verdict.INPUT_CHANGED and unit["error_class"] != ErrorClass.INPUT_CHANGED:
        message = f"{reason} (resume --retry-failed processes the new content)"
        return (UnitState.FAILED, ErrorClass.INPUT_CHANGED, message, False)
    if verdict == Verdict.INPUT_UNREADABLE and unit["error_class"] != ErrorClass.INPUT_UNREADABLE:
        return (UnitState.FAILED, ErrorClass.INPUT_UNREADABLE, reason, False)
    if verdict == Verdict.INPUT_INVALID and unit["state"] != UnitState.FAILED:
        return (UnitState.FAILED, ErrorClass.INPUT_INVALID, reason, False)
    return None


def _apply(campaign: Campaign, fixes: dict[tuple, list[int]]) -> int:
    corrected = 0
    now = timezone.now()
    for (state, error_class, message, clear_output), pks in fixes.items():
        values = {
            "state": state,
            "error_class": error_class,
            "error_message": message,
            "updated_at": now,
        }
        if clear_output:
            values.update(output_path="", output_size=None, output_sha256="")
        for start in range(0, len(pks), 1000):
            with transaction.atomic():
                # Never overwrite a unit a worker took meanwhile.
                corrected += (
                    Unit.objects.filter(pk__in=pks[start : start + 1000], campaign=campaign)
                    .exclude(state__in=(UnitState.QUEUED, UnitState.RUNNING))
                    .update(**values)
                )
    return corrected


def _scan_output_folder(
    campaign: Campaign, output_root: Path, claimed: set[str]
) -> tuple[int, list[str], int]:
    """Orphan outputs (files no unit would write) and stale temp files (removed)."""
    folder = output_root / campaign.name
    if not folder.is_dir():
        return 0, [], 0
    labels = {version.label for version in campaign.versions.all()}
    busy = Batch.objects.filter(
        campaign=campaign, state=Batch.State.RUNNING, lease_expires_at__gt=timezone.now()
    ).exists()
    lease_age = settings.BATCH_LEASE_SECONDS
    orphans, removed = 0, 0
    samples: list[str] = []
    now = time.time()
    cut = len(str(output_root)) + 1
    live: set[int] | None = None
    for dirpath, dirs, files in os.walk(folder):
        if dirpath == str(folder):
            # An adaptation campaign's checkpoints: checked by checksum below, not units' outputs.
            dirs[:] = [d for d in dirs if d != CHECKPOINTS_FOLDER]
        elif LEASES_FOLDER in dirs or DAMAGED_FOLDER in dirs:
            # Set aside, or a claim's record of what it wrote: no unit's output.
            if LEASES_FOLDER in dirs:
                if live is None:
                    live = _live_batches(campaign)
                removed += _remove_finished_records(Path(dirpath) / LEASES_FOLDER, live)
            dirs[:] = [d for d in dirs if d not in (LEASES_FOLDER, DAMAGED_FOLDER)]
        for name in files:
            path = os.path.join(dirpath, name)
            if is_temp_file(name):
                # A live batch may be writing it right now; a crash's leftovers are old.
                try:
                    if not busy or now - os.stat(path).st_mtime > lease_age:
                        os.unlink(path)
                        removed += 1
                except FileNotFoundError:
                    pass
                continue
            rel = path[cut:]
            parts = rel.split(os.sep)
            in_place = len(parts) >= 4 and parts[1] in labels
            if not (in_place and "/".join(parts[2:]) in claimed):
                orphans += 1
                if len(samples) < SAMPLES_PER_VERDICT:
                    samples.append(rel)
    return orphans, samples, removed


def _live_batches(campaign: Campaign) -> set[int]:
    return set(
        Batch.objects.filter(
            campaign=campaign, state__in=(Batch.State.QUEUED, Batch.State.RUNNING)
        ).values_list("pk", flat=True)
    )


def _remove_finished_records(folder: Path, live: set[int]) -> int:
    """Lease records of batches no longer queued or running: recorded (their
    worker could not remove them) or given up; no claim will adopt from them."""
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return 0  # not listable: its records stay, and only their own batch reads them
    for entry in entries:
        batch_id = batch_of(entry.name)
        if batch_id is not None and batch_id not in live:
            try:
                os.unlink(entry.path)
                removed += 1
            except OSError:
                pass  # gone already, or a folder of that name: no record a claim wrote
    return removed
