"""Whether a run is stalled, and the likely cause: a pure function of what the
database says (batches, worker heartbeats) and of what the broker holds, so
that it is tested on recorded situations with a fake clock.

A run is stalled when work is queued or running and no batch finished for
`factor` times the recent median batch time (never less than a floor: a
run's first batch loads its model). A stalled run and a slow one look the
same on a counts page; the cause is what tells them apart. A run that only
waits is not stalled: its batches queued behind another campaign's on busy
workers, or its next slice being planned.

A stall the sweeper mends by itself (a dead worker's batch while a live one
serves the queue) is shown, not notified: a worker process killed for memory
and replaced should not wake anybody at 2 a.m.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Worker:
    """A worker process as its heartbeat last described it."""

    name: str  # host:pid, as Batch.worker says
    beat_at: dt.datetime
    queues: str
    stopped: bool = False
    started_at: dt.datetime | None = None  # when this process registered
    busy: bool = False  # holds work of any campaign (a batch, a training, a profile)


@dataclass(frozen=True)
class Held:
    """A running batch: who holds it, since when, and until when."""

    batch_id: int
    worker: str
    lease_expires_at: dt.datetime | None
    started_at: dt.datetime | None = None


@dataclass(frozen=True)
class Situation:
    now: dt.datetime
    queued: int  # units queued
    running: Sequence[Held]
    planning: bool  # a planner stamped planning_at recently
    planner_died: bool  # a stale planning stamp, units pending and nothing queued
    last_progress_at: dt.datetime | None  # the last batch finished, planned or started
    batch_seconds: Sequence[float]  # recent finished batches' durations
    workers: Sequence[Worker]
    queue: str = "gpu"


@dataclass(frozen=True)
class Rules:
    factor: float  # stalled after this many median batch times without progress
    floor: float  # seconds, never less than this
    beat_seconds: float  # a worker beats this often; silent 3x that, it is gone
    lease_seconds: float  # a batch's lease


@dataclass(frozen=True)
class Stall:
    cause: str  # no_worker, broker, lost, dead_holders, sweeper, planner, hung
    since: dt.datetime
    waited: float  # seconds without progress
    limit: float  # seconds allowed
    title: str
    advice: str
    notify: bool = True  # False: the sweeper mends it; the banner only


#: What the broker holds for the queue: the messages waiting (None: it does
#: not answer; -1: not asked). Asked only when the database proves no cause.
BrokerWaiting = Callable[[], "int | None"]


def limit(batch_seconds: Sequence[float], rules: Rules) -> float:
    """Seconds without a finished batch that make a stall."""
    if not batch_seconds:
        return rules.floor
    return max(rules.floor, rules.factor * statistics.median(batch_seconds))


def live(worker: Worker, *, now: dt.datetime, rules: Rules) -> bool:
    return not worker.stopped and (now - worker.beat_at).total_seconds() <= 3 * rules.beat_seconds


def consumes(worker: Worker, queue: str) -> bool:
    # A worker started without -Q consumes Celery's default queue only.
    return queue in {q.strip() for q in worker.queues.split(",")}


def _holds(worker: Worker, held: Held) -> bool:
    """Whether this live process is the one that holds the batch: the same
    host:pid, and not a later process that reused the pid (a container
    restarted under the same host name)."""
    if worker.name != held.worker:
        return False
    return not (worker.started_at and held.started_at and held.started_at < worker.started_at)


def _not_asked() -> int:
    return -1  # the broker was not asked: neither down nor empty


def verdict(
    situation: Situation, rules: Rules, broker_waiting: BrokerWaiting = _not_asked
) -> Stall | None:
    """The stall, or None while the run makes progress, waits its turn, or has
    nothing to do.

    A cause the database proves (no live worker for the queue, every running
    batch held by a dead one, a sweeper that does not run, a planner gone) is
    a stall as soon as a worker would have beaten three times without
    progress; otherwise only after the limit. `broker_waiting` is asked only
    then: it may take seconds."""
    s = situation
    if not (s.queued or s.running or s.planning or s.planner_died) or s.last_progress_at is None:
        return None
    allowed = limit(s.batch_seconds, rules)
    waited = (s.now - s.last_progress_at).total_seconds()
    if waited <= min(allowed, 3 * rules.beat_seconds):
        return None

    def stall(cause: str, title: str, advice: str, notify: bool = True) -> Stall:
        assert s.last_progress_at is not None
        return Stall(cause, s.last_progress_at, waited, allowed, title, advice, notify)

    found = _proven(s, rules, stall)
    if found is not None:
        return found
    alive = [w for w in s.workers if live(w, now=s.now, rules=rules) and consumes(w, s.queue)]
    if waited <= allowed:
        return None
    if s.planning and not s.queued and not s.running:
        return None  # the next slice is being weighed: a recent stamp says so
    if s.queued and not s.running and alive and all(w.busy for w in alive):
        return None  # its batches wait behind other work the workers are doing
    waiting = broker_waiting()
    if waiting is None:
        return stall(
            "broker",
            "The broker does not answer",
            "Workers receive no batches while the broker (Redis or RabbitMQ) is down: "
            "restart it; the queued batches are sent again by themselves once it answers.",
        )
    if s.queued and not s.running and waiting == 0:
        return stall(
            "lost",
            "The queued batches have no message in the broker",
            f"{s.queued} units are queued in the database but the broker holds no message "
            "for their batches (a broker restarted without persistence, a queue purged): "
            "the sweeper sends them again within a lease; Resume sends them now.",
        )
    return stall(
        "hung",
        "Workers are alive but no batch finished",
        "A batch may be hung (a stuck input read, a slow or full disk, a device error): "
        "see the log of the worker that holds it; stopping that worker gives its batch "
        "back to the queue when the lease runs out.",
    )


def _proven(s: Situation, rules: Rules, stall: Callable[..., Stall]) -> Stall | None:
    """A cause the heartbeats and leases prove, or None."""
    alive = [w for w in s.workers if live(w, now=s.now, rules=rules)]
    serving = [w for w in alive if consumes(w, s.queue)]
    if s.running and not any(_holds(w, h) for h in s.running for w in alive):
        expired = [
            h
            for h in s.running
            if h.lease_expires_at is not None
            and (s.now - h.lease_expires_at).total_seconds() > 2 * rules.lease_seconds
        ]
        if expired:
            return stall(
                "sweeper",
                "Batches held by dead workers are not given back",
                f"{len(expired)} running batch(es) lost their worker and their lease ran out "
                "long ago, so the sweeper (Celery beat) is not running: start "
                "`celery -A portal beat` (or a worker with --beat).",
            )
        if not serving:
            return stall(
                "no_worker",
                "No worker is running",
                f"The {len(s.running)} running batch(es) were held by workers that stopped "
                "beating; the sweeper puts them back in the queue when their lease runs out, "
                f"but no live worker consumes the '{s.queue}' queue: start one "
                f"(`celery -A portal worker -Q {s.queue}`).",
            )
        return stall(
            "dead_holders",
            "Every running batch is held by a dead worker",
            "The workers that held them stopped beating; the sweeper puts the batches back "
            "in the queue when their lease runs out, and a live worker takes them then.",
            notify=False,
        )
    if not serving and (s.queued or s.running):
        return stall(
            "no_worker",
            "No worker is running",
            f"{s.queued} units are queued but no live worker consumes the '{s.queue}' "
            f"queue: start one (`celery -A portal worker -Q {s.queue}`); nothing is lost.",
        )
    if s.planner_died and not s.queued and not s.running:
        return stall(
            "planner",
            "The run stopped planning",
            "Units are pending, nothing is queued, and the planner's last stamp is stale "
            "(the portal worker was stopped while planning): press Resume to plan the rest.",
        )
    return None
