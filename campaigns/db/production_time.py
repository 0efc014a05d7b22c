"""How long a campaign was producing: the union of its finished batches' runs.

Several workers run batches at once, and a campaign also stands still (at a
checkpoint, paused, between runs): neither the sum of the batches' times nor
the span from the first to the last batch is the time it took. The union of
the intervals, with gaps under a limit bridged (a worker's claim between two
batches), is. Window functions merge the intervals in the database ("gaps and
islands"), so the answer is one row whatever the number of batches.
"""

from __future__ import annotations

from django.db import connection

# A timestamp as seconds since the epoch, in each vendor's words. SQLite holds
# Django's datetimes as ISO text in UTC, which julianday() reads.
_EPOCH = {
    "postgresql": "EXTRACT(EPOCH FROM {column})",
    "sqlite": "((julianday({column}) - 2440587.5) * 86400.0)",
}

_SQL = """
WITH runs AS (
    SELECT id, {started} AS s, {finished} AS f
    FROM campaigns_batch
    WHERE campaign_id = %(campaign)s AND state = 'done'
      AND started_at IS NOT NULL AND finished_at IS NOT NULL {version}
), marked AS (
    SELECT id, s, f,
        CASE WHEN s <= MAX(f) OVER (
            ORDER BY s, id ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
        ) + %(gap)s THEN 0 ELSE 1 END AS starts
    FROM runs
), islands AS (
    SELECT s, f, SUM(starts) OVER (ORDER BY s, id ROWS UNBOUNDED PRECEDING) AS island
    FROM marked
)
SELECT COALESCE(SUM(last_f - first_s), 0), COUNT(*)
FROM (SELECT MIN(s) AS first_s, MAX(f) AS last_f FROM islands GROUP BY island) spans
"""


def busy_seconds(*, campaign_id: int, version_id: int | None, gap_seconds: float) -> float:
    """Seconds during which at least one batch of the campaign (of this version,
    if given) was running; gaps of gap_seconds or less between batches count
    as running, longer ones are left out."""
    epoch = _EPOCH[connection.vendor]
    sql = _SQL.format(
        started=epoch.format(column="started_at"),
        finished=epoch.format(column="finished_at"),
        version="AND version_id = %(version)s" if version_id is not None else "",
    )
    params = {"campaign": campaign_id, "version": version_id, "gap": float(gap_seconds)}
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        seconds, _islands = cursor.fetchone()
    return float(seconds or 0)
