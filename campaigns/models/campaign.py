"""A campaign and what owns it: the Project it belongs to and the folders that
project may read (ProjectFolder), the Campaign (its processor and input
folder), and its ParameterVersions, each a frozen set of parameters and
software that outputs are made under."""

from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.db import models


class Project(models.Model):
    name = models.CharField(max_length=200, unique=True)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="projects", blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


def sees_every_project(user) -> bool:
    """Whether `user` may see every project's campaigns and use every project's
    folders: an active superuser, the operator. Anyone else, order staff
    included, sees the projects they are a member of. `is_staff` is the admin
    login the order staff need for payments and rates (portal/staff_group.py):
    it opens no customer's corpus."""
    return bool(getattr(user, "is_active", False) and getattr(user, "is_superuser", False))


class ProjectFolder(models.Model):
    """A folder a project's members may make campaigns over, with everything under
    it (campaigns/intake/project_folders.py keeps the rules)."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="folders")
    # The real path (symlinks resolved) when it was given: a check compares a
    # campaign folder's real path of the moment with this text, so a folder
    # swapped for a symlink afterwards leads outside it.
    path = models.CharField(max_length=1000)
    # None: recorded by the operator's `campaign create` or the migration that
    # introduced project folders, not by a person in the admin or `campaign folders add`.
    added_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.SET_NULL,
        null=True,
        blank=True,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["project", "path"], name="project_folder_unique"),
        ]
        ordering = ["project", "path"]

    def __str__(self) -> str:
        return f"{self.project.name}: {self.path}"


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
    # The reasons a reviewer picks from when rejecting an output (a list of
    # labels; None: campaigns.review.reasons.DEFAULT_REJECT_REASONS). Nullable
    # for the same reason.
    reject_reasons = models.JSONField(null=True, blank=True)
    # A campaign over records (rows of JSONL, CSV, Parquet or Arrow files as
    # units): {"source": the file or folder relative to input_root, "columns":
    # {"id", "text", "category"}}; None for files as units. Nullable for the
    # same reason.
    records = models.JSONField(null=True, blank=True)
    # When a run's planner last began a slice (campaigns/runs/start.py); None
    # when none plans. Pages keep polling while a recent one plans, though
    # nothing is queued: workers faster than the planner run dry between its
    # slices. Nullable for the same reason.
    planning_at = models.DateTimeField(null=True, blank=True)
    # When its outputs were last exported (`campaign export`, or a download of
    # its results, matrices or tables): the rental-ending alert asks whether
    # that came after the last batch. Nullable for the same reason.
    exported_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    #: A planning stamp older than this is a planner that died with it (a
    #: worker killed mid-slice): a slice is weighed and planned in well under
    #: a minute (bench/RESULTS.md, "10,000,000 rows, the first five minutes of
    #: the run").
    PLANNING_STALE = dt.timedelta(minutes=15)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.name

    @classmethod
    def planning_after(cls, now: dt.datetime) -> dt.datetime:
        """A planner that stamped planning_at after this is still at work at `now`."""
        return now - cls.PLANNING_STALE


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
