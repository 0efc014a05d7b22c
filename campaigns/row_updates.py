"""Many rows of one table updated with their own values, in one statement per chunk.

`bulk_update` builds a CASE expression per field and row (a fifth of a small
batch's time in the worker-path benchmark), and an UPDATE per row makes
PostgreSQL run campaigns_unit's statement-level counter trigger once per row.
`WITH v(…) AS (VALUES …) UPDATE … FROM v` does neither, on SQLite (3.33+) and
PostgreSQL alike.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connection, models

#: Rows per statement: PostgreSQL takes 65,535 parameters, SQLite 32,766.
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

    def mark(field) -> str:
        # PostgreSQL types a VALUES list from its first row, where a NULL is
        # text: a column that may hold one says its type (text needs none).
        # SQLite converts by affinity.
        if connection.vendor != "postgresql" or not field.null or _textual(field):
            return "%s"
        return f"CAST(%s AS {field.db_type(connection)})"

    row = f"({', '.join(mark(f) for f in [meta.pk, *columns])})"
    names = ", ".join(["id", *(f"v{i}" for i in range(len(columns)))])
    assignments = [f"{quote(f.column)} = v.v{i}" for i, f in enumerate(columns)]
    extra = []
    for name, value in (also or {}).items():
        field = meta.get_field(name)
        assignments.append(f"{quote(field.column)} = %s")
        extra.append(field.get_db_prep_save(value, connection))
    with connection.cursor() as cursor:
        for start in range(0, len(rows), CHUNK_ROWS):
            chunk = rows[start : start + CHUNK_ROWS]
            cursor.execute(
                f"WITH v({names}) AS (VALUES {', '.join([row] * len(chunk))}) "
                f"UPDATE {table} SET {', '.join(assignments)} FROM v WHERE {table}.{pk} = v.id",
                [*(value for r in chunk for value in r), *extra],
            )


def _textual(field) -> bool:
    return isinstance(field, models.CharField | models.TextField)
