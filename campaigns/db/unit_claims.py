"""Pending units claimed for their new batches, in one statement.

The claim is an UPDATE guarded by `state = 'pending'` (claim-by-update): a unit
another run took meanwhile is not taken again, and the count of rows changed
tells the caller which batches came out smaller. One `UPDATE … FROM (VALUES …)`
rather than an update per batch, so PostgreSQL runs campaigns_unit's
statement-level counter trigger once.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection

from campaigns.models import Unit, UnitState


def units_claim(*, pairs: Sequence[tuple[int, int]]) -> int:
    """Set each (unit id, batch id) pair's unit `queued` in that batch, where the
    unit is still pending; how many were."""
    if not pairs:
        return 0
    meta = Unit._meta
    quote = connection.ops.quote_name
    table, pk = quote(meta.db_table), quote(meta.pk.column)
    state = quote(meta.get_field("state").column)
    batch = quote(meta.get_field("batch").column)
    rows = ", ".join(["(%s, %s)"] * len(pairs))
    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {table} SET {state} = %s, {batch} = v.column2 "
            f"FROM (VALUES {rows}) AS v WHERE {table}.{pk} = v.column1 "
            f"AND {table}.{state} = %s",
            [UnitState.QUEUED, *(x for pair in pairs for x in pair), UnitState.PENDING],
        )
        claimed: int = cursor.rowcount
        return claimed
