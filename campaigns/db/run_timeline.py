"""A campaign's finished batches summed into equal slices of its run's wall
clock, per worker, in the database: the watch panel's charts cover the whole
run whatever its length, and the page receives a few hundred rows, not a row
a batch (a ten-million-unit run finishes over a hundred thousand batches).

One statement for the run's ends (the (campaign, finished_at) index of done
batches, read at both ends) and one GROUP BY over its done batches; the watch
panel keeps the charts drawn from them a minute (campaigns/watch/state.py)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from django.db import connection
from django.db.models import Max, Min

from campaigns.models import Batch


@dataclass(frozen=True)
class Slice:
    """What one worker finished in one slice of the run."""

    index: int
    worker: str
    batches: int
    items: int
    cost: int
    mem_peak_reserved: int | None  # the slice's largest, CUDA
    rss: int | None  # the slice's largest, CPU
    gpu_util: float | None  # the mean over its batches that had one


@dataclass(frozen=True)
class Timeline:
    start: dt.datetime
    end: dt.datetime
    slices: int
    width: float  # seconds a slice
    rows: list[Slice]


def _epoch(column: str) -> str:
    if connection.vendor == "postgresql":
        return f"EXTRACT(EPOCH FROM {column})"
    # SQLite holds a datetime as UTC text; julianday reads it.
    return f"((julianday({column}) - 2440587.5) * 86400.0)"


def _slice(column: str) -> str:
    """The slice a row's `column` falls in, from the start's epoch and the width
    (the two parameters). SQLite may lack FLOOR (a build option); its CAST
    truncates, which is the floor of a quantity never below zero."""
    offset = f"(({_epoch(column)} - %s) / %s)"
    if connection.vendor == "postgresql":
        return f"CAST(FLOOR{offset} AS INTEGER)"
    return f"CAST({offset} AS INTEGER)"


def _gpu_util() -> str:
    if connection.vendor == "postgresql":
        return "(metrics->>'gpu_util')::float"
    return "CAST(json_extract(metrics, '$.gpu_util') AS REAL)"


def timeline(*, campaign_id: int, slices: int) -> Timeline | None:
    """The run's finished batches in `slices` slices; None before two finished."""
    ends = Batch.objects.filter(
        campaign_id=campaign_id, state=Batch.State.DONE, finished_at__isnull=False
    ).aggregate(start=Min("finished_at"), end=Max("finished_at"))
    start, end = ends["start"], ends["end"]
    if start is None or end is None or end <= start:
        return None
    start_s, end_s = start.timestamp(), end.timestamp()
    with connection.cursor() as cursor:
        width = (float(end_s) - float(start_s)) / slices
        cursor.execute(
            "SELECT bucket, worker, COUNT(*), SUM(size), SUM(COALESCE(real_tokens, 0)), "
            "MAX(mem_peak_reserved), MAX(rss), AVG(util) FROM ("
            f"  SELECT {_slice('finished_at')} AS bucket,"
            f"  worker, size, real_tokens, mem_peak_reserved, rss, {_gpu_util()} AS util"
            "  FROM campaigns_batch WHERE campaign_id = %s AND state = 'done'"
            "  AND finished_at IS NOT NULL"
            ") AS done GROUP BY bucket, worker ORDER BY bucket, worker",
            [float(start_s), width, campaign_id],
        )
        rows = [
            Slice(
                # The last batch ends the last slice; rounding may put the
                # first a hair before the start.
                index=min(slices - 1, max(0, int(bucket))),
                worker=worker or "?",
                batches=int(n),
                items=int(items or 0),
                cost=int(cost or 0),
                mem_peak_reserved=int(reserved) if reserved is not None else None,
                rss=int(rss) if rss is not None else None,
                gpu_util=float(util) if util is not None else None,
            )
            for bucket, worker, n, items, cost, reserved, rss, util in cursor.fetchall()
        ]
    return Timeline(start=start, end=end, slices=slices, width=width, rows=rows)
