"""Model instances from the columns of a plain SQL row.

One hand-written query can read several models side by side (a page's
header: the campaign, its project, its latest verify...), where the ORM would
send one query each. These helpers keep such a query tied to the models: the
column list comes from the fields, and values go through the same database
converters the ORM applies (JSON text, SQLite's datetimes and booleans).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from django.db import connection
from django.db.models import Model

M = TypeVar("M", bound=Model)


def _fields(model: type[Model], names: Sequence[str]):
    wanted = {model._meta.get_field(name).attname for name in names}
    # from_db takes a subset of fields in the model's own field order.
    return [f for f in model._meta.concrete_fields if f.attname in wanted]


def columns(model: type[Model], alias: str, names: Sequence[str] = ()) -> str:
    """`alias."column", ...` for these fields (all concrete fields if none named)."""
    fields = _fields(model, names) if names else model._meta.concrete_fields
    quote = connection.ops.quote_name
    return ", ".join(f"{alias}.{quote(f.column)}" for f in fields)


def instance(model: type[M], values: Iterator, names: Sequence[str] = ()) -> M | None:
    """The instance whose columns `columns(model, alias, names)` selected, taken
    from `values` (an iterator over the row); None when its primary key is NULL
    (a LEFT JOIN that found nothing). Fields not named are deferred."""
    return reader(model, tuple(names))(values)


def reader(model: type[M], names: tuple[str, ...] = ()) -> Reader[M]:
    """`instance` for many rows, its fields and converters found once a process
    (the worker reads a batch's units, ~40 rows of 20 columns, every batch)."""
    return _reader(model, names, connection.vendor, connection.alias)


@functools.cache
def _reader(model: type[M], names: tuple[str, ...], vendor: str, alias: str) -> Reader[M]:
    # The converters are the ORM's for this database; the SQLite ones read
    # only settings (the time zone) from the connection they were found on.
    return Reader(model, names, alias)


class Reader(Generic[M]):
    def __init__(self, model: type[M], names: Sequence[str], alias: str):
        self.model, self.alias = model, alias
        fields = _fields(model, names) if names else model._meta.concrete_fields
        self.attnames = [f.attname for f in fields]
        self.converters = []
        for f in fields:
            column = f.get_col(model._meta.db_table)
            self.converters.append(
                [
                    (converter, column)
                    for converter in connection.ops.get_db_converters(column)
                    + f.get_db_converters(connection)
                ]
            )
        self.pk_index = next((i for i, f in enumerate(fields) if f is model._meta.pk), None)

    def __call__(self, values: Iterator) -> M | None:
        converted = []
        for converters in self.converters:
            value = next(values)
            if value is not None:
                for converter, column in converters:
                    value = converter(value, column, connection)
            converted.append(value)
        if self.pk_index is not None and converted[self.pk_index] is None:
            return None
        return self.model.from_db(self.alias, self.attnames, converted)
