"""Everything that writes campaign data. Views, commands and tasks call these."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from celery import current_app as celery_app
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Count, Max, Q, QuerySet
from django.utils import timezone
from django.utils.text import slugify

from campaigns.db.row_updates import update_rows
from campaigns.intake.importing import ImportReport, file_identity, import_folder, import_manifest
from campaigns.models import (
    INPUT_ERRORS,
    Batch,
    Campaign,
    ErrorClass,
    ParameterVersion,
    Project,
    Unit,
    UnitState,
)
from campaigns.review.queue import run_allowance, units_reviewed_out, units_runnable
from campaigns.runs.batching import plan_batches
from campaigns.specs import model_files
from campaigns.specs.processors import get_spec
from campaigns.specs.software import processor_software, software_versions
from campaigns.storage.paths import resolve_input
from campaigns.storage.vector_shards import split_member
from campaigns.verify.reconcile import campaign_verify

RUN_BATCH_TASK = "gpuworker.tasks.run_batch"
# The queue batches go to (CELERY_TASK_ROUTES).
BATCH_QUEUE = "gpu"
# Names the campaign pages' URLs use for themselves.
RESERVED_NAMES = {"new"}

log = logging.getLogger(__name__)


def fingerprint(*, processor: str, params: dict[str, Any], software: dict[str, str]) -> str:
    canonical = json.dumps(
        {"processor": processor, "params": params, "software": software},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def version_create(*, campaign: Campaign, params: dict[str, Any] | None = None) -> ParameterVersion:
    """The version for these parameters and this software: the existing one if identical."""
    spec = get_spec(campaign.processor)
    cleaned = spec.clean(params)
    software = {**software_versions(), **processor_software(spec.implementation)}
    files = model_files.digests(spec.model_params, cleaned)
    if files:
        # Part of the fingerprint: the same path holding another model is another version.
        software["files"] = files
    fp = fingerprint(processor=campaign.processor, params=cleaned, software=software)
    with transaction.atomic():
        Campaign.objects.select_for_update().filter(pk=campaign.pk).first()
        version = ParameterVersion.objects.filter(campaign=campaign, fingerprint=fp).first()
        if version is None:
            last = campaign.versions.aggregate(n=Max("number"))["n"] or 0
            version = ParameterVersion.objects.create(
                campaign=campaign,
                number=last + 1,
                params=cleaned,
                software=software,
                fingerprint=fp,
            )
        if campaign.current_version_id != version.pk:
            campaign.current_version = version
            campaign.save(update_fields=["current_version"])
            _holdout_to_pending(campaign=campaign, version=version)
    return version


def _holdout_to_pending(*, campaign: Campaign, version: ParameterVersion) -> int:
    """The holdout goes back to pending under a new current version: it is part
    of every version's first group, so the checkpoint can compare versions.

    Their earlier outputs stay where they are (the output path holds the
    version label) and in their attempts, which the holdout report reads;
    review items about them no longer move the unit (review._unit_follows).
    Inputs known missing or changed wait for resume --retry-failed as before.
    """
    return (
        Unit.objects.filter(
            campaign=campaign,
            holdout=True,
            state__in=(UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW, UnitState.FAILED),
        )
        .exclude(error_class__in=INPUT_ERRORS)
        .exclude(batch__version=version)
        .update(
            state=UnitState.PENDING,
            error_class="",
            error_message="",
            batch=None,
            output_path="",
            output_size=None,
            output_sha256="",
            updated_at=timezone.now(),
        )
    )


def campaign_create(
    *,
    name: str,
    processor: str,
    project: Project,
    input_folder: Path | None = None,
    manifest: Path | None = None,
    input_root: Path | None = None,
    params: dict[str, Any] | None = None,
    checkpoint_after: int | None = None,
    holdout_share: float = 0.05,
) -> tuple[Campaign, ImportReport]:
    """Create a campaign, its first parameter version, and import its units.

    checkpoint_after: units before the checkpoint (None: max(1%, 200); 0: none).
    """
    if slugify(name) != name:
        raise ValidationError(
            f"campaign name {name!r} must be lowercase letters, digits and dashes "
            f"(for example {slugify(name) or 'my-campaign'!r})"
        )
    if name in RESERVED_NAMES:
        raise ValidationError(f"{name!r} is a reserved word; choose another name")
    if Campaign.objects.filter(name=name).exists():
        raise ValidationError(f"a campaign named {name!r} exists already")
    if (input_folder is None) == (manifest is None):
        raise ValidationError("give either an input folder or a manifest")
    if not 0 <= holdout_share < 1:
        raise ValidationError("holdout share is a fraction between 0 and 1 (0.05 = 5%)")
    spec = get_spec(processor)
    # Bad parameters, and a model file that is not there, refused before anything is written.
    model_files.digests(spec.model_params, spec.clean(params))
    if manifest is not None:
        root = (input_root or manifest.parent).resolve()
    else:
        root = input_folder.resolve()
    campaign = Campaign.objects.create(
        project=project,
        name=name,
        processor=processor,
        input_root=str(root),
        checkpoint_after=checkpoint_after,
        holdout_share=holdout_share,
    )
    version_create(campaign=campaign, params=params)
    report = campaign_import(campaign=campaign, manifest=manifest)
    return campaign, report


def campaign_import(*, campaign: Campaign, manifest: Path | None = None) -> ImportReport:
    if manifest is not None:
        return import_manifest(campaign, manifest)
    return import_folder(campaign)


def campaign_run(*, campaign: Campaign) -> int:
    """Group the pending units into batches and enqueue one task per batch.

    The version's batch_policy decides the grouping (campaigns/runs/batching.py).
    Returns the number of batches enqueued. A task carries the batch id only
    and is sent after its slice of the plan commits, so a worker never looks
    for a row that is not there yet.
    """
    return _run(campaign, slices=None, since=timezone.now())[0]


#: The task that plans the rest of a run a web request started.
PLAN_TASK = "campaigns.tasks.plan_campaign"


def campaign_start(*, campaign: Campaign) -> tuple[int, bool]:
    """campaign_run for a web request: the first slice now, the rest planned by
    a `portal` worker (PLAN_TASK), so that starting a million-unit campaign
    answers in seconds instead of outliving the web server's timeout.

    Returns the batches queued now, and whether more are being planned.
    """
    since = timezone.now()
    batches, more = _run(campaign, slices=1, since=since)
    if more:
        args = [campaign.pk, since.isoformat()]
        transaction.on_commit(lambda: celery_app.send_task(PLAN_TASK, args=args))
    return batches, more


def campaign_run_rest(*, campaign: Campaign, since: dt.datetime) -> int:
    """The rest of the run campaign_start began at `since`, unless paused since."""
    # Its first slice went out with the request: the rest goes in full slices.
    return _run(campaign, slices=None, since=since, small_first=False)[0]


def _run(
    campaign: Campaign, *, slices: int | None, since: dt.datetime, small_first: bool = True
) -> tuple[int, bool]:
    """campaign_run, stopping after `slices` slices (None: all), or at a Pause
    after `since` (when the run was asked for); returns the batches queued and
    whether pending units were left for later. `small_first`: the first slice
    is FIRST_SLICE_UNITS, not RUN_SLICE_UNITS."""
    version = campaign.current_version
    if version is None:
        raise ValidationError(f"campaign {campaign.name} has no parameter version")
    if get_spec(campaign.processor).training:
        raise ValidationError(
            f"{campaign.name} is an adaptation campaign: it trains (campaign train), "
            "it has no batches to run"
        )
    policy = version.params.get("batch_policy", "original")
    # Not units a reviewer rejected or requeued under this version: they wait for another.
    pending_units = units_runnable(campaign=campaign, version=version)
    if not pending_units.exists():
        return 0, False
    # Before the checkpoint only the first group goes: `allowance` units outside
    # the holdout, and the pending holdout units (the checkpoint reports on them
    # but never samples them); a pending or failed checkpoint says why not.
    allowance = run_allowance(campaign=campaign, version=version)
    if allowance == 0 and not pending_units.filter(holdout=True).exists():
        return 0, False
    weighs = policy != "original"
    if allowance is not None:
        # Before the checkpoint: the first group (a few per cent), in one go.
        if weighs:
            within = _first_group(pending_units, allowance)
            measure_costs(campaign=campaign, params=version.params, within=within)
        outside = pending_units.filter(holdout=False).order_by("pk")
        sent = _plan_and_send(
            campaign=campaign,
            version=version,
            since=since,
            pending=lambda: sorted(
                [
                    *pending_units.filter(holdout=True).values_list("pk", "cost"),
                    *outside.values_list("pk", "cost")[:allowance],
                ]
            ),
        )
        return sent, False
    # A slice at a time, each weighed, planned, claimed and committed (so its
    # batches are sent) before the next: the workers start on the first
    # batches while the rest of a large campaign is still being weighed.
    sent, after, planned = 0, 0, 0
    while True:
        rest = pending_units.filter(pk__gt=after).order_by("pk")
        if planned == slices:
            return sent, rest.exists()
        first = small_first and not planned
        size = min(FIRST_SLICE_UNITS, RUN_SLICE_UNITS) if first else RUN_SLICE_UNITS
        ids = list(rest.values_list("pk", flat=True)[:size])
        if not ids or _paused_since(campaign, since):
            return sent, False
        planned += 1
        in_slice = Q(pk__gte=ids[0], pk__lte=ids[-1])
        after = ids[-1]
        if weighs:
            measure_costs(campaign=campaign, params=version.params, within=in_slice)
        units = pending_units.filter(in_slice).order_by("pk")
        sent += _plan_and_send(
            campaign=campaign,
            version=version,
            since=since,
            pending=lambda units=units: list(units.values_list("pk", "cost")),
        )


#: Pending units planned and sent per transaction. Grouping by length within a
#: slice of this size pads as little as over the whole campaign, and a million
#: units reach the workers a slice at a time instead of after the whole plan.
RUN_SLICE_UNITS = 50_000
#: A run's first slice is smaller: weighing and planning 50,000 texts took
#: 11-17 s here (bench/start_latency.py), the workers idle and, when the
#: campaign page's Start ran it, the request waiting; 5,000 take 1-2 s. Its
#: units are grouped among themselves, which pads them a little more.
FIRST_SLICE_UNITS = 5_000


def _paused_since(campaign: Campaign, since: dt.datetime, *, hold: bool = False) -> bool:
    """Whether a Pause came since `since`. With `hold` (inside a slice's
    transaction) the campaign's row stays locked until that transaction ends:
    a Pause then waits for the slice to commit and takes its batches back,
    instead of landing between this check and the commit and missing them."""
    campaigns = Campaign.objects.filter(pk=campaign.pk)
    if hold:
        # FOR NO KEY UPDATE: it waits for, and holds off, campaign_pause's
        # update of the row, but not the inserts whose foreign key names it.
        campaigns = campaigns.select_for_update(no_key=True)
    paused_at = campaigns.values_list("paused_at", flat=True).get()
    return paused_at is not None and paused_at >= since


def _plan_and_send(
    *, campaign: Campaign, version: ParameterVersion, since: dt.datetime, pending
) -> int:
    """Plan `pending()` (its (id, cost) rows, read in the transaction) into
    batches, claim their units, and enqueue the batches once committed;
    nothing if a Pause came since the run was asked for."""
    created: list[int] = []
    with transaction.atomic():
        group: list[list[int]] = []
        for ids in plan_batches(pending(), version.params):
            group.append(ids)
            if sum(map(len, group)) >= _CLAIM_UNITS:
                created += _batches_claim(campaign=campaign, version=version, group=group)
                group = []
        if group:
            created += _batches_claim(campaign=campaign, version=version, group=group)
        if _paused_since(campaign, since, hold=True):
            # Paused while this slice was planned: none of it is queued.
            transaction.set_rollback(True)
            return 0
        transaction.on_commit(lambda: _enqueue(created))
    return len(created)


def _first_group(pending_units: QuerySet[Unit], allowance: int) -> Q | None:
    """The units a run before the checkpoint plans (the holdout and the first
    `allowance` others), so that only they are weighed: a million-unit
    campaign's first group starts without tokenizing the other 95 %.
    None: fewer pending units than that, all of them."""
    if allowance == 0:
        return Q(holdout=True)
    outside = pending_units.filter(holdout=False).order_by("pk").values_list("pk", flat=True)
    edge = list(outside[allowance - 1 : allowance])
    return Q(holdout=True) | Q(pk__lte=edge[0]) if edge else None


# Units claimed per statement. Small enough that PostgreSQL probes the primary
# key for each rather than scanning the table, and that SQLite's variable limit
# holds; large enough that a million units take a thousand statements, not the
# 62,500 of one batch at a time (some 4 ms each: an INSERT, an UPDATE, a trigger).
_CLAIM_UNITS = 1000


def _batches_claim(
    *, campaign: Campaign, version: ParameterVersion, group: list[list[int]]
) -> list[int]:
    """Create one Batch per id list and claim its pending units for it, set-based.

    Claim-by-update as before (only units still pending), so a unit another
    run took meanwhile stays with that run and its batch is the smaller.
    """
    policy = version.params.get("batch_policy", "original")
    batches = Batch.objects.bulk_create(
        [Batch(campaign=campaign, version=version, size=len(ids), policy=policy) for ids in group]
    )
    pairs = [(pk, batch.pk) for batch, ids in zip(batches, group, strict=True) for pk in ids]
    meta = Unit._meta
    quote = connection.ops.quote_name
    table, pk = quote(meta.db_table), quote(meta.pk.column)
    state = quote(meta.get_field("state").column)
    rows = ", ".join(["(%s, %s)"] * len(pairs))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {state} = %s, {quote(meta.get_field('batch').column)} = "
            f"v.column2 FROM (VALUES {rows}) AS v WHERE {table}.{pk} = v.column1 "
            f"AND {table}.{state} = %s",
            [UnitState.QUEUED, *(x for pair in pairs for x in pair), UnitState.PENDING],
        )
        claimed = cursor.rowcount
    if claimed != len(pairs):
        counts = dict(
            Unit.objects.filter(batch__in=batches)
            .values("batch")
            .annotate(n=Count("pk"))
            .values_list("batch", "n")
        )
        short = [b for b in batches if counts.get(b.pk, 0) != b.size]
        for batch in short:
            batch.size = counts.get(batch.pk, 0)
        Batch.objects.bulk_update(short, ["size"])
    return [batch.pk for batch in batches]


#: Units weighed per query and per update statement.
COST_CHUNK = 1000


def measure_costs(
    *, campaign: Campaign, params: dict, pending_only: bool = True, within: Q | None = None
) -> int:
    """Fill Unit.cost (tokens, pixels) for units that have none yet (pending ones,
    or all of them for a profile, which weighs the whole corpus; `within`: only
    those units)."""
    spec = get_spec(campaign.processor)
    if spec.cost is None and spec.costs is None:
        return 0
    basis = spec.cost_basis(params)
    if campaign.cost_basis != basis:
        # Weighed under other parameters (another tokenizer, another token
        # cap), or never: those costs would mislead the batch planner.
        with transaction.atomic():
            Unit.objects.filter(campaign=campaign, cost__isnull=False).update(cost=None)
            Campaign.objects.filter(pk=campaign.pk).update(cost_basis=basis)
        campaign.cost_basis = basis
    root = Path(campaign.input_root)
    todo = Unit.objects.filter(campaign=campaign, cost__isnull=True)
    if pending_only:
        todo = todo.filter(state=UnitState.PENDING)
    if within is not None:
        todo = todo.filter(within)
    measured, after = 0, 0
    # By id from the last chunk's end: skipping the units already weighed
    # would make each chunk's query longer than the last.
    while chunk := list(
        todo.filter(pk__gt=after).order_by("pk").values_list("pk", "source_path")[:COST_CHUNK]
    ):
        after = chunk[-1][0]
        # One statement a chunk (row_updates.py): bulk_update's CASE
        # expressions cost half of this function's time.
        weights = spec.weigh(root, [path for _, path in chunk], params)
        # Unreadable, or outside the corpus: the worker classifies it; it weighs nothing.
        update_rows(
            Unit,
            ["cost"],
            [(pk, 1 if w is None else w) for (pk, _), w in zip(chunk, weights, strict=True)],
        )
        measured += len(chunk)
    return measured


def campaign_pause(*, campaign: Campaign) -> int:
    """Take back the batches no worker started yet; running ones finish.

    Their units return to pending, so Resume (or run) enqueues them again.
    Returns the number of units taken back.
    """
    with transaction.atomic():
        # A run still planning (campaign_run's slices) stops at this mark.
        Campaign.objects.filter(pk=campaign.pk).update(paused_at=timezone.now())
        waiting = list(
            Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).values_list(
                "pk", flat=True
            )
        )
        # Guarded by state: a batch a worker claimed meanwhile stays its.
        cancelled = Batch.objects.filter(pk__in=waiting, state=Batch.State.QUEUED).update(
            state=Batch.State.CANCELLED, error="paused before a worker took it"
        )
        if not cancelled:
            return 0
        return Unit.objects.filter(
            batch_id__in=waiting, batch__state=Batch.State.CANCELLED, state=UnitState.QUEUED
        ).update(state=UnitState.PENDING, batch=None)


def batches_requeue_expired(*, campaign: Campaign | None = None) -> list[int]:
    """Put running batches whose lease expired back in the queue.

    Their worker died (SIGKILL, machine gone) without the broker necessarily
    knowing: the filesystem transport, for one, has already forgotten the
    message. The lease in the database is what guarantees nothing is lost.

    The periodic sweep (no campaign) also sends again the task of queued
    batches whose message the broker lost (batches_resend_lost); resume does
    that for its campaign by itself.
    """
    if campaign is None:
        batches_resend_lost()
    expired = Batch.objects.filter(state=Batch.State.RUNNING, lease_expires_at__lt=timezone.now())
    if campaign is not None:
        expired = expired.filter(campaign=campaign)
    requeued: list[int] = []
    for batch in expired.only("pk", "lease_token", "worker", "deliveries"):
        if batch.deliveries >= settings.BATCH_MAX_DELIVERIES:
            _fail_poison_batch(batch)
            continue
        with transaction.atomic():
            # Guarded by the token: a late heartbeat or a finishing worker wins.
            taken = Batch.objects.filter(
                pk=batch.pk, state=Batch.State.RUNNING, lease_token=batch.lease_token
            ).update(
                state=Batch.State.QUEUED,
                lease_token="",
                lease_expires_at=None,
                error=f"lease expired: worker {batch.worker} stopped renewing it; requeued",
            )
            if not taken:
                continue
            Unit.objects.filter(batch_id=batch.pk, state=UnitState.RUNNING).update(
                state=UnitState.QUEUED
            )
            requeued.append(batch.pk)
    if requeued:
        transaction.on_commit(lambda: _enqueue(requeued))
    return requeued


def batches_resend_lost(*, grace: float | None = None, confirm_after: float = 1.0) -> list[int]:
    """Send again the task of queued batches whose message the broker no longer holds.

    A broker restarted without persistence (Redis with appendonly no), a queue
    purged by hand, a worker that died after taking a message but before
    claiming its batch (Redis keeps that message aside for visibility_timeout):
    the batch stays queued and no message will ever start it. No lease covers
    it, since nobody claimed it. The broker only tells how many messages wait,
    so: when the queue holds fewer than there are batches queued for longer
    than `grace` (default: one lease), some of them have none, and all of them
    are sent again. A batch that still had its message runs once all the same:
    the second message finds it claimed and returns quietly.

    The shortfall must hold twice, `confirm_after` seconds apart: a worker that
    has just taken a message has not claimed its batch yet, for a few
    milliseconds, and that alone must not double the queue.
    """
    grace = settings.BATCH_LEASE_SECONDS if grace is None else grace
    for check in range(2):
        if check:
            time.sleep(confirm_after)
        waiting = broker_queue_waiting(BATCH_QUEUE)
        stale = Batch.objects.filter(
            state=Batch.State.QUEUED, created_at__lt=timezone.now() - dt.timedelta(seconds=grace)
        )
        queued = stale.count()
        if not queued or waiting is None or waiting >= queued:
            return []
    resend = list(stale.order_by("pk").values_list("pk", flat=True))
    log.warning(
        "%s batches queued, %s messages in the broker's %s queue: sending again %s",
        queued,
        waiting,
        BATCH_QUEUE,
        resend,
    )
    _enqueue(resend)
    return resend


def broker_queue_waiting(queue: str) -> int | None:
    """Messages waiting in `queue` (not those a worker holds), or None when the
    broker does not answer. A passive declare tells it on Redis, RabbitMQ and
    the filesystem transport alike."""
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, timeout=5)
            try:
                return conn.default_channel.queue_declare(queue=queue, passive=True).message_count
            except conn.channel_errors:
                return 0  # Redis drops an empty list; RabbitMQ: a queue never declared
    except Exception:  # noqa: BLE001 — a broker that does not answer cannot say
        return None


def _fail_poison_batch(batch: Batch) -> None:
    """A batch whose worker died every time it ran it: its units fail, the rest goes on."""
    message = (
        f"the worker died {batch.deliveries} times while running this batch "
        f"(last: {batch.worker}); killed, or out of host memory?"
    )
    with transaction.atomic():
        taken = Batch.objects.filter(
            pk=batch.pk, state=Batch.State.RUNNING, lease_token=batch.lease_token
        ).update(state=Batch.State.FAILED, lease_token="", lease_expires_at=None, error=message)
        if taken:
            Unit.objects.filter(batch_id=batch.pk, state=UnitState.RUNNING).update(
                state=UnitState.FAILED,
                error_class=ErrorClass.PROCESSING_ERROR,
                error_message=message,
            )


def campaign_resume(*, campaign: Campaign, retry_failed: bool = False):
    """verify, then enqueue only what needs it: pending, output missing or incomplete.

    Failed units stay failed unless retry_failed; a changed input is then
    recorded anew and its old output removed, so old and new never mix.
    Queued batches get their task sent again (a message lost with a crashed
    web process or broker); a duplicate message is a no-op for the worker.
    """
    batches_requeue_expired(campaign=campaign)
    report = campaign_verify(campaign=campaign)
    retried = _reset_failed(campaign) if retry_failed else 0
    # An output that could not be written (disk full) says nothing about the
    # input: like a missing output, it is done again.
    retried += Unit.objects.filter(
        campaign=campaign, state=UnitState.FAILED, error_class=ErrorClass.OUTPUT_WRITE_ERROR
    ).update(state=UnitState.PENDING, error_class="", error_message="")
    resent = list(
        Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).values_list(
            "pk", flat=True
        )
    )
    if resent:
        transaction.on_commit(lambda: _enqueue(resent))
    if get_spec(campaign.processor).training:
        # An adaptation campaign resumes its training (adaptation.training_start).
        return report, retried, len(resent)
    enqueued = campaign_run(campaign=campaign)
    return report, retried, enqueued + len(resent)


def _reset_failed(campaign: Campaign) -> int:
    failed = Unit.objects.filter(campaign=campaign, state=UnitState.FAILED)
    root = Path(campaign.input_root)
    for unit in failed.filter(error_class=ErrorClass.INPUT_CHANGED):
        try:
            size, mtime_ns, sha256 = file_identity(resolve_input(root, unit.source_path))
        except (OSError, ValueError):
            continue  # gone or unreadable: it stays failed, verify says why
        if unit.output_path and split_member(unit.output_path)[1] is None:
            # Made from the old bytes: it must not be adopted as the new result.
            # (A row of a batch's shard is adopted only by that batch again.)
            (Path(settings.OUTPUT_ROOT) / unit.output_path).unlink(missing_ok=True)
        Unit.objects.filter(pk=unit.pk).update(
            size=size,
            mtime_ns=mtime_ns,
            sha256=sha256,
            output_path="",
            output_size=None,
            output_sha256="",
        )
    # Inputs that are still missing cannot be retried; nor can outputs a
    # reviewer rejected under the current version (they run again under a new
    # one: the same parameters would adopt or remake the rejected output).
    retryable = failed.exclude(error_class=ErrorClass.INPUT_MISSING)
    if campaign.current_version_id:
        retryable = retryable.exclude(
            error_class=ErrorClass.REJECTED_BY_REVIEW,
            pk__in=units_reviewed_out(
                campaign_id=campaign.pk, version_id=campaign.current_version_id
            ),
        )
    retried = retryable.update(state=UnitState.PENDING, error_class="", error_message="")
    for unit in failed.filter(error_class=ErrorClass.INPUT_MISSING).only("pk", "source_path"):
        try:
            resolve_input(root, unit.source_path).stat()
        except (OSError, ValueError):
            continue
        retried += Unit.objects.filter(pk=unit.pk).update(
            state=UnitState.PENDING, error_class="", error_message=""
        )
    return retried


def _enqueue(batch_ids: list[int]) -> None:
    for batch_id in batch_ids:
        # By name: the web process must not import gpuworker (and so torch).
        celery_app.send_task(RUN_BATCH_TASK, args=[batch_id])


def project_for_user(*, name: str, user=None) -> Project:
    project, _ = Project.objects.get_or_create(name=name)
    if user is not None:
        project.members.add(user)
    return project
