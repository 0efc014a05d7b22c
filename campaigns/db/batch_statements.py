"""The statements a worker sends for every batch, written out.

Django building these few statements (filters, compilers, model instances)
costs a worker more of a small batch's host work than the database running
them (bench/RESULTS.md, "The worker's statements written out; arrays for
PostgreSQL (2026-12-01)"). They are
plain SQL here, tied to the models through sql_rows (column lists from the
fields, values through the ORM's converters), on SQLite and PostgreSQL alike.
What the worker does less often stays in the ORM. Those of a fixed shape
go through campaigns/db/prepared.py, so PostgreSQL keeps their plans.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from django.db import connection
from django.db.models import CharField, Model, QuerySet

from campaigns.db import prepared, sql_rows
from campaigns.db.row_inserts import MAX_PARAMS
from campaigns.models import (
    IN_FLIGHT,
    VECTOR_HASH,
    AsInIndex,
    Attempt,
    Batch,
    Campaign,
    Checkpoint,
    ParameterVersion,
    ProjectFolder,
    ReviewItem,
    Unit,
    UnitState,
)


def _q(name: str) -> str:
    return connection.ops.quote_name(name)


def _table(model: type[Model]) -> str:
    return _q(model._meta.db_table)


def _column(model: type[Model], name: str) -> str:
    return _q(model._meta.get_field(name).column)


def batch_to_run(batch_id: int) -> Batch | None:
    """The batch with its campaign and version, in one statement (the ORM's
    `select_related("campaign", "version")`)."""
    with prepared.cursor() as cursor:
        cursor.execute(_batch_sql(connection.vendor), [batch_id])
        row = cursor.fetchone()
    if row is None:
        return None
    values = iter(row)
    batch = sql_rows.instance(Batch, values)
    assert batch is not None  # a row: the batch
    sql_rows.attach(batch, "campaign", sql_rows.instance(Campaign, values))
    sql_rows.attach(batch, "version", sql_rows.instance(ParameterVersion, values))
    return batch


# The statements' texts are made once a process (for its database's quoting).
@functools.cache
def _batch_sql(vendor: str) -> str:
    return (
        f"SELECT {sql_rows.columns(Batch, 'b')}, {sql_rows.columns(Campaign, 'c')}, "
        f"{sql_rows.columns(ParameterVersion, 'v')} FROM {_table(Batch)} b "
        f"JOIN {_table(Campaign)} c ON c.{_q('id')} = b.{_column(Batch, 'campaign')} "
        f"JOIN {_table(ParameterVersion)} v ON v.{_q('id')} = b.{_column(Batch, 'version')} "
        f"WHERE b.{_q('id')} = %s"
    )


def claim_batch(batch_id: int, **values) -> bool:
    """Queued → running with these field values and one more delivery; False
    when the batch was not queued (a second delivery of the same message)."""
    return bool(
        _update_batch(
            batch_id,
            {"state": Batch.State.RUNNING, **values},
            where={"state": Batch.State.QUEUED},
            plus_one="deliveries",
        )
    )


def record_batch(batch_id: int, token: str, values: dict) -> bool:
    """The batch's results, while `token` still holds its lease (the lease
    check and the write in one statement); False when the lease was lost."""
    return bool(
        _update_batch(batch_id, values, where={"state": Batch.State.RUNNING, "lease_token": token})
    )


def current_version_of(campaign_id: int) -> int | None:
    """The campaign's current version, read at the end of a batch's recording
    (campaigns/runs/recording.py: a batch of an older version sends its units
    back to pending).

    On PostgreSQL the row stays share-locked until the recording commits
    (FOR KEY SHARE: only a FOR UPDATE waits on it, as setup.version_create
    takes). A parameter change then either committed before this read, and
    the read sees it, or waits for the recording, and its own switch finds
    the batch's units done; otherwise one committed between the read and the
    commit would skip those units, still running to it, and they would stay
    done under the old version. SQLite runs one writing transaction at a time."""
    with prepared.cursor() as cursor:
        cursor.execute(_current_version_sql(connection.vendor), [campaign_id])
        row = cursor.fetchone()
    return None if row is None else row[0]


@functools.cache
def _current_version_sql(vendor: str) -> str:
    lock = " FOR KEY SHARE" if vendor == "postgresql" else ""
    return (
        f"SELECT {_column(Campaign, 'current_version')} FROM {_table(Campaign)} "
        f"WHERE {_q('id')} = %s{lock}"
    )


def _update_batch(batch_id: int, values: dict, *, where: dict, plus_one: str = "") -> int:
    """UPDATE the batch's `values` where it is as `where` says, adding one to
    the field `plus_one`; the rows it changed (0 or 1)."""
    names = tuple(values)
    params = [
        field.get_db_prep_save(value, connection)
        for field, value in zip(_batch_fields(names), values.values(), strict=True)
    ]
    params.append(batch_id)
    params.extend(where.values())
    with prepared.cursor() as cursor:
        cursor.execute(_update_batch_sql(connection.vendor, names, tuple(where), plus_one), params)
        return cursor.rowcount


@functools.cache
def _batch_fields(names: tuple[str, ...]) -> tuple:
    return tuple(Batch._meta.get_field(name) for name in names)


@functools.cache
def _update_batch_sql(
    vendor: str, names: tuple[str, ...], where: tuple[str, ...], plus_one: str
) -> str:
    """Made once a process for each shape (the claim's, the recording's)."""
    assignments = [f"{_q(field.column)} = %s" for field in _batch_fields(names)]
    if plus_one:
        assignments.append(f"{_column(Batch, plus_one)} = {_column(Batch, plus_one)} + 1")
    conditions = [f"{_q('id')} = %s", *(f"{_column(Batch, name)} = %s" for name in where)]
    return f"UPDATE {_table(Batch)} SET {', '.join(assignments)} WHERE {' AND '.join(conditions)}"


@dataclass(slots=True)
class ClaimedUnit:
    """A unit as the worker runs it: what it reads (where the input is, the
    hash recorded at import) and the results it writes back (the `Unit`
    columns of the same names). A plain record: a `Unit` instance a row, every
    column converted, costs many times more (bench/RESULTS.md, "Where the
    Celery rows' time outside the model goes (2026-12-01)")."""

    pk: int
    uid: str
    source_path: str
    sha256: str
    # A review item of this version holds it (review.REVIEWED_OUT).
    reviewed_out: bool
    size: int | None = None  # the input's bytes at import (None: not known)
    state: str = UnitState.RUNNING
    error_class: str = ""
    error_message: str = ""
    output_path: str = ""
    output_size: int | None = None
    output_sha256: str = ""


def claimed_units(
    batch_id: int, version_id: int, reviewed_out: tuple[str, ...]
) -> list[ClaimedUnit]:
    """The batch's queued units set running, with those it had running already
    (a delivery again after its worker died), in id order, each with
    `reviewed_out`: whether a review item of this version in one of those
    states holds it (campaigns.review.queue.REVIEWED_OUT: the worker neither
    runs nor adopts such a unit under this version). One statement: the
    UPDATE returns the rows it set."""
    with prepared.cursor() as cursor:
        cursor.execute(
            _units_sql(connection.vendor, len(reviewed_out)),
            [UnitState.RUNNING, batch_id, *IN_FLIGHT, version_id, *reviewed_out],
        )
        rows = sorted(cursor.fetchall())
    return [
        ClaimedUnit(pk, uid, path, sha, bool(held), size) for pk, uid, path, sha, size, held in rows
    ]


@functools.cache
def _units_sql(vendor: str, states: int) -> str:
    state, batch, table = _column(Unit, "state"), _column(Unit, "batch"), _table(Unit)
    read = ", ".join(
        f"{table}.{_column(Unit, name)}" for name in ("id", "uid", "source_path", "sha256", "size")
    )
    return (
        f"UPDATE {table} SET {state} = %s WHERE {batch} = %s "
        f"AND {state} IN ({', '.join(['%s'] * len(IN_FLIGHT))}) "
        f"RETURNING {read}, EXISTS (SELECT 1 FROM {_table(ReviewItem)} r "
        f"WHERE r.{_column(ReviewItem, 'unit')} = {table}.{_q('id')} "
        f"AND r.{_column(ReviewItem, 'version')} = %s "
        f"AND r.{_column(ReviewItem, 'state')} IN ({', '.join(['%s'] * states)}))"
    )


def checkpoint_of(campaign_id: int, version_id: int) -> Checkpoint | None:
    """The version's checkpoint (one at most: a unique constraint)."""
    with prepared.cursor() as cursor:
        cursor.execute(_checkpoint_sql(connection.vendor), [campaign_id, version_id])
        row = cursor.fetchone()
    return None if row is None else sql_rows.instance(Checkpoint, iter(row))


@functools.cache
def _checkpoint_sql(vendor: str) -> str:
    return (
        f"SELECT {sql_rows.columns(Checkpoint, 'k')} FROM {_table(Checkpoint)} k "
        f"WHERE k.{_column(Checkpoint, 'campaign')} = %s "
        f"AND k.{_column(Checkpoint, 'version')} = %s"
    )


def project_folder_paths(project_id: int) -> list[str]:
    """The folders of a project (campaigns.intake.project_folders checks a
    campaign's folder against them before every batch reads from it)."""
    with prepared.cursor() as cursor:
        cursor.execute(_folders_sql(connection.vendor), [project_id])
        return [path for (path,) in cursor.fetchall()]


@functools.cache
def _folders_sql(vendor: str) -> str:
    return (
        f"SELECT {_column(ProjectFolder, 'path')} FROM {_table(ProjectFolder)} "
        f"WHERE {_column(ProjectFolder, 'project')} = %s"
    )


def earlier_outputs_with_hashes(version_id: int, digests: list[str]) -> QuerySet:
    """(vector hash, unit id, input sha256) of the version's successful
    attempts with one of these hashes: a probe of the index
    attempt_version_vector_hash, whose expression it repeats in its very text."""
    # As text, so `__in` compares strings (on SQLite the JSON key lookup
    # would parse each hash as JSON).
    vector_hash = AsInIndex(VECTOR_HASH, output_field=CharField())
    return (
        Attempt.objects.annotate(vector_hash=vector_hash)
        .filter(version_id=version_id, outcome=Attempt.Outcome.SUCCEEDED, vector_hash__in=digests)
        .order_by()
        .values_list("vector_hash", "unit__uid", "input_sha256")
    )


# Values no version id or vector hash takes: where the compiled statement holds them.
_VERSION_MARK = -7301
_DIGEST_MARK = "digest-mark"
_ONE_DIGEST = "IN (%s)"


@functools.cache
def _probe_template(vendor: str) -> tuple[str, str, tuple]:
    """earlier_outputs_with_hashes compiled once, split around its list of hashes."""
    sql, params = earlier_outputs_with_hashes(_VERSION_MARK, [_DIGEST_MARK]).query.sql_with_params()
    at = params.index(_DIGEST_MARK)
    head, _, tail = sql.partition(_ONE_DIGEST)
    # The list is where its one value is among the statement's values.
    if sql.count(_ONE_DIGEST) != 1 or head.count("%s") != at:
        raise RuntimeError(f"the duplicate probe's statement is not as expected: {sql}")
    return head, tail, tuple(params)


def earlier_outputs_statement(version_id: int, digests: list[str]) -> tuple[str, list]:
    """earlier_outputs_with_hashes's SQL and values. Its queryset is built and
    compiled once a process (building it for each batch costs more than the
    database's answer); the statement is the same text, with the version and
    as many hashes as asked."""
    head, tail, template = _probe_template(connection.vendor)
    at = template.index(_DIGEST_MARK)
    params = [version_id if p == _VERSION_MARK else p for p in template]
    # As many hashes as the next power of two, the last one repeated (a
    # value twice in an IN list finds what it finds once): a few texts,
    # which SQLite compiles once each (row_inserts.statement_slices).
    listed = list(digests)
    padded = 1 << max(0, len(listed) - 1).bit_length()
    if listed and padded + len(template) <= MAX_PARAMS:  # SQLite takes 32,766 values
        listed += [listed[-1]] * (padded - len(listed))
    params[at : at + 1] = listed
    return f"{head}IN ({', '.join(['%s'] * len(listed))}){tail}", params


def earlier_outputs(version_id: int, digests: list[str]) -> list[tuple[str, str, str]]:
    if not digests:
        return []
    sql, params = earlier_outputs_statement(version_id, digests)
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()
