"""Everything that reads campaign data for pages and commands.

Counts come from campaigns_unitcount, which triggers keep in the transaction
that changes units (migration 0009): one query over a few dozen rows per
campaign page or poll, one for the whole campaign list. Never GROUP BY or
COUNT over campaigns_unit on a page: a campaign may hold millions of units.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import NamedTuple

from django.contrib.auth import get_user_model
from django.db import connection
from django.db.models import Q, QuerySet

from campaigns.db import id_order, sql_rows
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
)


@dataclass
class Counts:
    pending: int = 0
    queued: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    needs_review: int = 0
    by_error: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return (
            self.pending
            + self.queued
            + self.running
            + self.succeeded
            + self.failed
            + self.needs_review
        )

    @property
    def done(self) -> int:
        return self.succeeded + self.failed + self.needs_review

    @property
    def active(self) -> bool:
        """Work is queued or running, so a page showing these counts should keep polling."""
        return bool(self.queued or self.running)

    @property
    def percent(self) -> int:
        return int(100 * self.done / self.total) if self.total else 0

    def as_dict(self, campaign: str) -> dict:
        return {
            "campaign": campaign,
            "total": self.total,
            "pending": self.pending,
            "queued": self.queued,
            "running": self.running,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "needs_review": self.needs_review,
            "by_error": dict(sorted(self.by_error.items())),
        }


def _fill(counts: Counts, state: str, n: int) -> None:
    if state in UnitState.values:
        setattr(counts, state, getattr(counts, state) + n)


def campaign_counts(*, campaign: Campaign) -> Counts:
    return counts_by_campaign(campaign_ids=[campaign.pk])[campaign.pk]


def counts_by_campaign(*, campaign_ids: list[int]) -> dict[int, Counts]:
    if not campaign_ids:
        return {}
    # Plain SQL: the poll's hottest query, where building it through the ORM
    # cost several times what PostgreSQL spends answering it.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT campaign_id, state, error_class, SUM(n), COUNT(*) FROM campaigns_unitcount "
            f"WHERE campaign_id IN ({', '.join(['%s'] * len(campaign_ids))}) "
            "GROUP BY campaign_id, state, error_class",
            campaign_ids,
        )
        rows = cursor.fetchall()
    return _counts_from_rows(campaign_ids, rows)


def _counts_from_rows(campaign_ids: list[int], rows) -> dict[int, Counts]:
    """Counts from (campaign id, state, error class, SUM(n), rows summed) rows;
    a campaign that summed many delta rows has them folded."""
    result = {cid: Counts() for cid in campaign_ids}
    deltas = dict.fromkeys(campaign_ids, 0)
    for cid, state, error_class, total, summed in rows:
        if state is None:  # a campaign without counter rows (an outer join's NULLs)
            continue
        counts, n = result[cid], int(total)  # SUM(bigint) is numeric on PostgreSQL
        _fill(counts, state, n)
        if state == UnitState.FAILED and n:
            counts.by_error[error_class] = n
        deltas[cid] += summed
    for cid, summed in deltas.items():
        if summed > COMPACT_AFTER_ROWS:
            unit_counts_compact(campaign_id=cid)
    return result


# campaigns_for_user's rule in SQL, on a campaign `c` (members and staff; tests/
# campaigns/test_page_queries.py holds the two together): for the queries that
# read a campaign and more in one round trip.
_MAY_SEE = """(%(staff)s OR EXISTS (
    SELECT 1 FROM campaigns_project_members m
    WHERE m.project_id = c.project_id AND m.user_id = %(user)s))"""

# The poll's one query: the campaign by name if the user may see it, with its
# counters. An unknown name or an outsider gets no row at all.
_COUNTS_FOR_USER_SQL = f"""
SELECT c.id, u.state, u.error_class, SUM(u.n), COUNT(u.n)
FROM campaigns_campaign c
LEFT JOIN campaigns_unitcount u ON u.campaign_id = c.id
WHERE c.name = %(name)s AND {_MAY_SEE}
GROUP BY c.id, u.state, u.error_class
"""


def campaign_counts_for_user(*, user, name: str) -> tuple[int, Counts] | None:
    """(campaign id, counts) of the named campaign, or None when the user may
    not see it: the counts poll in one round trip, where the campaign lookup
    through the ORM and the counts query cost three times as much (bench/RESULTS.md)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _COUNTS_FOR_USER_SQL, {"name": name, "staff": bool(user.is_staff), "user": user.pk}
        )
        rows = cursor.fetchall()
    if not rows:
        return None
    campaign_id = rows[0][0]
    return campaign_id, _counts_from_rows([campaign_id], rows)[campaign_id]


#: A reader that summed more delta rows than this for one campaign folds them
#: (PostgreSQL; the triggers also fold now and then). A handful of states and
#: error classes make a compacted campaign a dozen rows.
COMPACT_AFTER_ROWS = 200


def unit_counts_compact(*, campaign_id: int) -> None:
    """Fold a campaign's count deltas into one row per key (PostgreSQL only:
    SQLite keeps one row per key already). Never waits: when another
    transaction is folding the same campaign, this does nothing."""
    if connection.vendor != "postgresql":
        return
    with connection.cursor() as cursor:
        cursor.execute("SELECT campaigns_unitcount_compact(%s)", [campaign_id])


def campaigns_for_user(user) -> QuerySet[Campaign]:
    qs = Campaign.objects.select_related("project", "current_version")
    if user.is_staff:
        return qs
    return qs.filter(project__members=user)


# A campaign's categories, one index probe each on unit_campaign_category_id
# (a "skip scan"): reading the distinct values of a million units, or joining
# every review item to its unit, took 0.1-0.3 s (bench/RESULTS.md).
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
    with connection.cursor() as cursor:
        for campaign_id in campaign_ids:
            cursor.execute(_CATEGORIES_SQL, {"campaign": campaign_id})
            found.update(row[0] for row in cursor.fetchall())
    return sorted(found)


# --- the campaign page's header ------------------------------------------------

# Only what the page shows of them: a profile's steps or a checkpoint's sample
# can be long JSON documents.
_RECONCILIATION_FIELDS = ("id", "created_at", "deep", "seconds", "counts", "samples")
_PROFILE_FIELDS = ("id", "state", "chosen_batch_size")
_CHECKPOINT_FIELDS = ("id", "state", "reason", "decided_by", "decided_at")


def _decider_fields() -> tuple[str, str]:
    return ("id", get_user_model().USERNAME_FIELD)  # for get_username()


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
    campaign.project = sql_rows.instance(Project, values)
    campaign.current_version = sql_rows.instance(ParameterVersion, values)
    return campaign


@functools.cache
def _campaign_for_user_sql() -> str:
    return (
        f"SELECT {_campaign_columns()}\n{_CAMPAIGN_JOINS}\nWHERE c.name = %(name)s AND {_MAY_SEE}"
    )


def campaign_for_user(*, user, name: str) -> Campaign | None:
    """The named campaign if the user may see it (project and current version
    loaded), in plain SQL: every campaign view starts with it, and the ORM spent
    more building this query than PostgreSQL answering it (bench/RESULTS.md)."""
    with connection.cursor() as cursor:
        cursor.execute(
            _campaign_for_user_sql(),
            {"name": name, "staff": bool(user.is_staff), "user": user.pk},
        )
        row = cursor.fetchone()
    return None if row is None else _campaign_from(iter(row))


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
     WHERE b.campaign_id = c.id AND b.state = %(done)s AND b.finished_at IS NOT NULL
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


def campaign_page_for_user(*, user, name: str) -> CampaignPage | None:
    """The named campaign if the user may see it, with its project, current
    version, last verify, latest profile, the current version's checkpoint,
    the open review count and the newest finished batch: one round trip where
    the ORM took six (bench/RESULTS.md, "Pages at scale")."""
    with connection.cursor() as cursor:
        cursor.execute(
            _campaign_page_sql(),
            {
                "name": name,
                "staff": bool(user.is_staff),
                "user": user.pk,
                "done": Batch.State.DONE.value,
            },
        )
        row = cursor.fetchone()
    if row is None:
        return None
    values = iter(row)
    campaign = _campaign_from(values)
    reconciliation = sql_rows.instance(Reconciliation, values, _RECONCILIATION_FIELDS)
    profile = sql_rows.instance(Profile, values, _PROFILE_FIELDS)
    checkpoint = sql_rows.instance(Checkpoint, values, _CHECKPOINT_FIELDS)
    decider = sql_rows.instance(get_user_model(), values, _decider_fields())
    if checkpoint is not None:
        checkpoint.campaign = campaign
        checkpoint.decided_by = decider
    open_review_items, newest_finished_batch = values
    return CampaignPage(
        campaign=campaign,
        reconciliation=reconciliation,
        latest_profile=profile,
        checkpoint=checkpoint,
        open_review_items=int(open_review_items),  # SUM(bigint) is numeric on PostgreSQL
        newest_finished_batch=newest_finished_batch,
    )


def unit_lineage(*, campaign: Campaign, pk: int) -> tuple[Unit, list[Attempt]] | None:
    unit = Unit.objects.filter(campaign=campaign, pk=pk).select_related("batch").first()
    if unit is None:
        return None
    attempts = list(
        Attempt.objects.filter(unit=unit).select_related("version", "batch").order_by("started_at")
    )
    return unit, attempts


def failure_reasons(*, campaign: Campaign, limit: int = 10) -> list[tuple[str, str, str]]:
    """(uid, error class, message) of the first failures, by class.

    (error_class, pk): the order of the partial failed-units index, so they
    are an index read however many units failed. The page shows a few and
    links to the unit table filtered to failed units for the rest.
    """
    # Plain SQL, as the counts: building it through the ORM cost more than
    # PostgreSQL spends answering it.
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT uid, error_class, error_message FROM campaigns_unit "
            "WHERE campaign_id = %s AND state = %s ORDER BY error_class, id LIMIT %s",
            [campaign.pk, UnitState.FAILED.value, limit],
        )
        return cursor.fetchall()


def open_review_items(*, campaign: Campaign) -> int:
    """How many review items of the campaign wait for a decision, from the
    counters the triggers of migration 0016 keep (campaign_page_for_user reads
    them in its query)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT COALESCE(SUM(n), 0) FROM campaigns_reviewcount WHERE campaign_id = %s",
            [campaign.pk],
        )
        return int(cursor.fetchone()[0])


# --- the unit table ------------------------------------------------------------


@dataclass(frozen=True)
class UnitFilter:
    """What the unit table shows. Unknown values show everything rather than fail."""

    state: str = ""
    error: str = ""
    category: str = ""
    prefix: str = ""

    @classmethod
    def parse(cls, data: Mapping[str, str]) -> UnitFilter:
        state = data.get("state", "")
        error = data.get("error", "")
        return cls(
            state=state if state in UnitState.values else "",
            error=error if error in ErrorClass.values else "",
            # No unit holds a NUL, and PostgreSQL refuses one in a query.
            category=data.get("category", "").replace("\x00", "").strip()[:200],
            prefix=data.get("q", "").replace("\x00", "").strip()[:1000],
        )

    def params(self) -> dict[str, str]:
        given = {"state": self.state, "error": self.error, "category": self.category}
        given["q"] = self.prefix
        return {k: v for k, v in given.items() if v}


class UnitRow(NamedTuple):
    pk: int
    uid: str
    state: str
    error_class: str
    error_message: str
    output_path: str
    updated_at: datetime


@dataclass
class UnitPage:
    rows: list[UnitRow]
    # The cursors for the neighbour pages: ?after=<pk> and ?before=<pk>.
    next_after: int | None
    previous_before: int | None


UNIT_PAGE_SIZE = 50


def unit_page(
    *,
    campaign: Campaign,
    unit_filter: UnitFilter,
    after: int | None = None,
    before: int | None = None,
    size: int = UNIT_PAGE_SIZE,
) -> UnitPage:
    """One page of a campaign's units by keyset: in import (pk) order, or in
    id order when searching by id prefix (campaigns/db/id_order.py says why).

    A page is `key > cursor` (or `key < cursor`, read backwards) LIMIT size + 1
    on an index that ends in that key, one per filter (Unit.Meta.indexes): its
    cost does not grow with the campaign, unlike OFFSET, and there is no
    COUNT(*). Cursors are pks in either order, so links look the same.
    """
    units = Unit.objects.filter(campaign=campaign)
    if unit_filter.state:
        units = units.filter(state=unit_filter.state)
    if unit_filter.error:
        units = units.filter(state=UnitState.FAILED, error_class=unit_filter.error)
    if unit_filter.category:
        units = units.filter(category=unit_filter.category)
    order = _PK_ORDER
    if unit_filter.prefix:
        units = units.filter(id_order.prefix_range(unit_filter.prefix))
        order = _ID_ORDER
    # Tuples, not model instances: cheaper to build and to render.
    columns = units.values_list(*UnitRow._fields)
    if before is not None and (key := order.key(campaign, before)) is not None:
        found = list(columns.filter(order.below(key)).order_by(order.descending)[: size + 1])
        more_before = len(found) > size
        found = found[:size][::-1]
        more_after = _nearest(units.filter(order.at_or_above(key)).order_by(order.ascending))
    else:
        key = order.key(campaign, after) if after is not None else None
        if key is not None:
            columns = columns.filter(order.above(key))
        found = list(columns.order_by(order.ascending)[: size + 1])
        more_after = len(found) > size
        found = found[:size]
        more_before = key is not None and _nearest(
            units.filter(order.at_or_below(key)).order_by(order.descending)
        )
    rows = [UnitRow(*row) for row in found]
    return UnitPage(
        rows=rows,
        next_after=rows[-1].pk if rows and more_after else None,
        previous_before=rows[0].pk if rows and more_before else None,
    )


@dataclass(frozen=True)
class _KeysetOrder:
    """How the unit table pages: the key a cursor pk stands for, the
    conditions on either side of it, and the orderings."""

    key: Callable[[Campaign, int], object]
    above: Callable[[object], Q]
    below: Callable[[object], Q]
    at_or_above: Callable[[object], Q]
    at_or_below: Callable[[object], Q]
    ascending: object
    descending: object


_PK_ORDER = _KeysetOrder(
    key=lambda campaign, pk: pk,
    above=lambda pk: Q(pk__gt=pk),
    below=lambda pk: Q(pk__lt=pk),
    at_or_above=lambda pk: Q(pk__gte=pk),
    at_or_below=lambda pk: Q(pk__lte=pk),
    ascending="pk",
    descending="-pk",
)
_ID_ORDER = _KeysetOrder(
    # A cursor from another campaign or a deleted unit: the first page.
    key=lambda campaign, pk: (
        Unit.objects.filter(campaign=campaign, pk=pk).values_list("uid", flat=True).first()
    ),
    above=lambda uid: id_order.compare(">", uid),
    below=lambda uid: id_order.compare("<", uid),
    at_or_above=lambda uid: id_order.compare(">=", uid),
    at_or_below=lambda uid: id_order.compare("<=", uid),
    ascending=id_order.InIdOrder(),
    descending=id_order.InIdOrder(descending=True),
)


def _nearest(units: QuerySet[Unit]) -> bool:
    """Whether a row lies beyond the cursor: the nearest one, read in keyset
    order from the same index as the page (exists() drops the ORDER BY and
    leaves the planner free to scan the table from its start)."""
    return bool(units.values_list("pk", flat=True)[:1])
