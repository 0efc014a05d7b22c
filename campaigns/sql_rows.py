"""Model instances from the columns of a plain SQL row.

One hand-written query can read several models side by side (a page's
header: the campaign, its project, its latest verify...), where the ORM would
send one query each. These helpers keep such a query tied to the models: the
column list comes from the fields, and values go through the same database
converters the ORM applies (JSON text, SQLite's datetimes and booleans).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from django.db import connection
from django.db.models import Model


def _fields(model: type[Model], names: Sequence[str]):
    wanted = {model._meta.get_field(name).attname for name in names}
    # from_db takes a subset of fields in the model's own field order.
    return [f for f in model._meta.concrete_fields if f.attname in wanted]


def columns(model: type[Model], alias: str, names: Sequence[str] = ()) -> str:
    """`alias."column", ...` for these fields (all concrete fields if none named)."""
    fields = _fields(model, names) if names else model._meta.concrete_fields
    quote = connection.ops.quote_name
    return ", ".join(f"{alias}.{quote(f.column)}" for f in fields)


def instance(model: type[Model], values: Iterator, names: Sequence[str] = ()) -> Model | None:
    """The instance whose columns `columns(model, alias, names)` selected, taken
    from `values` (an iterator over the row); None when its primary key is NULL
    (a LEFT JOIN that found nothing). Fields not named are deferred."""
    fields = _fields(model, names) if names else model._meta.concrete_fields
    converted = []
    for f in fields:
        value = next(values)
        if value is not None:
            column = f.get_col(model._meta.db_table)
            for converter in connection.ops.get_db_converters(column) + f.get_db_converters(
                connection
            ):
                value = converter(value, column, connection)
        converted.append(value)
    pk = model._meta.pk
    if any(f is pk and v is None for f, v in zip(fields, converted, strict=True)):
        return None
    return model.from_db(connection.alias, [f.attname for f in fields], converted)
