"""Adaptation campaigns: a training run per parameter version, and its checkpoints.

Imported by campaigns/models/__init__.py. Training follows its own life cycle,
not the unit-by-unit one of batches.
"""

from __future__ import annotations

from django.db import models


class Training(models.Model):
    """Fine-tuning of one parameter version of an adaptation campaign."""

    class State(models.TextChoices):
        QUEUED = "queued", "Queued"
        RUNNING = "running", "Running"
        STOPPING = "stopping", "Stopping after the next step"
        STOPPED = "stopped", "Stopped (resume continues from the last checkpoint)"
        DONE = "done", "Done"
        FAILED = "failed", "Failed"

    campaign = models.ForeignKey(
        "campaigns.Campaign", on_delete=models.CASCADE, related_name="trainings"
    )
    version = models.OneToOneField(
        "campaigns.ParameterVersion", on_delete=models.RESTRICT, related_name="training"
    )
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    step = models.PositiveIntegerField(default=0)
    total_steps = models.PositiveIntegerField(default=0)
    examples = models.PositiveIntegerField(default=0)
    heldout = models.PositiveIntegerField(default=0)
    # sha256 over the (id, input sha256) of every training and held-out example:
    # the exact data every checkpoint of this run was trained on.
    data_sha256 = models.CharField(max_length=64, blank=True)
    base_model = models.CharField(max_length=500, blank=True)
    base_weights_sha256 = models.CharField(max_length=64, blank=True)
    # The base model's held-out metrics, before the first step: what a
    # checkpoint is compared against.
    base_metrics = models.JSONField(default=dict, blank=True)
    worker = models.CharField(max_length=200, blank=True)
    # A running training renews this every step; the sweeper requeues one whose
    # worker stopped renewing it (it resumes from its last checkpoint).
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    runs = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-pk"]

    def __str__(self) -> str:
        return f"training of {self.campaign} v{self.version.number}"


class ModelCheckpoint(models.Model):
    """One checkpoint on disk, with the linkage its sidecar holds."""

    class State(models.TextChoices):
        KEPT = "kept", "Kept"
        PRUNED = "pruned", "Removed by the keep policy"
        DAMAGED = "damaged", "Damaged (verify found it; never loaded)"

    training = models.ForeignKey(Training, on_delete=models.CASCADE, related_name="checkpoints")
    step = models.PositiveIntegerField()
    # Relative to OUTPUT_ROOT, like every output.
    path = models.CharField(max_length=1000)
    weights_sha256 = models.CharField(max_length=64)
    train_loss = models.FloatField()
    heldout_loss = models.FloatField(null=True, blank=True)
    heldout_accuracy = models.FloatField(null=True, blank=True)
    # The sidecar as written: base model and checksum, version, data checksum,
    # metrics; and under "timings" the worker's seconds for this checkpoint's
    # held-out evaluation (and of how many examples) and for its write.
    linkage = models.JSONField(default=dict)
    state = models.CharField(max_length=10, choices=State.choices, default=State.KEPT)
    problem = models.TextField(blank=True)
    seconds = models.FloatField(default=0.0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["training", "step"]
        constraints = [
            models.UniqueConstraint(fields=["training", "step"], name="checkpoint_step_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.training.campaign} step {self.step}"
