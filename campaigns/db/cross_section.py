"""A cross-section of a set of units, ranked by the database in one statement.

The rule (campaigns/review/cross_section.py says where it is used): the units
are cut into strata by category and by input size quantile (SIZE_BUCKETS
over the whole set's sizes). The pick goes in turns: each turn takes one unit
of every category, the categories in a seeded order (so that when there are
more categories than units to pick, the ones that sort late are as likely as
the ones that sort early). Within a category the turns go round its size
buckets, from a bucket that differs from category to category; within a
stratum the units come in a seeded order spread over the import order. A
unit whose sha256 an earlier unit of the set has is an identical input: it
comes after every distinct one, or is left out.

One statement of window functions, on SQLite and PostgreSQL alike, returning
`count` ids: the database sorts, on disk when it must, so a million-unit set
costs no Python memory (bench/RESULTS.md, "The first group as a cross-section
— `bench/cross_section.py`").
"""

from __future__ import annotations

import hashlib

from django.db import connection
from django.db.models import QuerySet

from campaigns.models import Unit

#: Size quantiles the set is cut into: quartiles, as the spot check had them.
SIZE_BUCKETS = 4

# The seeded order: ((n + seed) × ⌊0.618 × P⌋) mod P, P the prime 2^31 − 1.
# Consecutive n land far apart (Fibonacci hashing), so the first units of a
# stratum in this order are spread over its import order, not its head. The
# product stays below 2^63 for ids under 4·10^9: integer arithmetic on both
# databases (SQLite turns an overflowing product into a float).
_PRIME = 2_147_483_647
_MULTIPLIER = 1_327_217_884


def _seeds(seed: str) -> tuple[int, int]:
    """Two numbers from the seed: one orders the units, one the categories."""
    digest = hashlib.sha256(seed.encode()).digest()
    return (
        int.from_bytes(digest[:4], "big") % _PRIME,
        int.from_bytes(digest[4:8], "big") % _PRIME,
    )


def units_cross_section(
    *, units: QuerySet[Unit], count: int, seed: str, distinct_inputs: bool
) -> list[int]:
    """Up to `count` ids of `units`, the first `count` of the cross-section
    (module docstring), sorted. `distinct_inputs`: identical inputs are left
    out rather than put last. `seed` makes the order deterministic."""
    if count <= 0:
        return []
    inner, params = (
        units.order_by().values_list("pk", "category", "size", "sha256").query.sql_with_params()
    )
    unit_seed, category_seed = _seeds(seed)
    p, m, n = _PRIME, _MULTIPLIER, SIZE_BUCKETS
    # PostgreSQL sorts text by the database's collation unless told to compare
    # bytes, which is all grouping by checksum or category needs (twice as fast).
    binary = ' COLLATE "C"' if connection.vendor == "postgresql" else ""
    keep = "WHERE dup = 0" if distinct_inputs else ""
    # Each step a window over the step before: SQL allows no window function
    # inside another. Checksums leave after the first step, so the later sorts
    # carry a few integers a unit. A category is named by its first unit's id
    # (a window over the whole of each category, computed once a category) so
    # that the later sorts compare integers: DENSE_RANK would re-read its
    # spilled peer groups on PostgreSQL, and a join with the category list
    # becomes a nested loop when the statistics lag an import. Django names
    # the set's columns pk, category, size and sha256. The seeds are integers
    # of ours, written into the text; %% is the modulo operator once either
    # driver has put in the parameters.
    sql = f"""
        WITH deduped AS (
            SELECT q.pk AS id, q.category AS category, q.size AS size,
                   CASE WHEN q.sha256 <> '' AND ROW_NUMBER() OVER (
                            PARTITION BY q.sha256{binary} ORDER BY q.pk
                        ) > 1
                        THEN 1 ELSE 0 END AS dup
            FROM ({inner}) q
        ),
        marked AS (
            SELECT id, dup,
                   MIN(id) OVER (PARTITION BY category{binary}) AS cat,
                   NTILE({n}) OVER (ORDER BY COALESCE(size, 0), id) - 1 AS bucket,
                   ((id + {unit_seed}) * {m}) %% {p} AS h
            FROM deduped
        ),
        ranked AS (
            SELECT id, cat, bucket, dup,
                   ROW_NUMBER() OVER (PARTITION BY dup, cat, bucket ORDER BY h, id) AS r
            FROM marked
        ),
        rounds AS (
            SELECT id, cat, dup,
                   ROW_NUMBER() OVER (
                       PARTITION BY dup, cat ORDER BY r, (bucket + cat) %% {n}
                   ) AS turn
            FROM ranked
        )
        SELECT id FROM rounds {keep}
        ORDER BY dup, turn, ((cat + {category_seed}) * {m}) %% {p}, id
        LIMIT %s
    """
    with connection.cursor() as cursor:
        cursor.execute(sql, [*params, count])
        return sorted(pk for (pk,) in cursor.fetchall())
