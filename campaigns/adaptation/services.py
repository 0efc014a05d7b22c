"""Adaptation campaigns: start, stop and resume a training; use a checkpoint.

No torch here: the web process and the CLI call these, the worker trains
(gpuworker/training_tasks.py). A training is one long task acknowledged on
receipt — a broker must never redeliver a healthy day-long run — so a worker
that dies is noticed by its heartbeat instead: the sweeper sends the training
again, and it resumes from its last whole checkpoint.
"""

from __future__ import annotations

import hashlib
import logging
from datetime import timedelta
from pathlib import Path

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from campaigns.intake.project_folders import campaign_folder_check
from campaigns.models import Campaign, ModelCheckpoint, ParameterVersion, Training, Unit, UnitState
from campaigns.runs.start import work_send
from campaigns.specs.processors import get_spec
from campaigns.verify.reconcile import CHECKPOINTS_FOLDER

log = logging.getLogger(__name__)

TASK = "gpuworker.training_tasks.run_training"
LIVE = (Training.State.QUEUED, Training.State.RUNNING, Training.State.STOPPING)


def is_adaptation(campaign: Campaign) -> bool:
    return get_spec(campaign.processor).training


def checkpoint_root(training: Training) -> Path:
    """Where a training's checkpoints live, under the output root like every output."""
    return Path(settings.OUTPUT_ROOT) / checkpoint_relroot(training)


def checkpoint_relroot(training: Training) -> str:
    return f"{training.campaign.name}/{CHECKPOINTS_FOLDER}/v{training.version.number}"


def data_checksum(rows: list[tuple[str, str, bool]]) -> str:
    """sha256 over (id, input sha256, held out) of every example, in id order."""
    digest = hashlib.sha256()
    for uid, sha256, heldout in sorted(rows):
        digest.update(f"{uid}\t{sha256}\t{'heldout' if heldout else 'train'}\n".encode())
    return digest.hexdigest()


def _send(training: Training) -> None:
    # Routed to the gpu queue (CELERY_TASK_ROUTES). A broker that does not
    # answer leaves the training queued for the lost-message sweep.
    work_send(task=TASK, args=[training.pk], what="the training")


def training_start(*, campaign: Campaign) -> Training:
    """Train the current version; a stopped or failed one resumes where it was."""
    if not is_adaptation(campaign):
        raise ValidationError(f"campaign {campaign.name} is not an adaptation campaign")
    version = campaign.current_version
    if version is None:
        raise ValidationError(f"campaign {campaign.name} has no parameter version")
    # The training reads the campaign's folder, as a run does.
    campaign_folder_check(campaign)
    with transaction.atomic():
        training, created = Training.objects.select_for_update().get_or_create(
            version=version, defaults={"campaign": campaign}
        )
        if not created and training.state in LIVE:
            return training  # already on its way: a second press changes nothing
        if training.state == Training.State.DONE:
            raise ValidationError(
                f"version {version.number} is trained; change a parameter to train a new one"
            )
        training.state = Training.State.QUEUED
        training.error = ""
        training.save(update_fields=["state", "error"])
        transaction.on_commit(lambda: _send(training))
    return training


def training_stop(*, training: Training) -> Training:
    """Ask the worker to stop after the step it is on (with a checkpoint of it)."""
    Training.objects.filter(pk=training.pk, state=Training.State.RUNNING).update(
        state=Training.State.STOPPING
    )
    # Not started yet: nothing to wait for.
    Training.objects.filter(pk=training.pk, state=Training.State.QUEUED).update(
        state=Training.State.STOPPED
    )
    training.refresh_from_db()
    return training


def trainings_requeue_stale(*, now=None) -> list[int]:
    """Send again the trainings whose worker stopped beating (killed, machine lost)."""
    now = now or timezone.now()
    stale = now - timedelta(seconds=settings.TRAINING_HEARTBEAT_SECONDS * 3)
    resent = []
    for training in Training.objects.filter(
        state__in=(Training.State.RUNNING, Training.State.STOPPING), heartbeat_at__lt=stale
    ):
        moved = Training.objects.filter(
            pk=training.pk, state=training.state, heartbeat_at=training.heartbeat_at
        ).update(state=Training.State.QUEUED)
        if moved:
            log.warning(
                "training %s: worker silent since %s; sent again",
                training.pk,
                training.heartbeat_at,
            )
            transaction.on_commit(lambda t=training: _send(t))
            resent.append(training.pk)
    return resent


# --- resuming from a checkpoint --------------------------------------------------------

#: The linkage a checkpoint with no row must share with the training resuming:
#: written under this very training, from the same data, version and base.
_SAME_TRAINING = ("training", "data_sha256", "version_fingerprint", "base_weights_sha256")


def checkpoint_contradictions(
    *, training: Training, linkage: dict, folder: Path, sidecar: dict
) -> list[str]:
    """Why a whole checkpoint under the training's folder must not be resumed
    from; empty when nothing contradicts it.

    With a row for its step, the row decides: it must be kept (not damaged,
    not pruned) and its sidecar and weights as recorded. With none (the worker
    died between writing and recording it), its sidecar must name this
    training and what it trains on now (`linkage`, the running training's):
    a checkpoint left by another training — a campaign of the same name made
    again — or from other data is never taken for this one's.
    """
    from campaigns.storage.checkpoint_files import against_record

    step = sidecar.get("step")
    if not isinstance(step, int):
        return [f"{folder.name}: its sidecar names no step"]
    row = ModelCheckpoint.objects.filter(training=training, step=step).first()
    if row is not None:
        if row.state != ModelCheckpoint.State.KEPT:
            found = [f"{folder.name}: recorded as {row.get_state_display().lower()}"]
        else:
            found = against_record(
                folder,
                weights_sha256=row.weights_sha256,
                sidecar_sha256=row.linkage.get("sidecar_sha256", ""),
            )
    else:
        found = [
            f"{folder.name}: not recorded, and its {key} is not this training's"
            for key in _SAME_TRAINING
            if sidecar.get(key) != linkage.get(key)
        ][:1]
    if found:
        log.warning("training %s: not resuming from %s", training.pk, "; ".join(found))
    return found


# --- checkpoints as models of inference campaigns ------------------------------------


def checkpoint_folder(checkpoint: ModelCheckpoint) -> Path:
    return Path(settings.OUTPUT_ROOT) / checkpoint.path


def checkpoint_use(*, checkpoint: ModelCheckpoint, target: Campaign) -> ParameterVersion:
    """A new version of an inference campaign whose model is this checkpoint."""
    from campaigns.runs import setup

    if checkpoint.state != ModelCheckpoint.State.KEPT:
        raise ValidationError(f"checkpoint at step {checkpoint.step} is {checkpoint.state}")
    source = checkpoint.training.campaign
    folder = str(checkpoint_folder(checkpoint))
    params = dict(target.current_version.params if target.current_version else {})
    if source.processor == "text-adaptation" and target.processor == "text-embedding":
        params["model"] = folder
    elif source.processor == "image-adaptation" and target.processor == "image-classification":
        trained = checkpoint.training.version.params
        params.update({k: trained[k] for k in ("model", "labels", "resize", "crop", "mean", "std")})
        # A training from before architectures has none: its model is a file.
        params["architecture"] = trained.get("architecture", "")
        params["weights"] = folder
    else:
        raise ValidationError(
            f"a {source.processor} checkpoint cannot be the model of a {target.processor} campaign"
        )
    return setup.version_create(campaign=target, params=params)


def checkpoint_for_model(path: str) -> ModelCheckpoint | None:
    """The checkpoint a version's model (or weights) folder is, for its lineage."""
    root = Path(settings.OUTPUT_ROOT)
    try:
        relative = Path(path).resolve().relative_to(root.resolve())
    except (ValueError, OSError):
        return None
    return (
        ModelCheckpoint.objects.select_related("training__version", "training__campaign")
        .filter(path=str(relative))
        .first()
    )


def lineage(version: ParameterVersion) -> dict | None:
    """What a version's outputs came from when its model is a checkpoint."""
    path = version.params.get("weights") or version.params.get("model") or ""
    checkpoint = checkpoint_for_model(path) if path else None
    if checkpoint is None:
        return None
    link = checkpoint.linkage
    return {
        "checkpoint": checkpoint,
        "campaign": checkpoint.training.campaign.name,
        "step": checkpoint.step,
        "base_model": link.get("base_model"),
        "base_weights_sha256": link.get("base_weights_sha256"),
        "weights_sha256": checkpoint.weights_sha256,
        "data_sha256": link.get("data_sha256"),
        "training_params": link.get("params"),
        "training_version": link.get("version"),
        "metrics": link.get("metrics"),
        "base_metrics": checkpoint.training.base_metrics,
    }


def examples_rows(campaign: Campaign) -> list[Unit]:
    """The units a training reads: every one not failed, training and held out."""
    return list(
        Unit.objects.filter(campaign=campaign)
        .exclude(state=UnitState.FAILED)
        .order_by("pk")
        .only("pk", "uid", "source_path", "sha256", "holdout", "category")
    )
