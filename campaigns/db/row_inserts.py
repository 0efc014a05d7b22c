"""Many new rows of one table in one statement per chunk, their ids returned.

On PostgreSQL the values go as one array a column (`INSERT … SELECT * FROM
UNNEST(…)`), on SQLite as VALUES rows.

`bulk_create` builds a model instance per row and prepares every value through
its field (a fifth of the worker's host work per unit, bench/orchestration.py):
for a batch's attempts that is the cost, not the database. Here the rows are
tuples, and only the fields whose values need a conversion for the database
(JSON, dates) go through their field.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from django.db import connection, models

from campaigns.db import prepared

#: Values a statement may carry: PostgreSQL takes 65,535 parameters, SQLite 32,766.
MAX_PARAMS = 30000

# Values of these fields go to the database as the caller gives them: strings,
# numbers, ids or None (what their get_db_prep_save would return anyway).
_AS_GIVEN = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.FloatField,
    models.ForeignKey,
)


def _preparer(field: models.Field):
    """How a value of this field goes to the database (None: as given)."""
    if isinstance(field, _AS_GIVEN):
        return None
    if isinstance(field, models.DateTimeField):
        # What get_db_prep_save ends in, without its checks for strings and
        # naive values (a third of an attempt row's preparing): the caller
        # gives aware datetimes. Each value converted once: a batch's rows
        # share their few instants.
        return functools.lru_cache(maxsize=256)(connection.ops.adapt_datetimefield_value)
    return lambda value: field.get_db_prep_save(value, connection)


def insert_rows(
    model: type[models.Model], fields: Sequence[str], rows: Sequence[Sequence]
) -> list[int]:
    """Insert one row per tuple (values in `fields` order, attribute names as
    `unit_id` for a foreign key); returns the new primary keys in row order.
    Every other column takes its field's default, as `bulk_create` would give
    it (no `auto_now`: name such a field with its value). Datetimes are
    given aware, as USE_TZ has them."""
    if not rows:
        return []
    meta = model._meta
    quote = connection.ops.quote_name
    columns = [meta.get_field(name) for name in fields]
    prepare = [_preparer(f) for f in columns]
    converted = [i for i, p in enumerate(prepare) if p is not None]
    given = {f.attname for f in columns}
    defaulted = [f for f in meta.concrete_fields if not f.primary_key and f.attname not in given]
    defaults = [f.get_db_prep_save(f.get_default(), connection) for f in defaulted]
    names = ", ".join(quote(f.column) for f in [*columns, *defaulted])
    head = f"INSERT INTO {quote(meta.db_table)} ({names}) "
    returning = f" RETURNING {quote(meta.pk.column)}"
    width = len(columns) + len(defaulted)
    row_marks = f"({', '.join(['%s'] * width)})"
    arrays = connection.vendor == "postgresql"
    if arrays:
        unnest = f"SELECT * FROM UNNEST({array_marks([*columns, *defaulted])})"
    per_chunk = max(1, MAX_PARAMS // width)
    ids: list[int] = []
    with prepared.cursor() as cursor:
        for start in range(0, len(rows), per_chunk):
            chunk = rows[start : start + per_chunk]
            converted_rows = []
            for row in chunk:
                if converted:
                    row = list(row)
                    for i in converted:
                        row[i] = prepare[i](row[i])
                converted_rows.append((*row, *defaults))
            if arrays:
                columns_of = [list(c) for c in zip(*converted_rows, strict=True)]
                cursor.execute(f"{head}{unnest}{returning}", columns_of)
            else:
                cursor.execute(
                    f"{head}VALUES {', '.join([row_marks] * len(chunk))}{returning}",
                    [value for row in converted_rows for value in row],
                )
            # RETURNING rows come in the VALUES' (or the arrays') order on both
            # databases: bulk_create relies on it too.
            ids.extend(pk for (pk,) in cursor.fetchall())
    return ids


def array_marks(fields: Sequence[models.Field]) -> str:
    """`(%s)::type[]` for each field: on PostgreSQL a column's values go as one
    array, so a statement carries a value a column, not one a row and column.

    psycopg parses a statement's placeholders in Python, on every call for a
    long one: a batch's attempts as VALUES (a row each, 16 columns) cost more
    to parse than to run (bench/RESULTS.md, "The worker's
    statements written out; arrays for PostgreSQL (2026-12-01)"). Django's
    bulk_create does the same (its UNNEST insert), with the types' lengths dropped so that nothing
    is cut to a varchar's length on the way.
    """
    return ", ".join(f"(%s)::{f.db_type(connection).split('(')[0]}[]" for f in fields)
