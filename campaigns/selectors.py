"""Everything that reads campaign data for pages and commands.

Counts come from campaigns_unitcount, which triggers keep in the transaction
that changes units (migration 0009): one query over a few dozen rows per
campaign page or poll, one for the whole campaign list. Never GROUP BY or
COUNT over campaigns_unit on a page: a campaign may hold millions of units.
The hand-written SQL of these reads lives in campaigns/db/page_queries.py;
this module turns its rows into what pages and commands use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from django.db.models import Q, QuerySet

from campaigns.db import id_order, page_queries
from campaigns.db.page_queries import CampaignPage
from campaigns.models import (
    Attempt,
    Campaign,
    Checkpoint,
    ErrorClass,
    Profile,
    Unit,
    UnitState,
    sees_every_project,
)
from campaigns.runs.memory_errors import MemoryFailure, ProfileBatch, explain
from campaigns.specs.processors import cost_unit, get_spec


@dataclass
class Counts:
    pending: int = 0
    queued: int = 0
    running: int = 0
    succeeded: int = 0
    failed: int = 0
    needs_review: int = 0
    by_error: dict[str, int] = field(default_factory=dict)
    # A run's planner is weighing and planning the next slice (Campaign.planning_at).
    planning: bool = False

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
        """Work is queued or running, or being planned, so a page showing these
        counts should keep polling: workers faster than the planner run dry
        between its slices, and the page must not stop at such a gap."""
        return bool(self.queued or self.running or self.planning)

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
            "planning": self.planning,
        }


# UnitState.values builds its list on every read: _fill runs once per counter row.
_UNIT_STATES = frozenset(UnitState.values)


def _fill(counts: Counts, state: str, n: int) -> None:
    if state in _UNIT_STATES:
        setattr(counts, state, getattr(counts, state) + n)


def campaign_counts(*, campaign: Campaign) -> Counts:
    return counts_by_campaign(campaign_ids=[campaign.pk])[campaign.pk]


def counts_by_campaign(*, campaign_ids: list[int]) -> dict[int, Counts]:
    if not campaign_ids:
        return {}
    return _counts_from_rows(campaign_ids, page_queries.unit_count_rows(campaign_ids=campaign_ids))


def _counts_from_rows(campaign_ids: list[int], rows) -> dict[int, Counts]:
    """Counts from (campaign id, state, error class, SUM(n), rows summed,
    planning) rows; a campaign that summed many delta rows has them folded."""
    result = {cid: Counts() for cid in campaign_ids}
    deltas = dict.fromkeys(campaign_ids, 0)
    for cid, state, error_class, total, summed, planning in rows:
        result[cid].planning = bool(planning)
        if state is None:  # a campaign without counter rows (an outer join's NULLs)
            continue
        counts, n = result[cid], int(total)  # SUM(bigint) is numeric on PostgreSQL
        _fill(counts, state, n)
        if state == UnitState.FAILED and n:
            counts.by_error[error_class] = n
        deltas[cid] += summed
    for cid, summed in deltas.items():
        if summed > COMPACT_AFTER_ROWS:
            page_queries.unit_counts_compact(campaign_id=cid)
    return result


def campaign_counts_for_user(*, user, name: str) -> tuple[int, Counts] | None:
    """(campaign id, counts) of the named campaign, or None when the user may
    not see it: the counts poll in one round trip, where the campaign lookup
    through the ORM and the counts query costs more (bench/RESULTS.md, "Counts poll
    in one query, cached batch panels (2026-11-30)")."""
    rows = page_queries.unit_count_rows_for_user(user=user, name=name)
    if not rows:
        return None
    campaign_id = rows[0][0]
    return campaign_id, _counts_from_rows([campaign_id], rows)[campaign_id]


#: A reader that summed more delta rows than this for one campaign folds them
#: (PostgreSQL; the triggers also fold now and then). A handful of states and
#: error classes make a compacted campaign a dozen rows.
COMPACT_AFTER_ROWS = 200


def campaigns_for_user(user) -> QuerySet[Campaign]:
    """The campaigns of the user's projects; a superuser's, every one
    (sees_every_project: order staff see none of the customers')."""
    qs = Campaign.objects.select_related("project", "current_version")
    if sees_every_project(user):
        return qs
    return qs.filter(project__members=user)


def campaign_list_for_user(*, user) -> list[tuple[Campaign, Checkpoint | None]]:
    """The campaign list's campaigns (campaigns_for_user's, in its order) with
    the checkpoint of each one's current version: one statement, where the ORM
    sent two and spent longer building them than PostgreSQL answering them
    (bench/RESULTS.md, "Pages at scale")."""
    return page_queries.campaign_list(user=user)


def campaign_names_for_user(*, user) -> list[tuple[int, str]]:
    """(id, name) of campaigns_for_user's campaigns, by name, in one prepared
    statement (campaigns/db/prepared.py)."""
    return page_queries.campaign_names_for_user(user=user)


def unit_categories(*, campaign_ids: list[int]) -> list[str]:
    """Every category the units of these campaigns have, sorted, without reading them all."""
    return page_queries.unit_categories(campaign_ids=campaign_ids)


# --- what a campaign is doing ---------------------------------------------------


@dataclass(frozen=True)
class RunState:
    """What a campaign is doing and what holds it, as the campaign page's
    header and status line, the campaign list and `campaign status` say it."""

    key: str  # running, checkpoint, checkpoint_failed, paused, idle, done, empty
    label: str  # a few words: "Waiting at checkpoint 12 (v2)"
    detail: str  # what holds it and what to do
    checkpoint_id: int | None = None  # the checkpoint to open, when one holds it


def run_state(*, campaign: Campaign, counts: Counts, checkpoint: Checkpoint | None) -> RunState:
    """The one rule for a campaign's state, from its counts, its Pause and the
    checkpoint of its current version (None: none yet).

    Work queued or running comes first: nothing else is read then. A waiting
    or failed checkpoint comes before a Pause, since Resume cannot send the
    units it holds (campaigns/review/queue.py, run_allowance); a Pause counts
    only while units are pending (Run and Resume clear it:
    campaigns/runs/start.py)."""
    units = _units(counts.pending)
    if counts.active:
        busy = counts.queued + counts.running
        if counts.planning and not busy:
            return RunState("running", "Running", f"planning the next batches, {units} to do")
        return RunState(
            "running",
            "Running",
            f"{_units(busy)} queued or running"
            + ("; more being planned" if counts.planning and counts.pending else ""),
        )
    if checkpoint is not None and checkpoint.state != Checkpoint.State.PASSED:
        number = campaign.current_version.number if campaign.current_version else "?"
        if checkpoint.state == Checkpoint.State.PENDING:
            held = f"{units} wait for it" if counts.pending else "every unit is processed"
            unwritten = output_write_errors(counts)
            return RunState(
                "checkpoint",
                f"Waiting at checkpoint {checkpoint.pk} (v{number})",
                f"{held}: review its spot check and pass or fail it "
                f"(on its page, or campaign checkpoint {campaign.name} pass|fail)"
                + (f"; {write_failed_detail(unwritten)}" if unwritten else ""),
                checkpoint.pk,
            )
        return RunState(
            "checkpoint_failed",
            f"Stopped: checkpoint {checkpoint.pk} (v{number}) failed",
            f"{checkpoint.reason or 'failed'}. Save changed parameters (a new version) to go on",
            checkpoint.pk,
        )
    if counts.pending and campaign.paused_at is not None:
        since = campaign.paused_at.strftime("%Y-%m-%d %H:%M")
        return RunState("paused", "Paused", f"since {since}: {units} to do; Resume goes on")
    if unwritten := output_write_errors(counts):
        # Not "done": these units' inputs are fine, only their outputs could
        # not be written, and Resume does them again (campaigns/runs/control.py).
        also = f"; {units} to do besides" if counts.pending else ""
        return RunState(
            "write_failed", "Outputs not written", write_failed_detail(unwritten) + also
        )
    if counts.pending:
        return RunState("idle", "Idle", f"{units} to do")
    if counts.total:
        return RunState("done", "Done", "nothing left to run")
    return RunState("empty", "No units", "import inputs to run")


def output_write_errors(counts: Counts) -> int:
    """Units whose output could not be written (disk full, not writable, or a
    storage that did not give back the bytes written)."""
    return counts.by_error.get(ErrorClass.OUTPUT_WRITE_ERROR, 0)


def write_failed_detail(unwritten: int) -> str:
    return (
        f"{_units(unwritten)} failed to write {'its' if unwritten == 1 else 'their'} output "
        "(disk full, not writable, or not kept as written): free space, fix the output "
        "folder's permissions or its storage, "
        "then Resume redoes them"
    )


def campaign_run_state(*, campaign_id: int, counts: Counts) -> RunState:
    """run_state where only the counts are at hand (the counts poll, the
    command): the campaign and its checkpoint are read only once it is idle."""
    if counts.active:
        return run_state(campaign=Campaign(pk=campaign_id), counts=counts, checkpoint=None)
    campaign = Campaign.objects.select_related("current_version").get(pk=campaign_id)
    checkpoint = Checkpoint.objects.filter(
        campaign_id=campaign_id, version_id=campaign.current_version_id
    ).first()
    return run_state(campaign=campaign, counts=counts, checkpoint=checkpoint)


def _units(n: int) -> str:
    return f"{n:,} unit{'s' if n != 1 else ''}"


# --- the campaign page's header ------------------------------------------------


def campaign_for_user(*, user, name: str) -> Campaign | None:
    """The named campaign if the user may see it (project and current version
    loaded), in plain SQL: every campaign view starts with it, and the ORM spent
    more building this query than PostgreSQL answering it (bench/RESULTS.md, "The
    campaign page's header in one query (2026-11-30)")."""
    return page_queries.campaign_row_for_user(user=user, name=name)


def campaign_page_for_user(*, user, name: str) -> CampaignPage | None:
    """The named campaign if the user may see it, with its project, current
    version, last verify, latest profile, the current version's checkpoint,
    the open review count and the newest finished batch: one round trip where
    the ORM takes six (bench/RESULTS.md, "The campaign page's header in one query
    (2026-11-30)")."""
    return page_queries.campaign_page(user=user, name=name)


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
    return page_queries.failed_unit_rows(campaign_id=campaign.pk, limit=limit)


def open_review_items(*, campaign: Campaign) -> int:
    """How many review items of the campaign wait for a decision, from the
    counters the triggers of migration 0016 keep (campaign_page_for_user reads
    them in its query)."""
    return page_queries.open_review_count(campaign_id=campaign.pk)


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
    if not unit_filter.prefix and before is None:
        return _unit_page_in_pk_order(campaign, unit_filter, after, size)
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


def _unit_page_in_pk_order(
    campaign: Campaign, unit_filter: UnitFilter, after: int | None, size: int
) -> UnitPage:
    """unit_page forwards in import order, the page the campaign page opens on
    and polls, in plain SQL (page_queries.unit_rows_in_pk_order)."""
    f = unit_filter
    found = page_queries.unit_rows_in_pk_order(
        campaign_id=campaign.pk,
        state=f.state,
        error=f.error,
        category=f.category,
        after=after,
        limit=size + 1,
    )
    rows = [UnitRow(*row) for row in found[:size]]
    more_before = after is not None and page_queries.unit_at_or_before(
        campaign_id=campaign.pk, state=f.state, error=f.error, category=f.category, pk=after
    )
    return UnitPage(
        rows=rows,
        next_after=rows[-1].pk if rows and len(found) > size else None,
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


# --- out-of-memory failures (campaigns/runs/memory_errors.py explains them) ---


def latest_profile_batch(*, campaign: Campaign) -> ProfileBatch | None:
    """The newest finished profile's chosen batch, if one chose."""
    row = (
        Profile.objects.filter(
            campaign=campaign, state=Profile.State.DONE, chosen_batch_size__isnull=False
        )
        .order_by("-created_at", "-pk")
        .values_list("pk", "chosen_batch_size", "device")
        .first()
    )
    if row is None or row[1] is None:
        return None
    return ProfileBatch(pk=row[0], batch_size=row[1], device=row[2])


def unit_memory_failure(*, campaign: Campaign, unit: Unit, attempt: Attempt) -> MemoryFailure:
    """The unit page's explanation of its out-of-memory attempt."""
    params = attempt.version.params if attempt.version_id else {}
    cost = unit.cost if unit.cost is not None else _weigh_now(campaign, unit, params)
    return explain(
        error_message=attempt.error_message,
        facts=(attempt.metrics or {}).get("oom"),
        params=params,
        profile=latest_profile_batch(campaign=campaign),
        cost=cost,
        unit=cost_unit(campaign.processor),
    )


def _weigh_now(campaign: Campaign, unit: Unit, params: Mapping[str, Any]) -> int | None:
    """A unit not weighed when it was planned (the `original` policy weighs
    nothing), weighed now as a run would: one input, for its page."""
    try:
        spec = get_spec(campaign.processor)
        return spec.weigh(Path(campaign.input_root), [unit.source_path], dict(params))[0]
    except Exception:
        # The cost helps the advice; a processor no longer installed, or a
        # tokenizer gone with its model, must not take the page down with it.
        return None


#: Failed units the campaign's summary looks at (the first, by the failures index).
SUMMARY_UNITS = 20


@dataclass
class CampaignMemoryFailures:
    """The campaign's out-of-memory failures in one explanation."""

    failed: int  # units failed out_of_memory, all of them
    looked_at: int  # of which the summary read
    alone: int  # of those, failed alone at batch 1
    largest_cost: int | None
    failure: MemoryFailure  # the heaviest one looked at, with the advice


def campaign_memory_failures(*, campaign: Campaign, failed: int) -> CampaignMemoryFailures | None:
    """The failures summary's explanation of the out_of_memory class: one
    read (the first failed units on the failed-units index with their
    out_of_memory attempts), made only when the counters say such failures
    exist. Plain SQL: the page shows it on every view while such failures
    stand, and the ORM spent longer building the reads than the database
    answering them (bench/RESULTS.md, "Pages at scale")."""
    if not failed:
        return None
    rows = page_queries.memory_failure_rows(campaign_id=campaign.pk, limit=SUMMARY_UNITS)
    if not rows:
        return None
    costs = {unit_id: cost for unit_id, cost, _ in rows}
    last: dict[int, Attempt] = {}
    for unit_id, _, attempt in rows:  # oldest first: the last one stays
        if attempt is not None:
            last[unit_id] = attempt
    if not last:
        return None
    facts = {pk: (a.metrics or {}).get("oom") or {} for pk, a in last.items()}
    # The heaviest failure speaks for the rest: what makes it fit makes them fit.
    heaviest = max(last, key=lambda pk: (bool(facts[pk].get("alone")), costs.get(pk) or 0))
    attempt = last[heaviest]
    known = [c for c in costs.values() if c is not None]
    return CampaignMemoryFailures(
        failed=failed,
        looked_at=len(last),
        alone=sum(1 for f in facts.values() if f.get("alone")),
        largest_cost=max(known) if known else None,
        failure=explain(
            error_message=attempt.error_message,
            facts=facts[heaviest] or None,
            params=attempt.version.params,
            profile=latest_profile_batch(campaign=campaign),
            cost=costs.get(heaviest),
            unit=cost_unit(campaign.processor),
        ),
    )
