from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.fields.json import KT


class AsInIndex(models.Expression):
    """`expression` with its parameters written into the SQL, as in CREATE INDEX.

    SQLite uses an expression index only where a query repeats the index's
    very text, and the index's DDL holds KT's JSON path as a literal where a
    query sends it as a parameter: without this, the duplicate-vector lookup
    read every successful attempt of the version, each batch (measured:
    EXPLAIN QUERY PLAN shows `version_id=? AND <expr>=?` with it, `version_id=?`
    without). PostgreSQL gets the parameters as they are.
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


class Project(models.Model):
    name = models.CharField(max_length=200, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="projects", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Campaign(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="campaigns")
    # The name is what the CLI takes and what output folders are called: one namespace.
    name = models.SlugField(max_length=100, unique=True)
    processor = models.CharField(max_length=50)
    # The folder units' relative paths resolve against; read, never written.
    input_root = models.CharField(max_length=1000)
    current_version = models.ForeignKey(
        "ParameterVersion", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # Units processed before the checkpoint stops the campaign for a spot check:
    # None = max(1% of the units, 200), 0 = no checkpoint.
    checkpoint_after = models.PositiveIntegerField(null=True, blank=True)
    # Share of units (by a hash of their id) kept out of profiling and tuning.
    holdout_share = models.FloatField(default=0.05)
    # What the units' costs were weighed under (ProcessorSpec.cost_basis; None:
    # never weighed): a version with another tokenizer or token cap weighs them
    # again. Nullable without a default so that SQLite adds the column in place:
    # remaking the table would drop its triggers (unit and review counters).
    cost_basis = models.CharField(max_length=64, null=True, blank=True)
    # The last Pause: a run still planning (a slice at a time, or a portal
    # worker planning the rest) stops at it. Nullable for the same reason.
    paused_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name


class ParameterVersion(models.Model):
    """Every choice that shapes an output, frozen. A change is a new version."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField()
    params = models.JSONField()
    software = models.JSONField()
    fingerprint = models.CharField(max_length=64)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["campaign", "number"], name="version_number_unique"),
            models.UniqueConstraint(
                fields=["campaign", "fingerprint"], name="version_fingerprint_unique"
            ),
        ]
        ordering = ["campaign", "number"]

    def __str__(self) -> str:
        return f"{self.campaign.name} {self.label}"

    @property
    def label(self) -> str:
        """Folder name for this version's outputs: number and fingerprint, never reused."""
        return f"v{self.number}-{self.fingerprint[:10]}"

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise ValueError("A parameter version is immutable; create a new one instead.")
        super().save(*args, **kwargs)


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


class Batch(models.Model):
    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"
        CANCELLED = "cancelled"

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="batches")
    # RESTRICT: a version that made batches cannot go on its own, only with its campaign.
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="batches")
    state = models.CharField(max_length=20, choices=State.choices, default=State.QUEUED)
    size = models.PositiveIntegerField()
    worker = models.CharField(max_length=200, blank=True)
    # The lease: whoever holds the token owns the batch until lease_expires_at,
    # which a heartbeat pushes forward while the worker lives. A dead worker
    # stops pushing; the sweeper then puts the batch back in the queue.
    lease_token = models.CharField(max_length=32, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    deliveries = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # How the batch was formed: original / length_grouped / token_budget.
    policy = models.CharField(max_length=20, blank=True)
    # What the worker measured, as columns so pages aggregate them in SQL:
    # tokens (or pixels) the model saw, real and with padding; model time;
    # device memory after the batch (CUDA) and its peaks; process RSS on CPU.
    real_tokens = models.BigIntegerField(null=True, blank=True)
    padded_tokens = models.BigIntegerField(null=True, blank=True)
    compute_seconds = models.FloatField(null=True, blank=True)
    mem_allocated = models.BigIntegerField(null=True, blank=True)
    mem_reserved = models.BigIntegerField(null=True, blank=True)
    mem_peak_allocated = models.BigIntegerField(null=True, blank=True)
    mem_peak_reserved = models.BigIntegerField(null=True, blank=True)
    rss = models.BigIntegerField(null=True, blank=True)
    # Everything else the worker measured: runtime facts, splits, adoptions.
    metrics = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)

    class Meta:
        verbose_name_plural = "batches"
        indexes = [
            # The lease sweeper: running batches whose lease expired.
            models.Index(
                fields=["lease_expires_at"],
                name="batch_running_lease",
                condition=Q(state="running"),
            ),
            # resume: queued batches of a campaign, to send their task again.
            models.Index(fields=["campaign", "state"], name="batch_campaign_state"),
            # The campaign page's memory chart: the last 200 finished batches,
            # an index read instead of sorting every batch of the campaign.
            models.Index(
                fields=["campaign", "finished_at"],
                name="batch_done_finished",
                condition=Q(state="done"),
            ),
        ]

    def __str__(self) -> str:
        return f"batch {self.pk} of {self.campaign.name}"


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
            # The table filtered by category; uncategorised units (most
            # imports) are never filtered on, so they add no entries.
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


class Reconciliation(models.Model):
    """One run of verify: what the disk said about every unit, and what it fixed."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="reconciliations")
    created_at = models.DateTimeField(auto_now_add=True)
    deep = models.BooleanField(default=False)
    seconds = models.FloatField()
    # verdict -> number of units; plus orphans and stale temp files.
    counts = models.JSONField()
    # verdict -> a few unit ids with their reason, for the page and the CLI.
    samples = models.JSONField(default=dict)

    class Meta:
        ordering = ["-created_at"]


class Profile(models.Model):
    """A batch-size measurement on a saved sample of the campaign's own inputs."""

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="profiles")
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="+")
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    # The sample, saved so the same profile can run again and be compared:
    # unit ids, and which of them were picked as the heaviest.
    sample = models.JSONField(default=list)
    heavy = models.JSONField(default=list)
    margin = models.FloatField(default=0.2)
    # Device memory on CUDA; the configured budget on CPU.
    memory_budget = models.BigIntegerField(null=True, blank=True)
    max_batch_size = models.PositiveIntegerField(default=1024)
    device = models.CharField(max_length=200, blank=True)
    runtime = models.JSONField(default=dict, blank=True)
    # One dict per measured step: phase, batch size, times, tokens, memory, fits.
    steps = models.JSONField(default=list, blank=True)
    chosen_batch_size = models.PositiveIntegerField(null=True, blank=True)
    chosen_peak_reserved = models.BigIntegerField(null=True, blank=True)
    # Allocated memory after each repeat of the chosen size, and the verdict.
    leak = models.JSONField(default=dict, blank=True)
    # Corpus-wide padding of each batching policy at the chosen size.
    policies = models.JSONField(default=list, blank=True)
    # The heaviest inputs it ran ({uid, cost}), and sample inputs that failed to read.
    heaviest_tried = models.JSONField(default=list, blank=True)
    sample_failures = models.JSONField(default=list, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Renewed by the measuring worker; silent too long, the sweeper fails the
    # profile (campaigns.profiles.services.profiles_fail_stale) instead of leaving it "running".
    heartbeat_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]


class Estimate(models.Model):
    """The whole corpus projected from one profile: hours, memory tier, a rental plan."""

    profile = models.OneToOneField(Profile, on_delete=models.CASCADE, related_name="estimate")
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="+")
    device = models.CharField(max_length=200)
    units = models.PositiveIntegerField()
    batch_size = models.PositiveIntegerField()
    # Hours on the measured device, from the corpus's own cost distribution,
    # and the naive figure (sample mean) it replaces, kept for comparison.
    hours_measured_device = models.FloatField()
    hours_naive = models.FloatField()
    peak_memory = models.BigIntegerField()
    memory_tier_gb = models.PositiveIntegerField()
    output_bytes = models.BigIntegerField()
    # Per catalog GPU: projected hours (labelled as projections).
    projections = models.JSONField(default=list)
    # The recommended rental.
    gpu_name = models.CharField(max_length=100, blank=True)
    quantity = models.PositiveIntegerField(null=True, blank=True)
    duration_days = models.PositiveIntegerField(null=True, blank=True)
    reasoning = models.JSONField(default=list)
    created_at = models.DateTimeField(auto_now_add=True)


class Checkpoint(models.Model):
    """The stop after the first group of units of a parameter version: a spot check."""

    class State(models.TextChoices):
        PENDING = "pending", "checkpoint pending"
        PASSED = "passed"
        FAILED = "failed"

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="checkpoints")
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="+")
    after_units = models.PositiveIntegerField()
    state = models.CharField(max_length=10, choices=State.choices, default=State.PENDING)
    # The spot-check set: unit ids stratified by category and input size.
    sample = models.JSONField(default=list)
    reason = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # The holdout report of this checkpoint's version as it stood when the
    # checkpoint opened, was decided and when the campaign ran out of work:
    # {"opened" | "decided" | "finished": report with "at"}. Kept, since the
    # live report follows whichever outputs exist now.
    holdout_snapshots = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One checkpoint per version: opening it twice (two workers) is one.
            models.UniqueConstraint(
                fields=["campaign", "version"], name="one_checkpoint_per_version"
            )
        ]


class ReviewItem(models.Model):
    """An output a human should look at: flagged by a rule, by hand, or a spot check."""

    class State(models.TextChoices):
        OPEN = "open"
        ACCEPTED = "accepted"
        REJECTED = "rejected"
        REQUEUED = "requeued"

    class Source(models.TextChoices):
        RULE = "rule"
        MANUAL = "manual"
        SPOT_CHECK = "spot_check", "spot check"

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="review_items")
    unit = models.ForeignKey(Unit, on_delete=models.CASCADE, related_name="review_items")
    version = models.ForeignKey(ParameterVersion, on_delete=models.RESTRICT, related_name="+")
    checkpoint = models.ForeignKey(
        Checkpoint, on_delete=models.CASCADE, null=True, blank=True, related_name="items"
    )
    # The try whose output this item judges. Only items about the unit's latest
    # attempt move the unit: a decision on an older output is recorded, no more.
    # Null on items made before it was recorded (then: made after the latest attempt).
    attempt = models.ForeignKey(
        Attempt, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    source = models.CharField(max_length=12, choices=Source.choices, default=Source.RULE)
    reason = models.CharField(max_length=50)
    detail = models.TextField(blank=True)
    state = models.CharField(max_length=10, choices=State.choices, default=State.OPEN)
    reviewer = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )
    note = models.TextField(blank=True)
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        indexes = [
            # The queue: open items of a campaign, by reason.
            models.Index(fields=["campaign", "state", "reason"], name="review_queue"),
        ]


class ReviewCount(models.Model):
    """How many review items of a campaign are open: the campaign page's figure.

    Written only by database triggers on campaigns_reviewitem (migration 0016),
    as UnitCount is: on PostgreSQL deltas appended per statement (SUM them;
    campaigns_reviewcount_compact() folds them), on SQLite one row a campaign.
    Counting 30,000 open items took PostgreSQL 4-6 ms a page view.
    """

    # As UnitCount's: Django deletes the items first (their trigger appends
    # deltas), then the campaign, whose trigger deletes these rows.
    campaign = models.ForeignKey(
        Campaign,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,
        related_name="+",
    )
    n = models.BigIntegerField()

    class Meta:
        indexes = [models.Index(fields=["campaign"], name="reviewcount_campaign")]


class ReviewDecision(models.Model):
    """Every decision, kept: a later one undoes an earlier one without erasing it."""

    item = models.ForeignKey(ReviewItem, on_delete=models.CASCADE, related_name="decisions")
    from_state = models.CharField(max_length=10, choices=ReviewItem.State.choices)
    to_state = models.CharField(max_length=10, choices=ReviewItem.State.choices)
    reviewer = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True)
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]


# Adaptation campaigns' trainings and checkpoints (their own module).
from campaigns.models.training import ModelCheckpoint, Training  # noqa: E402, F401
