"""What the watch panel, the list, `campaign status` and the watch sweep read
from the database: recent batch timings, the work left, the worker
heartbeats and the running batches, put through the pure rules of eta.py and
stall.py. A handful of statements over indexed columns a campaign, whatever
its size (the one over the units left reads them by the (campaign, state)
index)."""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings
from django.core.cache import cache
from django.db.models import Sum
from django.utils import timezone

from campaigns.db import run_timeline
from campaigns.models import (
    Batch,
    Campaign,
    ParameterVersion,
    Training,
    Unit,
    UnitState,
    WorkerBeat,
)
from campaigns.selectors import Counts
from campaigns.specs.processors import cost_unit
from campaigns.watch import charts, eta, stall, summary
from campaigns.watch.eta import Eta, Rate, RentalFit, Timing
from campaigns.watch.rentals import Rental, rental_of

#: Finished batches read for the rate (the recent window is cut from these).
TIMINGS_READ = eta.RECENT_BATCHES


def rules() -> stall.Rules:
    return stall.Rules(
        factor=settings.WATCH_STALL_FACTOR,
        floor=settings.WATCH_STALL_MIN_SECONDS,
        beat_seconds=settings.WORKER_BEAT_SECONDS,
        lease_seconds=settings.BATCH_LEASE_SECONDS,
    )


def timings(*, campaign_id: int, version_id: int | None = None) -> list[Timing]:
    """The campaign's (or version's) last finished batches, oldest first: the
    (campaign, finished_at) index of done batches, read backwards."""
    rows = Batch.objects.filter(
        campaign_id=campaign_id, state=Batch.State.DONE, finished_at__isnull=False
    )
    if version_id is not None:
        rows = rows.filter(version_id=version_id)
    found = rows.order_by("-finished_at").values_list(
        "started_at", "finished_at", "size", "real_tokens"
    )[:TIMINGS_READ]
    return [
        Timing(started or finished, finished, size, cost)
        for started, finished, size, cost in list(found)[::-1]
        if finished is not None
    ]


@dataclass(frozen=True)
class Left:
    """Units left to process for a version, and their cost where weighed."""

    units: int
    cost: int | None  # None: none of them weighed yet
    exact: bool = True  # False: the cost is the units' count times a sample's mean


#: Units read per state to weigh what is left: every one up to this many, a
#: sample of this many (the first by id, the order the planner takes them)
#: beyond, so that a page over ten million units reads a bounded number of rows.
COST_SAMPLE = 500

_LEFT_STATES = (UnitState.PENDING, UnitState.QUEUED, UnitState.RUNNING)


def _mean_costs(*, campaign: Campaign, counts: Counts) -> dict[str, tuple[float | None, bool]]:
    """Per state left: (the mean weighed cost of its units or of a sample of
    them, None when none is weighed; whether that covered them all)."""
    found: dict[str, tuple[float | None, bool]] = {}
    for unit_state in _LEFT_STATES:
        n = getattr(counts, unit_state)
        if not n:
            continue
        costs = list(
            Unit.objects.filter(campaign=campaign, state=unit_state)
            .order_by("id")
            .values_list("cost", flat=True)[:COST_SAMPLE]
        )
        weighed = [c for c in costs if c is not None]
        mean = sum(weighed) / len(weighed) if weighed else None
        found[unit_state] = (mean, n <= COST_SAMPLE)
    return found


def work_left(*, campaign: Campaign, counts: Counts) -> dict[int | None, Left]:
    """Units left by the version that will run them: queued and running ones
    by their batch's version (batch sizes), pending ones by the campaign's
    current version; their cost from the units' weighed costs (those not yet
    weighed count at the mean of those that were)."""
    means = _mean_costs(campaign=campaign, counts=counts)
    units: dict[int | None, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    if counts.pending:
        units[campaign.current_version_id][UnitState.PENDING] += counts.pending
    if campaign.versions.count() < 2:
        # One version runs everything: the counters say how much is in flight.
        for unit_state in (UnitState.QUEUED, UnitState.RUNNING):
            if n := getattr(counts, unit_state):
                units[campaign.current_version_id][unit_state] += n
    else:
        # Batches of an older version may still be in flight: by their size.
        for row in (
            Batch.objects.filter(
                campaign=campaign, state__in=[Batch.State.QUEUED, Batch.State.RUNNING]
            )
            .values("version_id", "state")
            .annotate(n=Sum("size"))
        ):
            units[row["version_id"]][row["state"]] += row["n"] or 0
    result = {}
    for version_id, by_state in units.items():
        total = sum(by_state.values())
        cost: float | None = 0.0
        exact = True
        for state_name, n in by_state.items():
            mean, whole = means.get(state_name, (None, True))
            if mean is None or cost is None:
                cost = None
                continue
            cost += n * mean
            exact = exact and whole
        result[version_id] = Left(total, round(cost) if cost is not None else None, exact)
    return result


@dataclass(frozen=True)
class VersionWatch:
    version: ParameterVersion
    current: bool
    left: Left
    rate: Rate | None
    eta: Eta | None


@dataclass(frozen=True)
class WorkerRow:
    name: str
    host: str
    pid: int
    device: str
    queues: str
    beat_at: dt.datetime
    beat_age: float
    batches_done: int
    live: bool
    stopped: bool
    current: list[tuple[int, str]]  # (batch id, campaign name) it holds now


@dataclass(frozen=True)
class Watch:
    """Everything the watch panel shows for a campaign."""

    now: dt.datetime
    cost_unit: str
    left: Left
    eta: Eta | None
    rate: Rate | None
    versions: list[VersionWatch]
    rental: Rental | None
    fit: RentalFit | None
    stall: stall.Stall | None
    active: bool
    workers: list[WorkerRow] = field(default_factory=list)


def campaign_eta(
    *, campaign: Campaign, counts: Counts, now: dt.datetime | None = None
) -> tuple[Left, Eta | None, Rate | None, dict[int | None, Left]]:
    """The campaign's work left, its ETA and rate (from all its recent batches)."""
    now = now or timezone.now()
    by_version = work_left(campaign=campaign, counts=counts)
    units = sum(v.units for v in by_version.values())
    costs = [v.cost for v in by_version.values()]
    left = Left(
        units,
        None if any(c is None for c in costs) else sum(c or 0 for c in costs),
        all(v.exact for v in by_version.values()),
    )
    recent = timings(campaign_id=campaign.pk)
    estimate = eta.estimate(recent, remaining_units=left.units, remaining_cost=left.cost, now=now)
    return left, estimate, eta.measure(recent), by_version


def campaign_watch(
    *,
    campaign: Campaign,
    counts: Counts,
    broker_check=None,
    now: dt.datetime | None = None,
    visible: set[int] | None = None,
) -> Watch:
    now = now or timezone.now()
    left, estimate, rate, by_version = campaign_eta(campaign=campaign, counts=counts, now=now)
    versions = []
    # The versions with work left, and the current one: a version done long
    # ago has no estimate to give, and its batches lie far back in the index.
    for version in ParameterVersion.objects.filter(
        pk__in={*by_version, campaign.current_version_id} - {None}
    ).order_by("number"):
        recent = timings(campaign_id=campaign.pk, version_id=version.pk)
        version_left = by_version.get(version.pk, Left(0, 0))
        versions.append(
            VersionWatch(
                version,
                version.pk == campaign.current_version_id,
                version_left,
                eta.measure(recent),
                eta.estimate(
                    recent,
                    remaining_units=version_left.units,
                    remaining_cost=version_left.cost,
                    now=now,
                ),
            )
        )
    rental = rental_of(campaign.pk)
    fit = (
        eta.rental_fit(
            starts_at=rental.starts_at,
            ends_at=rental.ends_at,
            # A run that does not run has no end to set against the rental's.
            eta=estimate if counts.active else None,
            now=now,
        )
        if rental is not None
        else None
    )
    return Watch(
        now=now,
        cost_unit=cost_unit(campaign.processor),
        left=left,
        eta=estimate,
        rate=rate,
        versions=versions,
        rental=rental,
        fit=fit,
        stall=campaign_stall(campaign=campaign, counts=counts, now=now, broker_check=broker_check),
        active=counts.active,
        workers=workers(now=now, visible=visible),
    )


#: Worker rows older than this are no longer shown, and the watch sweep removes them.
BEATS_KEPT = dt.timedelta(days=1)


def _beats(now: dt.datetime) -> list[WorkerBeat]:
    return list(WorkerBeat.objects.filter(beat_at__gte=now - BEATS_KEPT))


def _busy_workers() -> dict[str, list[tuple[int, int, dt.datetime | None]]]:
    """Worker name -> (batch id, campaign id, started) of every running batch,
    and the trainings running (batch id 0): the partial index of running
    batches, as many rows as there are workers at work."""
    holding: dict[str, list[tuple[int, int, dt.datetime | None]]] = defaultdict(list)
    for pk, worker, campaign_id, started in Batch.objects.filter(
        state=Batch.State.RUNNING
    ).values_list("pk", "worker", "campaign_id", "started_at"):
        holding[worker].append((pk, campaign_id, started))
    for worker, campaign_id in Training.objects.filter(state=Training.State.RUNNING).values_list(
        "worker", "campaign_id"
    ):
        holding[worker].append((0, campaign_id, None))
    return holding


def situation(*, campaign: Campaign, counts: Counts, now: dt.datetime) -> stall.Situation:
    """The campaign's run as the stall rules see it: a handful of bounded reads
    (the running batches, the newest queued one, the last finished ones)."""
    busy = _busy_workers()
    running = [
        stall.Held(pk, worker, None, started)
        for worker, held in busy.items()
        for pk, campaign_id, started in held
        if campaign_id == campaign.pk and pk
    ]
    expiries = dict(
        Batch.objects.filter(pk__in=[h.batch_id for h in running]).values_list(
            "pk", "lease_expires_at"
        )
    )
    running = [
        stall.Held(h.batch_id, h.worker, expiries.get(h.batch_id), h.started_at) for h in running
    ]
    recent = timings(campaign_id=campaign.pk)
    # Progress: the last batch finished, the newest one planned (by id, the
    # order they are made) or the last one a worker started.
    newest_queued = (
        Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED)
        .order_by("-pk")
        .values_list("created_at", flat=True)
        .first()
    )
    moments = [
        recent[-1].finished_at if recent else None,
        newest_queued,
        *(h.started_at for h in running),
    ]
    known = [t for t in moments if t is not None]
    progress = max(known) if known else None
    planning_at = campaign.planning_at
    stale_planner = (
        planning_at is not None
        and planning_at <= Campaign.planning_after(now)
        and counts.pending > 0
        and not counts.queued
        and not counts.running
    )
    if stale_planner and progress is None:
        progress = planning_at
    beats = [
        stall.Worker(
            w.name,
            w.beat_at,
            w.queues,
            w.stopped_at is not None,
            w.started_at,
            busy=bool(busy.get(w.name)),
        )
        for w in _beats(now)
    ]
    return stall.Situation(
        now=now,
        queued=counts.queued,
        running=running,
        planning=counts.planning,
        planner_died=stale_planner,
        last_progress_at=progress,
        batch_seconds=[(t.finished_at - t.started_at).total_seconds() for t in recent[-20:]],
        workers=beats,
    )


def campaign_stall(
    *, campaign: Campaign, counts: Counts, now: dt.datetime, broker_check=None
) -> stall.Stall | None:
    """The campaign's stall, or None. `broker_check()`: the messages the
    broker holds for the batch queue, None when it does not answer (asked
    only when the database proves no other cause)."""
    if not (counts.active or (campaign.planning_at and counts.pending)):
        return None
    return stall.verdict(
        situation(campaign=campaign, counts=counts, now=now),
        rules(),
        broker_check or (lambda: -1),
    )


def workers(*, now: dt.datetime, visible: set[int] | None = None) -> list[WorkerRow]:
    """Every worker process that beat within the last day, live ones first,
    with the batches each holds now. `visible`: the campaigns the reader may
    see (None: all); another project's batch is shown without its name."""
    rules_ = rules()
    names = dict(Campaign.objects.values_list("pk", "name")) if visible is None else {}
    if visible is not None:
        names = dict(Campaign.objects.filter(pk__in=visible).values_list("pk", "name"))
    holding = _busy_workers()
    rows = []
    for beat in _beats(now):
        as_seen = stall.Worker(beat.name, beat.beat_at, beat.queues, beat.stopped_at is not None)
        rows.append(
            WorkerRow(
                name=beat.name,
                host=beat.host,
                pid=beat.pid,
                device=beat.device,
                queues=beat.queues,
                beat_at=beat.beat_at,
                beat_age=(now - beat.beat_at).total_seconds(),
                batches_done=beat.batches_done,
                live=stall.live(as_seen, now=now, rules=rules_),
                stopped=beat.stopped_at is not None,
                current=[
                    (pk, names.get(campaign_id, "another project's campaign"))
                    for pk, campaign_id, _ in holding.get(beat.name, [])
                ],
            )
        )
    rows.sort(key=lambda r: (not r.live, r.host, r.pid))
    return rows


#: The watch panel's charts are drawn again at most this often (the process's
#: cache): they sum every finished batch of the run, and change little in a minute.
CHARTS_SECONDS = 60


def run_charts(*, campaign_id: int, cost_unit: str) -> list:
    """The panel's charts over the whole run (campaigns/watch/charts.py)."""

    def draw() -> list:
        found = run_timeline.timeline(campaign_id=campaign_id, slices=charts.BUCKETS)
        return charts.rate_charts(found, cost_unit=cost_unit) + charts.worker_charts(found)

    return cache.get_or_set(f"watch:charts:{campaign_id}", draw, CHARTS_SECONDS) or []


#: The campaign list keeps each campaign's ETA text this long (the process's
#: cache): the list is the page people leave open, and an estimate that moves
#: with each finished batch need not be read again at every refresh.
LIST_ETA_SECONDS = 30


def list_etas(*, campaigns: list[Campaign], counts: dict[int, Counts]) -> dict[int, str]:
    """The campaign list's ETA of each campaign given (the active ones)."""
    found = {}
    for campaign in campaigns:

        def text(campaign: Campaign = campaign) -> str:
            left, estimate, _, _ = campaign_eta(campaign=campaign, counts=counts[campaign.pk])
            return summary.eta_short(estimate, left_units=left.units)

        found[campaign.pk] = (
            cache.get_or_set(f"watch:list-eta:{campaign.pk}", text, LIST_ETA_SECONDS) or ""
        )
    return found


def watch_json(*, campaign: Campaign, counts: Counts, broker_check=None) -> dict:
    """`campaign status --json`'s "watch": the ETA, rate, rental, stall and versions."""
    watch = campaign_watch(campaign=campaign, counts=counts, broker_check=broker_check)
    return summary.watch_json(watch)
