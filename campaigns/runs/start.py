"""Starting a run: pending units weighed, planned into batches a slice at a
time, claimed for those batches, and one task per batch sent once its slice
commits. Also the send itself, which resume and the lease sweeps use too."""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

from celery import current_app as celery_app
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Count, Q
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError

from campaigns import selectors
from campaigns.db.unit_claims import units_claim
from campaigns.intake.project_folders import campaign_folder_check
from campaigns.models import Batch, Campaign, ParameterVersion, Unit, UnitState
from campaigns.review.cross_section import first_group
from campaigns.review.queue import run_allowance, units_runnable
from campaigns.runs.batching import RECORD_WINDOW_IDS, batch_policy, plan_batches
from campaigns.runs.costs import measure_costs
from campaigns.specs.processors import get_spec

log = logging.getLogger(__name__)

#: The task that runs one batch (gpuworker/tasks.py), sent by name.
RUN_BATCH_TASK = "gpuworker.tasks.run_batch"
#: The task that plans the rest of a run a web request started.
PLAN_TASK = "campaigns.tasks.plan_campaign"

#: Pending units planned and sent per transaction. Grouping by length within a
#: slice of this size pads as little as over the whole campaign, and a million
#: units reach the workers a slice at a time instead of after the whole plan
#: (bench/RESULTS.md, "Weighing only what a run sends, and a slice at a time
#: (2026-12-01)").
RUN_SLICE_UNITS = 50_000
#: A run's first slice is smaller, so that the workers, and the request of the
#: campaign page's Start, wait for 5,000 units to be weighed and planned rather
#: than 50,000. Its units are grouped among themselves, which pads them a
#: little more (bench/RESULTS.md, "A run's first slice is 5,000 units —
#: `bench/start_latency.py`").
FIRST_SLICE_UNITS = 5_000

# Units claimed per statement. Small enough that PostgreSQL probes the primary
# key for each rather than scanning the table, and that SQLite's variable limit
# holds; large enough that a million units take a thousand statements, not the
# tens of thousands of one batch at a time (each an INSERT, an UPDATE, a trigger;
# bench/RESULTS.md, "`campaign run` over a million pending units — `bench/run_scale.py`").
_CLAIM_UNITS = 1000


def campaign_run(*, campaign: Campaign) -> int:
    """Group the pending units into batches and enqueue one task per batch.

    The version's batch_policy decides the grouping (campaigns/runs/batching.py).
    Returns the number of batches enqueued. A task carries the batch id only
    and is sent after its slice of the plan commits, so a worker never looks
    for a row that is not there yet.
    """
    return _run(campaign, slices=None, since=timezone.now())[0]


def campaign_start(*, campaign: Campaign) -> tuple[int, bool]:
    """campaign_run for a web request: the first slice now, the rest planned by
    a `portal` worker (PLAN_TASK), so that starting a million-unit campaign
    answers in seconds instead of outliving the web server's timeout.

    Returns the batches queued now, and whether more are being planned.
    """
    since = timezone.now()
    batches, more = _run(campaign, slices=1, since=since)
    if more:
        # The campaign stays stamped as planning (_run leaves its stamp when it
        # hands the rest on, and the task carries it): the page keeps polling
        # until the worker takes over, and the worker clears this stamp only.
        stamp = campaign.planning_at
        assert stamp is not None
        args = [campaign.pk, since.isoformat(), stamp.isoformat()]
        transaction.on_commit(lambda: _plan_rest(args, stamp))
    return batches, more


def _plan_rest(args: list, stamp: dt.datetime) -> None:
    if not _send(PLAN_TASK, args):
        _planning_done(args[0], stamp)
        outage = _outage.get()
        assert outage is not None
        outage.planning_unsent = True


def _planning_stamp(campaign: Campaign) -> dt.datetime:
    """Stamp the campaign as being planned now (Campaign.planning_at): its
    pages keep polling while the next slice is weighed, though nothing may be
    queued then. Renewed at each slice, so a planner that dies lets it go stale."""
    stamp = campaign.planning_at = timezone.now()
    Campaign.objects.filter(pk=campaign.pk).update(planning_at=stamp)
    return stamp


def _planning_done(campaign_id: int, stamp: dt.datetime | None) -> None:
    # Only this planner's own stamp: another run may plan the campaign now.
    if stamp is not None:
        Campaign.objects.filter(pk=campaign_id, planning_at=stamp).update(planning_at=None)


@dataclass(frozen=True)
class Held:
    """Pending units a run does not send now, and what holds them."""

    pending: int
    checkpoint_version: int | None  # the version whose checkpoint they wait for

    def __str__(self) -> str:
        units = f"{self.pending} pending unit{'s' if self.pending != 1 else ''}"
        if self.checkpoint_version is not None:
            return f"{units} wait for the checkpoint of v{self.checkpoint_version}"
        return f"{units}, none of them runnable now (held by review)"


def pending_held(*, campaign: Campaign) -> Held | None:
    """What holds the campaign's pending units back from a run; None when
    none is pending."""
    pending = selectors.campaign_counts(campaign=campaign).pending
    if pending == 0:
        return None
    version = campaign.current_version
    at_checkpoint = version is not None and run_allowance(campaign=campaign, version=version) == 0
    return Held(pending, version.number if at_checkpoint and version else None)


def nothing_queued_reason(*, campaign: Campaign) -> str:
    """Why a run of the campaign queued no batch, as the person who pressed Run
    reads it: no pending unit left, or pending units held by the checkpoint."""
    held = pending_held(campaign=campaign)
    if held is None:
        counts = selectors.campaign_counts(campaign=campaign)
        if unwritten := selectors.output_write_errors(counts):
            return f"Nothing pending to run, but {selectors.write_failed_detail(unwritten)}."
        return "Nothing to run: no pending units."
    if held.checkpoint_version is not None:
        return (
            f"Nothing to run yet: {held}. Review its spot check and pass it, and the run goes on."
        )
    return f"Nothing to run: {held}."


def campaign_run_rest(
    *, campaign: Campaign, since: dt.datetime, stamp: dt.datetime | None = None
) -> int:
    """The rest of the run campaign_start began at `since`, unless paused
    since; `stamp`: the planning stamp campaign_start left for it."""
    # Its first slice went out with the request: the rest goes in full slices.
    try:
        return _run(campaign, slices=None, since=since, small_first=False)[0]
    finally:
        # The stamp campaign_start left, when this run stamped none of its own
        # (paused meanwhile, nothing left): the page stops polling now. Only
        # that stamp: another run may be planning the campaign meanwhile.
        _planning_done(campaign.pk, stamp)


class BrokerUnavailable(Exception):
    """The broker did not take a message (down, unreachable, refusing)."""


@dataclass
class BrokerOutage:
    """What broker_outage_noted saw: messages not sent, and why."""

    unsent_batches: int = 0
    planning_unsent: bool = False
    # Other work recorded as queued whose message did not go ("the training").
    unsent_work: list[str] = field(default_factory=list)
    error: str = ""

    def __bool__(self) -> bool:
        return bool(self.unsent_batches or self.planning_unsent or self.unsent_work)


_outage: ContextVar[BrokerOutage | None] = ContextVar("broker_outage", default=None)


@contextmanager
def broker_outage_noted() -> Iterator[BrokerOutage]:
    """Within this block a broker that does not answer is noted, not raised:
    the batches (and a training or a profile, sent with work_send) stay queued
    in the database, and the lost-message sweep (campaigns/runs/leases.py,
    batches_resend_lost) sends them once the broker answers again. Run, Resume,
    Train and Profile, on the page and in the CLI, say so instead of failing."""
    outage = BrokerOutage()
    token = _outage.set(outage)
    try:
        yield outage
    finally:
        _outage.reset(token)


def _send(name: str, args: list) -> bool:
    """Send a task by name; False when the broker did not take it and an
    outage is being noted (BrokerUnavailable otherwise)."""
    outage = _outage.get()
    if outage is not None and outage.error:
        return False  # known down: each further try would wait for its retries again
    try:
        # By name: the web process must not import gpuworker (and so torch).
        celery_app.send_task(name, args=args)
    except (KombuOperationalError, OSError) as exc:
        if outage is None:
            raise BrokerUnavailable(str(exc)) from exc
        log.warning("broker does not answer (%s): %s %s left to the sweeper", exc, name, args)
        outage.error = str(exc) or type(exc).__name__
        return False
    return True


def task_send(*, task: str, args: list) -> bool:
    """Send a task that no database row stands for (an e-mail to send, say):
    False when the broker does not take it, and nothing resends it. The log
    line names the task, never its arguments (an e-mail address, say)."""
    try:
        celery_app.send_task(task, args=args)
    except (KombuOperationalError, OSError) as exc:
        log.warning("broker does not answer (%s): %s not sent", exc, task)
        return False
    return True


def work_send(*, task: str, args: list, what: str) -> None:
    """Send the task of work recorded as queued in the database (`what`: "the
    training", "the profile"). Within broker_outage_noted a broker that does
    not answer is noted, and the lost-message sweep sends it later; outside,
    BrokerUnavailable."""
    if not _send(task, args):
        outage = _outage.get()
        assert outage is not None
        outage.unsent_work.append(what)


def broker_outage_reason(outage: BrokerOutage) -> str:
    """What Run, Resume, Train or Profile says when the broker did not take their messages."""
    parts = [f"The broker does not answer ({outage.error}), so no worker was told."]
    if outage.unsent_batches:
        n = outage.unsent_batches
        parts.append(
            f"{n} batch{'es are' if n != 1 else ' is'} queued in the database and will be "
            "sent by the sweeper (Celery beat) once the broker answers again; nothing is lost."
        )
    for what in outage.unsent_work:
        parts.append(
            f"{what[:1].upper()}{what[1:]} is queued in the database and will be sent by the "
            "sweeper (Celery beat) once the broker answers again; nothing is lost."
        )
    if outage.planning_unsent:
        parts.append("The rest of the campaign stays pending: press Run again once it answers.")
    return " ".join(parts)


def batches_enqueue(*, batch_ids: list[int]) -> None:
    """Send one run_batch task per batch id; a worker ignores a batch it finds claimed."""
    for index, batch_id in enumerate(batch_ids):
        if not _send(RUN_BATCH_TASK, [batch_id]):
            outage = _outage.get()
            assert outage is not None
            outage.unsent_batches += len(batch_ids) - index
            return


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
    # Every run, as every import: the folder may have changed since the campaign was made.
    campaign_folder_check(campaign)
    # A Pause holds until the next Run or Resume, this one: the campaign stops
    # reading "Paused" (selectors.run_state). A Pause after `since` is kept,
    # and stops this run at its next slice.
    if Campaign.objects.filter(pk=campaign.pk, paused_at__lt=since).update(paused_at=None):
        campaign.paused_at = None
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
    weighs = batch_policy(version.params) != "original"
    if allowance is not None:
        # Before the checkpoint: the first group (a few per cent), in one go, a
        # cross-section of categories and sizes rather than the import's head.
        chosen = first_group(
            pending=pending_units, allowance=allowance, campaign=campaign, version=version
        )
        if weighs:
            # Only the group is weighed: a million-unit campaign's first group
            # starts without tokenizing the other 95 %.
            for within in _first_group_parts(chosen):
                measure_costs(campaign=campaign, params=version.params, within=within)
        sent = _plan_and_send(
            campaign=campaign,
            version=version,
            since=since,
            pending=lambda: sorted(
                [
                    *pending_units.filter(holdout=True).values_list("pk", "cost"),
                    *_still_pending(chosen),
                ]
            ),
        )
        return sent, False
    # A slice at a time, each weighed, planned, claimed and committed (so its
    # batches are sent) before the next: the workers start on the first
    # batches while the rest of a large campaign is still being weighed.
    sent, after, planned = 0, 0, 0
    stamp, more = None, False
    try:
        while True:
            rest = pending_units.filter(pk__gt=after).order_by("pk")
            if planned == slices:
                more = rest.exists()
                return sent, more
            first = small_first and not planned
            size = min(FIRST_SLICE_UNITS, RUN_SLICE_UNITS) if first else RUN_SLICE_UNITS
            ids = list(rest.values_list("pk", flat=True)[:size])
            if not ids or _stopped_since(campaign, since, version):
                return sent, False
            planned += 1
            stamp = _planning_stamp(campaign)
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
    finally:
        if not more:  # more: the stamp is handed on with the rest (campaign_start)
            _planning_done(campaign.pk, stamp)


def _stopped_since(
    campaign: Campaign, since: dt.datetime, version: ParameterVersion, *, hold: bool = False
) -> bool:
    """Whether a Pause came since `since`, or another parameter version became
    current (its switch takes this version's queued batches back: planning
    more of them would only be redone). With `hold` (inside a slice's
    transaction) the campaign's row stays locked until that transaction ends:
    a Pause or a switch then waits for the slice to commit and takes its
    batches back, instead of landing between this check and the commit and
    missing them."""
    campaigns = Campaign.objects.filter(pk=campaign.pk)
    if hold:
        # FOR NO KEY UPDATE: it waits for, and holds off, campaign_pause's
        # update of the row, but not the inserts whose foreign key names it.
        campaigns = campaigns.select_for_update(no_key=True)
    paused_at, current = campaigns.values_list("paused_at", "current_version_id").get()
    return (paused_at is not None and paused_at >= since) or current != version.pk


def _plan_and_send(
    *, campaign: Campaign, version: ParameterVersion, since: dt.datetime, pending
) -> int:
    """Plan `pending()` (its (id, cost) rows, read in the transaction) into
    batches, claim their units, and enqueue the batches once committed;
    nothing if a Pause came since the run was asked for."""
    created: list[int] = []
    with transaction.atomic():
        group: list[list[int]] = []
        # A record campaign's batches read stretches of its files (RECORD_WINDOW_IDS).
        window = RECORD_WINDOW_IDS if campaign.records else None
        for ids in plan_batches(pending(), version.params, window=window):
            group.append(ids)
            if sum(map(len, group)) >= _CLAIM_UNITS:
                created += _batches_claim(campaign=campaign, version=version, group=group)
                group = []
        if group:
            created += _batches_claim(campaign=campaign, version=version, group=group)
        if _stopped_since(campaign, since, version, hold=True):
            # Paused, or the version changed, while this slice was planned: none of it is queued.
            transaction.set_rollback(True)
            return 0
        transaction.on_commit(lambda: batches_enqueue(batch_ids=created))
    return len(created)


def _still_pending(ids: list[int]) -> Iterator[tuple[int, int | None]]:
    """(id, cost) of those of `ids` still pending, looked up by primary key
    _CLAIM_UNITS at a time (the first group was picked from the runnable
    units a moment ago; a unit claimed since is left out, as the claim would)."""
    for start in range(0, len(ids), _CLAIM_UNITS):
        part = Unit.objects.filter(pk__in=ids[start : start + _CLAIM_UNITS])
        yield from part.filter(state=UnitState.PENDING).values_list("pk", "cost")


def _first_group_parts(chosen: list[int]) -> Iterator[Q]:
    """The first group (the pending holdout, and the `chosen` others) as
    filters of at most _CLAIM_UNITS ids each: a list of a few hundred
    thousand ids would pass the databases' limit on a statement's parameters."""
    yield Q(holdout=True)
    for start in range(0, len(chosen), _CLAIM_UNITS):
        yield Q(pk__in=chosen[start : start + _CLAIM_UNITS], holdout=False)


def _batches_claim(
    *, campaign: Campaign, version: ParameterVersion, group: list[list[int]]
) -> list[int]:
    """Create one Batch per id list and claim its pending units for it, set-based.

    Claim-by-update (only units still pending), so a unit another run took
    meanwhile stays with that run and its batch is the smaller.
    """
    policy = batch_policy(version.params)
    batches = Batch.objects.bulk_create(
        [Batch(campaign=campaign, version=version, size=len(ids), policy=policy) for ids in group]
    )
    pairs = [(pk, batch.pk) for batch, ids in zip(batches, group, strict=True) for pk in ids]
    claimed = units_claim(pairs=pairs)
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
