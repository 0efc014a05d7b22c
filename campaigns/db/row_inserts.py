"""Many new rows of one table in one statement per chunk, their ids returned.

On PostgreSQL the rows go as one JSON document (`INSERT … SELECT … FROM
jsonb_array_elements(…)`: json_rows_source says why), on SQLite as VALUES rows.

`bulk_create` builds a model instance per row and prepares every value through
its field (a fifth of the worker's host work per unit, bench/orchestration.py):
for a batch's attempts that is the cost, not the database. Here the rows are
tuples: on SQLite only the fields whose values need a conversion for the
database (JSON, dates) go through their field; on PostgreSQL json_rows makes
each column's values JSON.
"""

from __future__ import annotations

import functools
import json
import math
import typing
from collections.abc import Iterator, Sequence
from datetime import date, datetime, time
from decimal import Decimal
from uuid import UUID

from django.db import connection, models

from campaigns.db import prepared

#: Values a statement may carry: PostgreSQL takes 65,535 parameters, SQLite 32,766.
MAX_PARAMS = 30000
#: Rows a JSON document carries on PostgreSQL: any batch a worker records, in one statement.
JSON_ROWS = 5000

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
    if type(field) is models.JSONField:
        # What get_db_prep_save ends in (adapt_json_value), without the calls on the way.
        encoder = field.encoder
        return lambda value: None if value is None else json.dumps(value, cls=encoder)
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
    columns = typing.cast(list[models.Field], [meta.get_field(name) for name in fields])
    given = {f.attname for f in columns}
    defaulted = [f for f in meta.concrete_fields if not f.primary_key and f.attname not in given]
    defaults = [f.get_db_prep_save(f.get_default(), connection) for f in defaulted]
    names = ", ".join(quote(f.column) for f in [*columns, *defaulted])
    head = f"INSERT INTO {quote(meta.db_table)} ({names}) "
    returning = f" RETURNING {quote(meta.pk.column)}"
    if connection.vendor == "postgresql":
        # The defaults go once, as values of the statement, not once a row.
        source = json_rows_source(tuple(columns), tuple(f"%s::{column_type(f)}" for f in defaulted))
        ids: list[int] = []
        with prepared.cursor() as cursor:
            for start in range(0, len(rows), JSON_ROWS):
                chunk = rows[start : start + JSON_ROWS]
                cursor.execute(f"{head}{source}{returning}", [*defaults, json_rows(columns, chunk)])
                # RETURNING rows come in the document's order: jsonb_array_elements
                # gives its elements in order, and bulk_create relies on the same.
                ids.extend(pk for (pk,) in cursor.fetchall())
        return ids
    prepare = [_preparer(f) for f in columns]
    converted = [i for i, p in enumerate(prepare) if p is not None]
    width = len(columns) + len(defaulted)
    row_marks = f"({', '.join(['%s'] * width)})"
    ids = []
    with prepared.cursor() as cursor:
        for start, stop in statement_slices(len(rows), MAX_PARAMS // width):
            chunk = rows[start:stop]
            converted_rows = []
            for row in chunk:
                if converted:
                    row = list(row)
                    for i in converted:
                        row[i] = prepare[i](row[i])
                converted_rows.append((*row, *defaults))
            cursor.execute(
                f"{head}VALUES {', '.join([row_marks] * len(chunk))}{returning}",
                [value for row in converted_rows for value in row],
            )
            # RETURNING rows come in the VALUES' order: bulk_create relies on it too.
            ids.extend(pk for (pk,) in cursor.fetchall())
    return ids


def statement_slices(count: int, most: int) -> Iterator[tuple[int, int]]:
    """(start, stop) of the statements that carry `count` rows on SQLite, at
    most `most` rows each: powers of two, largest first (81 rows: 64, 16, 1).

    SQLite compiles a statement's text once and keeps it in the connection's
    cache; a text of VALUES rows is a new text for every row count, and a
    batch's row count changes from batch to batch, so each was compiled anew
    (its counter triggers with it), at twice the cost a row of a text met
    before (bench/RESULTS.md, "Rows in statements of a few sizes on SQLite
    (2026-12-04)"). A few sizes are a few texts, each compiled once a
    connection.
    """
    largest = 1 << max(0, most.bit_length() - 1)  # the largest power of two <= most
    start = 0
    while start < count:
        left = count - start
        size = min(largest, 1 << (left.bit_length() - 1))
        yield start, start + size
        start += size


@functools.cache
def column_type(field: models.Field) -> str:
    """The field's column type without its length: nothing is cut on the way."""
    return field.db_type(connection).split("(")[0]


@functools.cache
def json_rows_source(fields: tuple[models.Field, ...], extra: tuple[str, ...] = ()) -> str:
    """`SELECT <a value a field>, *extra FROM <the rows of one JSON document>`
    (PostgreSQL), in the document's order; its one parameter, after any of
    `extra`'s, is json_rows(fields, rows).

    A batch's rows as one document, not an array a column (as bulk_create's
    UNNEST sends them): psycopg makes an array's text element by element in
    Python, while json.dumps makes the whole document at once, and the
    server reads it as fast (bench/RESULTS.md, "A batch's rows as one JSON
    document (2026-12-04)"). The statement's text depends only on the
    fields (made once a process), so the server keeps its plan
    (campaigns/db/prepared.py).
    """
    values = []
    for i, field in enumerate(fields):
        if isinstance(field, models.JSONField) and field.encoder is None:
            # A JSON column takes its part of the document as it is; None is
            # SQL NULL, as Django saves it.
            values.append(f"NULLIF(r -> {i}, 'null'::jsonb)")
        else:
            values.append(f"(r ->> {i})::{column_type(field)}")
    return (
        f"SELECT {', '.join([*values, *extra])} "
        "FROM jsonb_array_elements(%s::jsonb) WITH ORDINALITY AS e(r, n) ORDER BY n"
    )


def json_rows(fields: Sequence[models.Field], rows: Sequence[Sequence]) -> str:
    """The rows as one JSON document of arrays, for json_rows_source(fields).

    Each value as its field makes it for the database (`get_prep_value`:
    an integer column's 12.0 is 12), datetimes (given aware) in ISO form,
    dates, times, decimals and UUIDs as text their column reads exactly,
    non-finite floats as PostgreSQL spells them. A JSON column's value goes
    as json.dumps writes it, and what it cannot write (NaN, a datetime)
    stays an error, as Django's JSONField makes it on PostgreSQL.
    """
    converters = [(i, c) for i, c in enumerate(map(_json_value, fields)) if c is not None]
    document: Sequence[Sequence] = rows
    if converters:
        converted = [list(row) for row in rows]
        for row in converted:
            for i, convert in converters:
                row[i] = convert(row[i])
        document = converted
    try:
        return json.dumps(document, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        # A value json.dumps does not write as it is: column by column.
        return _json_rows_by_column(fields, document)


def _json_rows_by_column(fields: Sequence[models.Field], document: Sequence[Sequence]) -> str:
    """json_rows's document when a value needs more than json.dumps: text for
    non-finite floats, dates and decimals outside JSON columns; inside them
    an error, as Django's JSONField makes it."""
    as_json = [i for i, f in enumerate(fields) if _as_json(f)]
    for values in document:
        for i in as_json:
            json.dumps(values[i], allow_nan=False)  # raises for what the column cannot hold
    return json.dumps(
        [[v if i in as_json else _float_text(v) for i, v in enumerate(row)] for row in document],
        allow_nan=False,
        separators=(",", ":"),
        default=_plain,
    )


def _as_json(field: models.Field) -> bool:
    """A JSON column whose value goes into the document as it is."""
    return isinstance(field, models.JSONField) and field.encoder is None


# Columns whose values go into the document as the caller gives them: text,
# and ids (a foreign key's values are its target's keys).
_JSON_AS_GIVEN = (models.CharField, models.TextField, models.ForeignKey)


def _json_value(field: models.Field):
    """How a value of this field goes into the document (None: as given)."""
    if isinstance(field, _JSON_AS_GIVEN) or _as_json(field):
        return None
    if isinstance(field, models.JSONField):
        encoder = field.encoder  # its own encoder: the column reads the text as JSON
        return lambda value: None if value is None else json.dumps(value, cls=encoder)
    if isinstance(field, models.DateTimeField):
        # A batch's rows share their few instants: each converted once.
        return functools.lru_cache(maxsize=256)(
            lambda value: value.isoformat() if isinstance(value, datetime) else value
        )
    exact = {models.IntegerField: int, models.FloatField: float}
    for kind, python_type in exact.items():
        if isinstance(field, kind):
            # The common case costs a type check; anything else (a numpy
            # scalar, a float in an integer column) goes through the field.
            return lambda value, t=python_type: (
                value if value is None or type(value) is t else field.get_prep_value(value)
            )
    return field.get_prep_value


def _plain(value):
    """What json.dumps cannot write itself: dates, times, UUIDs, decimals, as
    text their column's type reads exactly."""
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, (UUID, Decimal)):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not a value for a column: {value!r}")


def _float_text(value):
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value
