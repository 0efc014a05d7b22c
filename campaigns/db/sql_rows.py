"""Model instances from the columns of a plain SQL row.

One hand-written query can read several models side by side (a page's
header: the campaign, its project, its latest verify...), where the ORM would
send one query each. These helpers keep such a query tied to the models: the
column list comes from the fields, and values go through the same database
converters the ORM applies (JSON text, SQLite's datetimes and booleans).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator, Sequence
from typing import Generic, TypeVar

from django.db import connection
from django.db.models import ForeignKey, Model, signals
from django.db.models.base import ModelState

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
        self.width = len(fields)
        # (position, its converters) of the fields that have any: the others'
        # values are taken as the database gives them.
        self.converting = []
        for i, f in enumerate(fields):
            column = f.get_col(model._meta.db_table)
            converters = [
                (converter, column)
                for converter in connection.ops.get_db_converters(column)
                + f.get_db_converters(connection)
            ]
            if converters:
                self.converting.append((i, converters))
        self.pk_index = next((i for i, f in enumerate(fields) if f is model._meta.pk), None)
        if signals.pre_init.has_listeners(model) or signals.post_init.has_listeners(model):
            raise TypeError(f"{model.__name__} has init signal receivers: read it with the ORM")

    def convert(self, values: Iterator) -> list:
        """The values of these fields from `values`, through the ORM's converters."""
        return self._converted(list(itertools.islice(values, self.width)))

    def _converted(self, converted: list) -> list:
        for i, converters in self.converting:
            value = converted[i]
            if value is not None:
                for converter, column in converters:
                    value = converter(value, column, connection)
                converted[i] = value
        return converted

    def __call__(self, values: Iterator) -> M | None:
        raw = list(itertools.islice(values, self.width))
        if self.pk_index is not None and raw[self.pk_index] is None:
            return None  # a LEFT JOIN that found nothing: nothing to convert
        converted = self._converted(raw)
        # What Model.from_db makes, without Model.__init__'s walk over every
        # field of the model and its signals (no model read here has a
        # pre_init or post_init receiver; tests/campaigns/test_sql_rows.py
        # checks each instance equals the ORM's): fields not read are left out
        # of __dict__, which is how the ORM defers them. A hundred campaigns
        # of the list are five hundred instances (bench/RESULTS.md, "The
        # campaign page's rows and URLs (2026-12-04)").
        instance = self.model.__new__(self.model)
        instance.__dict__.update(zip(self.attnames, converted, strict=True))
        state = instance._state = ModelState()
        state.adding, state.db = False, self.alias
        return instance


def attach(instance: Model, name: str, related: Model | None) -> None:
    """`instance.<name> = related` for a forward foreign key whose row was read
    beside the instance's, without the descriptor's checks (its database
    router and type checks, the reverse side's cache): what the ORM's
    select_related leaves. The key's id is set from `related`, as the
    descriptor sets it."""
    attname, target = _key_of(type(instance), name)
    instance.__dict__[attname] = None if related is None else getattr(related, target)
    instance._state.fields_cache[name] = related


@functools.cache
def _key_of(model: type[Model], name: str) -> tuple[str, str]:
    """(the key's attname here, the attname it refers to there)."""
    field = model._meta.get_field(name)
    # A forward many-to-one key, as `attach` says: a one-to-one's reverse
    # side would want its cache set too.
    assert isinstance(field, ForeignKey) and not field.one_to_one
    return field.attname, field.target_field.attname
