"""Many rows of one table updated with their own values, in one statement per chunk.

`bulk_update` builds a CASE expression per field and row (a large share of a
small batch's time: bench/RESULTS.md, "Worker path against
sentence-transformers — `bench/worker_path.py`"), and an UPDATE per row makes
PostgreSQL run campaigns_unit's statement-level counter trigger once per row.
`UPDATE … FROM` a set of rows does neither: on SQLite (3.33+) `WITH v(…) AS
(VALUES …)` in statements of a few sizes (row_inserts.statement_slices says
why), on PostgreSQL the rows of one JSON document, each value cast to its
column's type (row_inserts.json_rows_source says why).
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection, models

from campaigns.db import prepared
from campaigns.db.row_inserts import json_rows, json_rows_source, statement_slices

#: Rows per statement: SQLite takes 32,766 parameters; on PostgreSQL, a document's size.
CHUNK_ROWS = 1000


def update_rows(
    model: type[models.Model],
    fields: Sequence[str],
    rows: Sequence[Sequence],
    *,
    also: dict[str, object] | None = None,
) -> None:
    """Set `fields` of each row (`(pk, value, …)`, values in `fields` order:
    strings, numbers or None, as the database takes them), and `also`
    (field → one value, any the field takes) on all of them."""
    meta = model._meta
    quote = connection.ops.quote_name
    table, pk = quote(meta.db_table), quote(meta.pk.column)
    columns = [meta.get_field(name) for name in fields]

    row = f"({', '.join(['%s'] * (len(columns) + 1))})"
    names = ", ".join(["id", *(f"v{i}" for i in range(len(columns)))])
    assignments = [f"{quote(f.column)} = v.v{i}" for i, f in enumerate(columns)]
    extra = []
    for name, value in (also or {}).items():
        field = meta.get_field(name)
        assignments.append(f"{quote(field.column)} = %s")
        extra.append(field.get_db_prep_save(value, connection))
    update = f"UPDATE {table} SET {', '.join(assignments)}"
    if connection.vendor == "postgresql":
        source = json_rows_source((meta.pk, *columns))
        with prepared.cursor() as cursor:
            for start in range(0, len(rows), CHUNK_ROWS):
                cursor.execute(
                    f"{update} FROM ({source}) AS v({names}) WHERE {table}.{pk} = v.id",
                    [*extra, json_rows([meta.pk, *columns], rows[start : start + CHUNK_ROWS])],
                )
        return
    with prepared.cursor() as cursor:
        for start, stop in statement_slices(len(rows), CHUNK_ROWS):
            chunk = rows[start:stop]
            cursor.execute(
                f"WITH v({names}) AS (VALUES {', '.join([row] * len(chunk))}) "
                f"{update} FROM v WHERE {table}.{pk} = v.id",
                [*(value for r in chunk for value in r), *extra],
            )
