"""Time to completion from the batches that finished: pure functions of
recorded timings and a clock, so that they are tested on recorded runs.

The rate is measured in the processor's cost unit (tokens, pixels: the
batch's `real_tokens`), not in units: when lengths vary, a unit count
misleads — the short documents of a length-grouped run go first and the long
ones last. It is a wall-clock rate over the recent batches (several workers
add up), and its range comes from the rates of consecutive groups of those
batches: the middle half of them, so that one slow batch (a redelivery, a
worker's first batch loading its model) widens the range without moving the
estimate.
"""

from __future__ import annotations

import datetime as dt
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

#: The recent batches the rate is measured over: the last this many...
RECENT_BATCHES = 60
#: ...finished within this long before the last one.
RECENT_SPAN = dt.timedelta(minutes=30)
#: Fewer finished batches than this give no estimate yet ("measuring").
MIN_BATCHES = 3
#: The recent batches are cut into this many consecutive groups for the range.
GROUPS = 6


@dataclass(frozen=True)
class Timing:
    """One finished batch: when it started and finished, its units and its
    cost (None: the processor reported none)."""

    started_at: dt.datetime
    finished_at: dt.datetime
    size: int
    cost: int | None


@dataclass(frozen=True)
class Rate:
    """A wall-clock throughput over the recent batches: per second, in units
    and (when every batch reported one) in cost, with a low and high cost (or
    unit) rate for the range."""

    units_per_s: float
    cost_per_s: float | None
    low: float  # in cost per second when cost_per_s is set, else units per second
    high: float
    batches: int
    since: dt.datetime  # the start of the measured window
    until: dt.datetime  # the last batch's end


@dataclass(frozen=True)
class Eta:
    """When the remaining work is done at the recent rate, with a range."""

    seconds: float
    low_seconds: float  # at the high rate
    high_seconds: float  # at the low rate
    finishes_at: dt.datetime
    earliest: dt.datetime
    latest: dt.datetime
    by_cost: bool  # measured in the cost unit (else in units: no costs known)
    rate: Rate


def recent(timings: Sequence[Timing]) -> list[Timing]:
    """The batches the rate is measured over, oldest first."""
    done = sorted(timings, key=lambda t: t.finished_at)[-RECENT_BATCHES:]
    if not done:
        return []
    cutoff = done[-1].finished_at - RECENT_SPAN
    return [t for t in done if t.finished_at >= cutoff]


def measure(timings: Sequence[Timing]) -> Rate | None:
    """The recent wall-clock rate, or None while fewer than MIN_BATCHES finished."""
    window = recent(timings)
    if len(window) < MIN_BATCHES:
        return None
    # The window opens when its first batch started: before that instant none
    # of its work was being done. Workers in parallel overlap inside it.
    since = min(t.started_at for t in window)
    until = window[-1].finished_at
    elapsed = (until - since).total_seconds()
    if elapsed <= 0:
        return None
    units = sum(t.size for t in window)
    cost: int | None = sum(t.cost or 0 for t in window)
    # Counted in units when a batch reported no cost, or none reported any.
    by_cost = bool(cost) and all(t.cost is not None for t in window)
    if not by_cost:
        cost = None
    amount = (lambda t: t.cost or 0) if by_cost else (lambda t: t.size)
    groups = _group_rates(window, since, amount)
    total = cost if cost is not None else units
    # The median group's rate, not the window's mean: a worker's first batch
    # (its model loading) or a redelivered one would drag a mean for as long
    # as it stays in the window.
    mid = statistics.median(groups) if len(groups) >= 3 else total / elapsed
    if mid <= 0 or total <= 0:
        return None
    if len(groups) >= 4:
        deciles = statistics.quantiles(groups, n=10, method="inclusive")
        low, high = deciles[0], deciles[-1]
    else:
        low, high = min(groups, default=mid), max(groups, default=mid)
    scale = mid / (total / elapsed)  # the units' rate follows the same choice
    return Rate(
        units_per_s=units / elapsed * scale,
        cost_per_s=cost / elapsed * scale if cost is not None else None,
        low=min(low, mid),
        high=max(high, mid),
        batches=len(window),
        since=since,
        until=until,
    )


def _group_rates(
    window: list[Timing], since: dt.datetime, amount: Callable[[Timing], int]
) -> list[float]:
    """The rate of each consecutive group of batches, from the previous
    group's last end (the window's start for the first) to its own."""
    size = max(1, len(window) // GROUPS)
    rates = []
    start = since
    for i in range(0, len(window) - size + 1, size):
        group = window[i : i + size]
        end = group[-1].finished_at
        seconds = (end - start).total_seconds()
        if seconds > 0:
            rates.append(sum(amount(t) for t in group) / seconds)
        start = end
    return rates


def estimate(
    timings: Sequence[Timing],
    *,
    remaining_units: int,
    remaining_cost: int | None,
    now: dt.datetime,
) -> Eta | None:
    """When `remaining_units` (weighing `remaining_cost`, None: unknown) are
    done at the recent rate, counted from `now`; None while measuring or when
    nothing remains."""
    if remaining_units <= 0:
        return None
    rate = measure(timings)
    if rate is None:
        return None
    by_cost = rate.cost_per_s is not None and remaining_cost is not None
    if by_cost:
        work, mid = float(remaining_cost or 0), float(rate.cost_per_s or 0)
    else:
        # In units when costs are not known on both sides; the range scales.
        work, mid = float(remaining_units), rate.units_per_s
        scale = rate.units_per_s / rate.cost_per_s if rate.cost_per_s else 1.0
        rate = Rate(
            rate.units_per_s,
            None,
            rate.low * scale,
            rate.high * scale,
            rate.batches,
            rate.since,
            rate.until,
        )
    if mid <= 0:
        return None
    seconds = work / mid
    low_seconds = work / rate.high if rate.high > 0 else seconds
    high_seconds = work / rate.low if rate.low > 0 else seconds
    return Eta(
        seconds=seconds,
        low_seconds=low_seconds,
        high_seconds=high_seconds,
        finishes_at=now + dt.timedelta(seconds=seconds),
        earliest=now + dt.timedelta(seconds=low_seconds),
        latest=now + dt.timedelta(seconds=high_seconds),
        by_cost=by_cost,
        rate=rate,
    )


@dataclass(frozen=True)
class RentalFit:
    """A run's estimate against the rental it runs on."""

    ends_at: dt.datetime
    used_share: float  # of the rental's period, 0..1
    margin_seconds: float | None  # > 0: done this long before the end; None: no estimate

    @property
    def fits(self) -> bool | None:
        return None if self.margin_seconds is None else self.margin_seconds >= 0


def rental_fit(
    *, starts_at: dt.datetime, ends_at: dt.datetime, eta: Eta | None, now: dt.datetime
) -> RentalFit:
    period = (ends_at - starts_at).total_seconds()
    used = (now - starts_at).total_seconds() / period if period > 0 else 1.0
    margin = (ends_at - eta.finishes_at).total_seconds() if eta is not None else None
    return RentalFit(ends_at=ends_at, used_share=min(1.0, max(0.0, used)), margin_seconds=margin)


def duration(seconds: float) -> str:
    """A duration as a person reads it: "40 s", "12 min", "3.5 h", "2.1 days"."""
    seconds = abs(seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"
