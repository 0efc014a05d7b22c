"""The hand-written reads behind the campaign pages and the counts poll.

Each function sends one statement (unit_categories one a campaign) and returns
rows or model instances; campaigns/selectors.py turns them into what pages
show. Plain SQL because these are the pages' hottest queries, where building
them through the ORM costs more than the database spends answering them
(bench/RESULTS.md, "Counts poll in one query, cached batch panels (2026-11-30)"
and "The campaign page's header in one query (2026-11-30)"). Counts come from
the trigger-kept counter tables (campaigns/db/counters.py), never from GROUP BY or COUNT over
campaigns_unit: a campaign may hold millions
of units.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from django.contrib.auth import get_user_model
from django.db import connection
from django.utils import timezone

from campaigns.db import prepared, sql_rows
from campaigns.models import (
    Attempt,
    Batch,
    Campaign,
    Checkpoint,
    ErrorClass,
    ParameterVersion,
    Profile,
    Project,
    Reconciliation,
    Unit,
    UnitState,
    sees_every_project,
)

# The partial indexes' conditions written as constants, not parameters: a
# prepared statement's generic plan (campaigns/db/prepared.py) knows nothing
# of a parameter's value, so it could not use an index that holds only the
# failed units, or only the done batches. A LIMIT is written in too: a
# generic plan prices an unknown LIMIT as a tenth of the rows, and PostgreSQL
# would go on planning the statement for each call.
_FAILED = f"state = '{UnitState.FAILED.value}'"
_DONE = f"b.state = '{Batch.State.DONE.value}'"

# --- unit counts ------------------------------------------------------------------


# Both counts queries read, beside the counters, whether a planner is at work
# on the campaign (Campaign.planning_at, fresher than PLANNING_STALE): 1 or 0.
_PLANNING = "CASE WHEN c.planning_at > %(planning_after)s THEN 1 ELSE 0 END"


def _planning_after() -> Any:  # a datetime, or SQLite's text for one
    return connection.ops.adapt_datetimefield_value(Campaign.planning_after(timezone.now()))


def _among(ids: list[int]) -> tuple[str, dict[str, Any]]:
    """`= ANY(array)` on PostgreSQL, one parameter, so the statement keeps its
    shape however many ids and stays prepared (campaigns/db/prepared.py);
    `IN (…)` on SQLite. The condition's text and its named parameters."""
    if connection.vendor == "postgresql":
        return "= ANY(%(ids)s::bigint[])", {"ids": list(ids)}
    marks = ", ".join(f"%(c{i})s" for i in range(len(ids)))
    return f"IN ({marks})", {f"c{i}": value for i, value in enumerate(ids)}


def unit_count_rows(*, campaign_ids: list[int]) -> list[tuple]:
    """(campaign id, state, error class, SUM(n), rows summed, planning) of these
    campaigns' unit counters, one row per key; a campaign without counter rows
    gives one row of NULLs but its id and planning."""
    within, ids = _among(campaign_ids)
    with prepared.cursor() as cursor:
        cursor.execute(
            f"SELECT c.id, u.state, u.error_class, SUM(u.n), COUNT(u.n), {_PLANNING} "  # noqa: S608 (marks only)
            "FROM campaigns_campaign c "
            "LEFT JOIN campaigns_unitcount u ON u.campaign_id = c.id "
            f"WHERE c.id {within} "
            "GROUP BY c.id, c.planning_at, u.state, u.error_class",
            {"planning_after": _planning_after(), **ids},
        )
        return cursor.fetchall()


# campaigns_for_user's rule in SQL, on a campaign `c` (members and superusers:
# sees_every_project, passed in as %(staff)s; tests/
# campaigns/test_page_queries.py holds the two together): for the queries that
# read a campaign and more in one round trip.
_MAY_SEE = """(%(staff)s OR EXISTS (
    SELECT 1 FROM campaigns_project_members m
    WHERE m.project_id = c.project_id AND m.user_id = %(user)s))"""

# The poll's one query: the campaign by name if the user may see it, with its
# counters. An unknown name or an outsider gets no row at all.
_COUNTS_FOR_USER_SQL = f"""
SELECT c.id, u.state, u.error_class, SUM(u.n), COUNT(u.n), {_PLANNING}
FROM campaigns_campaign c
LEFT JOIN campaigns_unitcount u ON u.campaign_id = c.id
WHERE c.name = %(name)s AND {_MAY_SEE}
GROUP BY c.id, c.planning_at, u.state, u.error_class
"""


def _access(user, name: str) -> dict:
    return {"name": name, "staff": sees_every_project(user), "user": user.pk}


def unit_count_rows_for_user(*, user, name: str) -> list[tuple]:
    """unit_count_rows of the named campaign if the user may see it (no rows
    otherwise); a campaign without counter rows gives one row of NULLs."""
    with prepared.cursor() as cursor:
        cursor.execute(
            _COUNTS_FOR_USER_SQL, {**_access(user, name), "planning_after": _planning_after()}
        )
        return cursor.fetchall()


def unit_counts_compact(*, campaign_id: int) -> None:
    """Fold a campaign's count deltas into one row per key (PostgreSQL only:
    SQLite keeps one row per key already). Never waits: when another
    transaction is folding the same campaign, this does nothing."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT campaigns_unitcount_compact(%s)", [campaign_id])


def open_review_count(*, campaign_id: int) -> int:
    """The campaign's open review items, from the counters of migration 0016."""
    with prepared.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM(n), 0) FROM campaigns_reviewcount WHERE campaign_id = %s",
            [campaign_id],
        )
        return int(cursor.fetchone()[0])  # SUM(bigint) is numeric on PostgreSQL


def review_reason_counts(*, campaign_ids: list[int], state: str | None) -> dict[str, int]:
    """Review items of these campaigns per reason, in one state (None: any),
    from the counters of migration 0023_review_reason_counters; reasons with
    none left out, sorted by reason as the database sorts."""
    if not campaign_ids:
        return {}
    within, ids = _among(campaign_ids)
    in_state = " AND state = %(state)s" if state is not None else ""
    with prepared.cursor() as cursor:
        cursor.execute(
            f"SELECT reason, SUM(n) FROM campaigns_reviewreasoncount "  # noqa: S608 (marks only)
            f"WHERE campaign_id {within}{in_state} "
            "GROUP BY reason HAVING SUM(n) <> 0 ORDER BY reason",
            {**ids, "state": state},
        )
        return {reason: int(n) for reason, n in cursor.fetchall()}


# --- units ---------------------------------------------------------------------------

# The unit table's page in import order, the one the campaign page opens on and
# polls: its columns (selectors.UnitRow's), in plain SQL because building the
# ORM's query cost more than PostgreSQL's answer (bench/RESULTS.md, "The
# campaign page's rows and URLs (2026-12-04)"). The same conditions and order
# as the ORM's, so the same index (Unit.Meta.indexes) serves it.
UNIT_ROW_FIELDS = (
    "id",
    "uid",
    "state",
    "error_class",
    "error_message",
    "output_path",
    "updated_at",
)


def _unit_conditions(
    campaign_id: int, state: str, error: str, category: str
) -> tuple[list[str], list[Any]]:
    """The unit table's filters as SQL conditions and their parameters."""
    where: list[str] = ["campaign_id = %s"]
    params: list[Any] = [campaign_id]
    if state:
        where.append("state = %s")
        params.append(state)
    if error:
        where += ["state = %s", "error_class = %s"]
        params += [UnitState.FAILED, error]
    if category:
        where.append("category = %s")
        params.append(category)
    return where, params


def unit_rows_in_pk_order(
    *,
    campaign_id: int,
    state: str = "",
    error: str = "",
    category: str = "",
    after: int | None = None,
    limit: int,
) -> list[list]:
    """Up to `limit` units of the campaign after pk `after` (None: from the
    first), in pk order, with the filters set: UNIT_ROW_FIELDS each."""
    where, params = _unit_conditions(campaign_id, state, error, category)
    if after is not None:
        where.append("id > %s")
        params.append(after)
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT {sql_rows.columns(Unit, 'u', UNIT_ROW_FIELDS)} FROM campaigns_unit u "  # noqa: S608 (conditions of our own)
            f"WHERE {' AND '.join(where)} ORDER BY id LIMIT %s",
            [*params, limit],
        )
        rows = cursor.fetchall()
    convert = sql_rows.reader(Unit, UNIT_ROW_FIELDS).convert
    return [convert(iter(row)) for row in rows]


def unit_at_or_before(
    *, campaign_id: int, state: str = "", error: str = "", category: str = "", pk: int
) -> bool:
    """Whether a unit with these filters has pk `pk` or a lower one (the page
    after `pk` has a previous page): the nearest, read from the same index."""
    where, params = _unit_conditions(campaign_id, state, error, category)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT id FROM campaigns_unit "  # noqa: S608 (conditions of our own)
            f"WHERE {' AND '.join(where)} AND id <= %s ORDER BY id DESC LIMIT 1",
            [*params, pk],
        )
        return cursor.fetchone() is not None


# A campaign's categories, one index probe each on unit_campaign_category_id
# (a "skip scan"), rather than reading the distinct values of a million units
# or joining every review item to its unit (bench/RESULTS.md, "Re-measured on
# an idle machine (2026-11-30)", under "Pages at scale").
_CATEGORIES_SQL = """
WITH RECURSIVE found(category) AS (
    SELECT (SELECT category FROM campaigns_unit
            WHERE campaign_id = %(campaign)s AND category <> ''
            ORDER BY category LIMIT 1)
    UNION ALL
    SELECT (SELECT u.category FROM campaigns_unit u
            WHERE u.campaign_id = %(campaign)s AND u.category <> '' AND u.category > found.category
            ORDER BY u.category LIMIT 1)
    FROM found WHERE found.category IS NOT NULL
)
SELECT category FROM found WHERE category IS NOT NULL
"""


def unit_categories(*, campaign_ids: list[int]) -> list[str]:
    """Every category the units of these campaigns have, sorted, without reading them all."""
    found: set[str] = set()
    with prepared.cursor() as cursor:
        for campaign_id in campaign_ids:
            cursor.execute(_CATEGORIES_SQL, {"campaign": campaign_id})
            found.update(row[0] for row in cursor.fetchall())
    return sorted(found)


def failed_unit_rows(*, campaign_id: int, limit: int) -> list[tuple[str, str, str]]:
    """(uid, error class, message) of the campaign's first failed units by
    (error_class, pk): the partial failed-units index's order, so an index read
    however many units failed."""
    with prepared.cursor() as cursor:
        cursor.execute(
            "SELECT uid, error_class, error_message FROM campaigns_unit "  # noqa: S608 (a constant)
            f"WHERE campaign_id = %s AND {_FAILED} ORDER BY error_class, id LIMIT {int(limit)}",
            [campaign_id],
        )
        return cursor.fetchall()


# What the out-of-memory summary reads of an attempt and of its version.
_OOM_ATTEMPT_FIELDS = ("id", "unit", "version", "error_message", "metrics")


@functools.cache
def _memory_failure_sql(limit: int) -> str:
    return f"""
SELECT u.id, u.cost, {sql_rows.columns(Attempt, "a", _OOM_ATTEMPT_FIELDS)},
    {sql_rows.columns(ParameterVersion, "v", ("id", "params"))}
FROM (SELECT id, cost FROM campaigns_unit
      WHERE campaign_id = %(campaign)s AND {_FAILED} AND error_class = %(oom)s
      ORDER BY id LIMIT {int(limit)}) u
LEFT JOIN campaigns_attempt a ON a.unit_id = u.id AND a.error_class = %(oom)s
LEFT JOIN campaigns_parameterversion v ON v.id = a.version_id
ORDER BY a.id
"""


def memory_failure_rows(
    *, campaign_id: int, limit: int
) -> list[tuple[int, int | None, Attempt | None]]:
    """(unit id, cost, attempt) of the campaign's first `limit` units failed
    out_of_memory (the failed-units index's order) with each of their
    out_of_memory attempts in the order they were made, its version's params loaded (None:
    a unit without such an attempt): one statement."""
    with prepared.cursor() as cursor:
        cursor.execute(
            _memory_failure_sql(limit),
            {"campaign": campaign_id, "oom": ErrorClass.OUT_OF_MEMORY.value},
        )
        rows = cursor.fetchall()
    attempt_of = sql_rows.reader(Attempt, _OOM_ATTEMPT_FIELDS)
    version_of = sql_rows.reader(ParameterVersion, ("id", "params"))
    result = []
    for unit_id, cost, *rest in rows:
        values = iter(rest)
        attempt = attempt_of(values)
        version = version_of(values)
        if attempt is not None and version is not None:  # an attempt always has its version
            attempt.version = version
        result.append((unit_id, cost, attempt))
    return result


def newest_finished_batch(*, campaign_id: int) -> object | None:
    """The finished_at of the campaign's newest finished batch, as the database
    gives it (a datetime, or text on SQLite), from one entry of the partial
    index batch_done_finished; None before any. On a cache hit of the batch
    panels this is all they cost."""
    with prepared.cursor() as cursor:
        cursor.execute(
            f"SELECT finished_at FROM campaigns_batch b WHERE campaign_id = %s AND {_DONE} "  # noqa: S608 (a constant)
            "AND finished_at IS NOT NULL ORDER BY finished_at DESC LIMIT 1",
            [campaign_id],
        )
        row = cursor.fetchone()
    return row[0] if row else None


# --- the campaign and its page's header -----------------------------------------------

# Only what the page shows of them: a profile's steps or a checkpoint's sample
# can be long JSON documents.
_RECONCILIATION_FIELDS = ("id", "created_at", "deep", "seconds", "counts", "samples")
_PROFILE_FIELDS = ("id", "state", "chosen_batch_size")
_CHECKPOINT_FIELDS = ("id", "state", "reason", "decided_by", "decided_at")


def _decider_fields() -> tuple[str, str]:
    return ("id", get_user_model().USERNAME_FIELD)  # for get_username()


# A campaign with its project and current version, as the pages show it.
_CAMPAIGN_JOINS = """FROM campaigns_campaign c
JOIN campaigns_project p ON p.id = c.project_id
LEFT JOIN campaigns_parameterversion v ON v.id = c.current_version_id"""


def _campaign_columns() -> str:
    return ", ".join(
        sql_rows.columns(model, alias)
        for model, alias in ((Campaign, "c"), (Project, "p"), (ParameterVersion, "v"))
    )


def _campaign_from(values) -> Campaign:
    """The campaign whose _campaign_columns() lead `values`, project and version set."""
    campaign = sql_rows.instance(Campaign, values)
    assert campaign is not None  # a row: a campaign
    sql_rows.attach(campaign, "project", sql_rows.instance(Project, values))
    sql_rows.attach(campaign, "current_version", sql_rows.instance(ParameterVersion, values))
    return campaign


@functools.cache
def _campaign_for_user_sql() -> str:
    return (
        f"SELECT {_campaign_columns()}\n{_CAMPAIGN_JOINS}\nWHERE c.name = %(name)s AND {_MAY_SEE}"
    )


def campaign_row_for_user(*, user, name: str) -> Campaign | None:
    """The named campaign if the user may see it, its project and current
    version loaded, in one statement."""
    with prepared.cursor() as cursor:
        cursor.execute(_campaign_for_user_sql(), _access(user, name))
        row = cursor.fetchone()
    return None if row is None else _campaign_from(iter(row))


# What the campaign list shows of a campaign (selectors.campaign_list_for_user).
_LIST_CAMPAIGN_FIELDS = ("id", "project", "name", "processor", "current_version", "paused_at")
_LIST_CHECKPOINT_FIELDS = (*_CHECKPOINT_FIELDS, "created_at")


@functools.cache
def _campaign_list_sql() -> str:
    user_model = get_user_model()
    return f"""
SELECT {sql_rows.columns(Campaign, "c", _LIST_CAMPAIGN_FIELDS)},
    {sql_rows.columns(Project, "p", ("id", "name"))},
    {sql_rows.columns(ParameterVersion, "v", ("id", "number"))},
    {sql_rows.columns(Checkpoint, "ck", _LIST_CHECKPOINT_FIELDS)},
    {sql_rows.columns(user_model, "d", _decider_fields())}
{_CAMPAIGN_JOINS}
LEFT JOIN campaigns_checkpoint ck
    ON ck.campaign_id = c.id AND ck.version_id = c.current_version_id
LEFT JOIN {user_model._meta.db_table} d ON d.id = ck.decided_by_id
WHERE {_MAY_SEE}
ORDER BY c.created_at DESC, c.id
"""


def campaign_names_for_user(*, user) -> list[tuple[int, str]]:
    """(id, name) of the campaigns the user may see, by name: the review
    queue's campaign filter, sent with every view of the queue."""
    with prepared.cursor() as cursor:
        cursor.execute(
            f"SELECT c.id, c.name FROM campaigns_campaign c WHERE {_MAY_SEE} ORDER BY c.name",  # noqa: S608 (our rule)
            _access(user, ""),
        )
        return cursor.fetchall()


def campaign_list(*, user) -> list[tuple[Campaign, Checkpoint | None]]:
    """The campaigns the user may see, newest first (Campaign's ordering), with
    the columns the list shows, project and version set, each with its current
    version's checkpoint and who decided it: one statement for the whole list."""
    with prepared.cursor() as cursor:
        cursor.execute(_campaign_list_sql(), _access(user, ""))
        rows = cursor.fetchall()
    campaign_of = sql_rows.reader(Campaign, _LIST_CAMPAIGN_FIELDS)
    project_of = sql_rows.reader(Project, ("id", "name"))
    version_of = sql_rows.reader(ParameterVersion, ("id", "number"))
    checkpoint_of = sql_rows.reader(Checkpoint, _LIST_CHECKPOINT_FIELDS)
    decider_of = sql_rows.reader(get_user_model(), _decider_fields())
    result = []
    for row in rows:
        values = iter(row)
        campaign, project = campaign_of(values), project_of(values)
        assert campaign is not None and project is not None  # a row: a campaign, its project
        sql_rows.attach(campaign, "project", project)
        sql_rows.attach(campaign, "current_version", version_of(values))
        checkpoint = checkpoint_of(values)
        decider = decider_of(values)
        if checkpoint is not None:
            sql_rows.attach(checkpoint, "campaign", campaign)
            sql_rows.attach(checkpoint, "decided_by", decider)
        result.append((campaign, checkpoint))
    return result


@dataclass
class CampaignPage:
    """The campaign page's one-of-a-kind facts, read in one query."""

    campaign: Campaign
    reconciliation: Reconciliation | None
    latest_profile: Profile | None
    checkpoint: Checkpoint | None  # of the current version, decided_by loaded
    open_review_items: int
    # The newest finished batch's finished_at, as the database gives it: the
    # batch panels' cache key (batch_stats.batch_panels).
    newest_finished_batch: object


@functools.cache
def _campaign_page_sql() -> str:
    user_model = get_user_model()
    latest = "SELECT id FROM {} WHERE campaign_id = c.id ORDER BY created_at DESC, id DESC LIMIT 1"
    return f"""
SELECT {_campaign_columns()},
    {sql_rows.columns(Reconciliation, "r", _RECONCILIATION_FIELDS)},
    {sql_rows.columns(Profile, "pr", _PROFILE_FIELDS)},
    {sql_rows.columns(Checkpoint, "ck", _CHECKPOINT_FIELDS)},
    {sql_rows.columns(user_model, "d", _decider_fields())},
    (SELECT COALESCE(SUM(rc.n), 0) FROM campaigns_reviewcount rc WHERE rc.campaign_id = c.id),
    (SELECT b.finished_at FROM campaigns_batch b
     WHERE b.campaign_id = c.id AND {_DONE} AND b.finished_at IS NOT NULL
     ORDER BY b.finished_at DESC LIMIT 1)
{_CAMPAIGN_JOINS}
LEFT JOIN campaigns_reconciliation r
    ON r.id = ({latest.format("campaigns_reconciliation")})
LEFT JOIN campaigns_profile pr
    ON pr.id = ({latest.format("campaigns_profile")})
LEFT JOIN campaigns_checkpoint ck
    ON ck.campaign_id = c.id AND ck.version_id = c.current_version_id
LEFT JOIN {user_model._meta.db_table} d ON d.id = ck.decided_by_id
WHERE c.name = %(name)s AND {_MAY_SEE}
"""


def campaign_page(*, user, name: str) -> CampaignPage | None:
    """The named campaign if the user may see it, with its project, current
    version, last verify, latest profile, the current version's checkpoint and
    who decided it, the open review count and the newest finished batch's
    time: one statement."""
    with prepared.cursor() as cursor:
        cursor.execute(_campaign_page_sql(), _access(user, name))
        row = cursor.fetchone()
    if row is None:
        return None
    values = iter(row)
    campaign = _campaign_from(values)
    reconciliation = sql_rows.instance(Reconciliation, values, _RECONCILIATION_FIELDS)
    profile = sql_rows.instance(Profile, values, _PROFILE_FIELDS)
    checkpoint = sql_rows.instance(Checkpoint, values, _CHECKPOINT_FIELDS)
    decider = sql_rows.instance(get_user_model(), values, _decider_fields())
    open_review_items, newest_finished_batch = values
    if checkpoint is not None:
        sql_rows.attach(checkpoint, "campaign", campaign)
        sql_rows.attach(checkpoint, "decided_by", decider)
    return CampaignPage(
        campaign=campaign,
        reconciliation=reconciliation,
        latest_profile=profile,
        checkpoint=checkpoint,
        open_review_items=int(open_review_items),  # SUM(bigint) is numeric on PostgreSQL
        newest_finished_batch=newest_finished_batch,
    )
