"""A unit of work (one input) and its results: its state and error classes,
the per-campaign counts of those states, and the Attempts that record every
try. Also the expression that lets SQLite use the attempts' vector-hash index."""

from __future__ import annotations

from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KT

from campaigns.models.batch import Batch
from campaigns.models.campaign import Campaign, ParameterVersion


class AsInIndex(models.Expression):
    """`expression` with its parameters written into the SQL, as in CREATE INDEX.

    SQLite uses an expression index only where a query repeats the index's
    very text, and the index's DDL holds KT's JSON path as a literal where a
    query sends it as a parameter: without this, the duplicate-vector lookup
    reads every successful attempt of the version, each batch (EXPLAIN QUERY
    PLAN shows `version_id=? AND <expr>=?` with it, `version_id=?` without;
    bench/RESULTS.md, "The ceiling in every row, four small cuts (2026-11-30)").
    PostgreSQL gets the parameters as they are.
    """

    def __init__(self, expression, output_field):
        super().__init__(output_field=output_field)
        self.expression = expression

    def get_source_expressions(self):
        return [self.expression]

    def set_source_expressions(self, exprs):
        (self.expression,) = exprs

    def as_sql(self, compiler, connection):
        sql, params = compiler.compile(self.expression)
        if connection.vendor != "sqlite":
            return sql, params
        if not all(isinstance(p, str) for p in params):
            raise TypeError("only text parameters are written into the SQL")
        return sql % tuple("'{}'".format(p.replace("'", "''")) for p in params), ()


# The duplicate-vector check's key: one definition for the index and the query.
VECTOR_HASH = KT("metrics__vector_hash")


class UnitState(models.TextChoices):
    PENDING = "pending"
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    NEEDS_REVIEW = "needs_review"


#: States in which a unit is somebody's work in progress.
IN_FLIGHT = (UnitState.QUEUED, UnitState.RUNNING)


class ErrorClass(models.TextChoices):
    INPUT_MISSING = "input_missing"
    INPUT_UNREADABLE = "input_unreadable"
    INPUT_INVALID = "input_invalid"
    INPUT_CHANGED = "input_changed"
    PROCESSING_ERROR = "processing_error"
    OUT_OF_MEMORY = "out_of_memory"
    OUTPUT_INVALID = "output_invalid"
    OUTPUT_WRITE_ERROR = "output_write_error"
    TIMEOUT = "timeout"
    REJECTED_BY_REVIEW = "rejected_by_review"


#: Failures that come from the input itself: retrying the same bytes cannot help.
INPUT_ERRORS = (
    ErrorClass.INPUT_MISSING,
    ErrorClass.INPUT_UNREADABLE,
    ErrorClass.INPUT_INVALID,
    ErrorClass.INPUT_CHANGED,
)


class Unit(models.Model):
    # No index of its own: every index below (and the unique id) starts with
    # the campaign, and a tenth index cost every imported row its entry. On
    # PostgreSQL the foreign key is checked once per statement by triggers
    # instead of once per row (migration 0013); SQLite keeps its declared key.
    campaign = models.ForeignKey(
        Campaign,
        on_delete=models.CASCADE,
        related_name="units",
        db_index=False,
        db_constraint=False,
    )
    # Stable id: the manifest's id, or the normalised relative path of the input.
    uid = models.CharField(max_length=1000)
    source_path = models.CharField(max_length=2000)
    size = models.BigIntegerField(null=True, blank=True)
    sha256 = models.CharField(max_length=64, blank=True)
    # With size, what lets verify spot a changed input by stat alone.
    mtime_ns = models.BigIntegerField(null=True, blank=True)
    category = models.CharField(max_length=200, blank=True)
    # What the unit weighs for batching (tokens, pixels), measured when a run
    # first groups it; null until then.
    cost = models.PositiveIntegerField(null=True, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    # Kept out of profiling samples and tuning; reported at checkpoints and at the end.
    holdout = models.BooleanField(default=False)
    state = models.CharField(max_length=20, choices=UnitState.choices, default=UnitState.PENDING)
    error_class = models.CharField(max_length=30, choices=ErrorClass.choices, blank=True)
    error_message = models.TextField(blank=True)
    # Indexed only where set (unit_batch_assigned): an imported unit has no
    # batch, so a million new rows add no entries to it.
    batch = models.ForeignKey(
        Batch, on_delete=models.SET_NULL, null=True, blank=True, db_index=False
    )
    # Relative to OUTPUT_ROOT, so nodes that mount it elsewhere agree.
    output_path = models.CharField(max_length=2000, blank=True)
    output_size = models.BigIntegerField(null=True, blank=True)
    output_sha256 = models.CharField(max_length=64, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [
            # varchar_pattern_ops (PostgreSQL; ignored elsewhere) lets the same
            # index serve the id prefix search (uid LIKE 'abc%') as well as
            # equality, so an imported row pays for one index on uid, not two.
            models.UniqueConstraint(
                fields=["campaign", "uid"],
                name="unit_uid_unique",
                opclasses=["int8_ops", "varchar_pattern_ops"],
            ),
        ]
        # The unit table pages by keyset (pk > last shown) within each filter,
        # so every filter has an index ending in id: a page is an index range
        # read of 51 entries, never an OFFSET or a sort of the campaign.
        # The id prefix search reads unit_uid_unique as a range, in id order
        # (campaigns/db/id_order.py), on both databases.
        indexes = [
            # The unit table, unfiltered: a campaign's units in import order.
            models.Index(fields=["campaign", "id"], name="unit_campaign_id"),
            # "pending units of a campaign" for run, and the table filtered by state.
            models.Index(fields=["campaign", "state", "id"], name="unit_campaign_state_id"),
            # The failures list and the table filtered by error class.
            models.Index(
                fields=["campaign", "error_class", "id"],
                name="unit_campaign_error_id",
                condition=Q(state="failed"),
            ),
            # The table filtered by category; uncategorised units (files at
            # the top of a folder import, manifests without categories) are
            # never filtered on, so they add no entries.
            models.Index(
                fields=["campaign", "category", "id"],
                name="unit_campaign_category_id",
                condition=~Q(category=""),
            ),
            models.Index(
                fields=["batch"], name="unit_batch_assigned", condition=Q(batch__isnull=False)
            ),
        ]

    def __str__(self) -> str:
        return self.uid


class UnitCount(models.Model):
    """How many units of a campaign are in a state (and error class): what pages show.

    Written only by database triggers on campaigns_unit (migration 0009), in the
    transaction that changes the units, so every path (bulk update, raw SQL,
    COPY then INSERT ... SELECT) keeps it right. On PostgreSQL the rows are
    deltas appended per statement, several per key; readers SUM them and
    campaigns_unitcount_compact() folds them. On SQLite one row per key.
    """

    # No database foreign key and DO_NOTHING: Django deletes a campaign's units
    # first, whose trigger appends deltas, then the campaign, whose trigger
    # deletes these rows. A cascade from Django would run before the units went.
    campaign = models.ForeignKey(
        Campaign,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    state = models.CharField(max_length=20)
    error_class = models.CharField(max_length=30, blank=True)
    n = models.BigIntegerField()

    class Meta:
        indexes = [
            # Reads (SUM per campaign), compaction and SQLite's trigger upsert.
            models.Index(fields=["campaign", "state", "error_class"], name="unitcount_key"),
        ]


class Attempt(models.Model):
    """One try at one unit; never updated, so the history stays."""

    class Outcome(models.TextChoices):
        SUCCEEDED = "succeeded"
        FAILED = "failed"

    unit = models.ForeignKey(Unit, on_delete=models.CASCADE, related_name="attempts")
    batch = models.ForeignKey(Batch, on_delete=models.SET_NULL, null=True, related_name="attempts")
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="+")
    outcome = models.CharField(max_length=20, choices=Outcome.choices)
    error_class = models.CharField(max_length=30, choices=ErrorClass.choices, blank=True)
    error_message = models.TextField(blank=True)
    # Groups identical failures without storing every traceback.
    traceback_digest = models.CharField(max_length=16, blank=True)
    # The input bytes this attempt actually read: lineage from output to source.
    input_sha256 = models.CharField(max_length=64, blank=True)
    output_path = models.CharField(max_length=2000, blank=True)
    output_size = models.BigIntegerField(null=True, blank=True)
    output_sha256 = models.CharField(max_length=64, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField()
    duration_ms = models.PositiveIntegerField()
    # Per-unit measurements: tokens before and after truncation.
    metrics = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-finished_at"]
        indexes = [
            # The duplicate-vector check of every batch looks its hashes up
            # among the version's earlier outputs: a probe, not a scan of
            # every attempt of the version (a million at a million units).
            models.Index(
                F("version"),
                VECTOR_HASH,
                condition=Q(outcome="succeeded"),
                name="attempt_version_vector_hash",
            ),
        ]
