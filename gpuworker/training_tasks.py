"""The training task: examples from the campaign's units, checkpoints as rows.

Claims the training by update (a second delivery finds it running and leaves),
reads and checks every example (a bad one fails its unit, classified, and the
rest trains), records the base model's held-out metrics before the first step,
then runs the loop (gpuworker/training.py), writing a ModelCheckpoint row per
checkpoint and beating the heartbeat each step. Resumes from the last whole
checkpoint on disk; a stop request ends it after the step in progress.
"""

from __future__ import annotations

import hashlib
import logging
import traceback
from pathlib import Path

import torch
from celery import shared_task
from django.conf import settings
from django.db.models import F
from django.utils import timezone

from campaigns.adaptation import services as adaptation
from campaigns.intake.images import decode_image
from campaigns.intake.inputs import InputError, corpus_real_path, read_bytes
from campaigns.models import ErrorClass, ModelCheckpoint, Training, Unit, UnitState
from campaigns.specs.adaptation import parse_pair
from campaigns.specs.builtin import resolve_model_path
from campaigns.specs.processors import get_spec
from campaigns.specs.software import software_versions
from campaigns.storage import checkpoint_files as checkpoints
from common.log_context import bound
from gpuworker.heartbeat import Heartbeat
from gpuworker.runner.claim import worker_name
from gpuworker.training import (
    ClassifierTrainer,
    ContrastiveTrainer,
    Pair,
    Progress,
    TrainParams,
    total_steps,
)

log = logging.getLogger(__name__)


def _fail_unit(unit: Unit, error: InputError) -> None:
    Unit.objects.filter(pk=unit.pk).update(
        state=UnitState.FAILED,
        error_class=error.error_class,
        error_message=error.message,
        updated_at=timezone.now(),
    )


def read_examples(
    campaign, parse, units=None, *, params: dict | None = None, fail=True
) -> tuple[list, list, list[tuple[str, str, bool]]]:
    """(training examples, held-out examples, checksum rows); a bad input fails its
    unit (or, with fail=False, is left out), and the rest goes on.

    Each example is read as every input is, under the processor's limits for
    `params` (default: the campaign's current version): a file over
    max_input_bytes fails from its size, before any of it is read."""
    root = Path(campaign.input_root)
    if params is None:
        params = campaign.current_version.params
    limits = get_spec(campaign.processor).input_limits(params)
    real_root = corpus_real_path(root)
    train: list = []
    heldout: list = []
    rows: list[tuple[str, str, bool]] = []
    for unit in adaptation.examples_rows(campaign) if units is None else units:
        try:
            data = read_bytes(root, unit.source_path, real_root, limits)
            digest = hashlib.sha256(data).hexdigest()
            if unit.sha256 and digest != unit.sha256:
                raise InputError(
                    ErrorClass.INPUT_CHANGED,
                    "input changed since import (sha256 differs); import again to train on it",
                )
            example = parse(unit, data)
        except InputError as exc:
            if fail:
                _fail_unit(unit, exc)
            continue
        (heldout if unit.holdout else train).append(example)
        rows.append((unit.uid, digest, unit.holdout))
    return train, heldout, rows


def text_trainer(params: dict):
    base = resolve_model_path(params["base_model"])
    trainer = ContrastiveTrainer(TrainParams.from_params(params), base)

    def parse(_unit, data: bytes) -> Pair:
        record = parse_pair(data)
        return Pair(record["anchor"], record["positive"], record["negative"])

    return trainer, parse, base


def image_trainer(params: dict):
    from gpuworker.processors.image_classification import ImageClassificationProcessor

    # The classifier's own preprocessing and model loading: what its new version will use.
    processor = ImageClassificationProcessor(
        {"dtype": "float32", "max_pixels": 100_000_000, "max_aspect": 1000, **params}
    )
    labels = {name: i for i, name in enumerate(processor.labels)}
    # The network itself, not its features wrapper: the checkpoint's keys are
    # then those the classification version loads its weights into.
    model = getattr(processor.model, "network", processor.model)
    trainer = ClassifierTrainer(
        TrainParams.from_params(params),
        model,
        lambda image: torch.from_numpy(processor._preprocess(image)),
        train=params["train"],
    )

    def parse(unit: Unit, data: bytes):
        # The manifest's category column, or else the folder the image is in.
        category = unit.category or unit.source_path.split("/", 1)[0]
        if category not in labels:
            raise InputError(
                ErrorClass.INPUT_INVALID,
                f"category {category!r} is not in the labels file ({', '.join(list(labels)[:8])})",
            )
        image = decode_image(data, max_pixels=100_000_000, max_aspect=1000)
        return image.convert("RGB"), labels[category]

    return trainer, parse, Path(params["model"])


TRAINERS = {"text-adaptation": text_trainer, "image-adaptation": image_trainer}


class TrainingLost(Exception):
    """Another worker holds this training now; this one must not write."""


def _weights_checksum(base: Path) -> str:
    if base.is_dir():
        return checkpoints.weights_checksum(base)
    return checkpoints.sha256_file(base)


def run_training(training_id: int) -> str:
    now, worker = timezone.now(), worker_name()
    # Claim by update: a second delivery finds it running and leaves.
    claimed = Training.objects.filter(pk=training_id, state=Training.State.QUEUED).update(
        state=Training.State.RUNNING,
        worker=worker,
        heartbeat_at=now,
        started_at=now,
        runs=F("runs") + 1,
    )
    if not claimed:
        return "not runnable"
    training = Training.objects.select_related("campaign", "version").get(pk=training_id)
    held = Training.objects.filter(
        pk=training_id,
        worker=worker,
        state__in=(Training.State.RUNNING, Training.State.STOPPING),
    )
    heartbeat = Heartbeat(held, settings.TRAINING_HEARTBEAT_SECONDS, f"training {training_id}")
    with bound(campaign=training.campaign_id), heartbeat:
        try:
            return _train(training, heartbeat)
        except TrainingLost:
            log.warning("training %s: taken over by another worker; stopped here", training_id)
            return "lost"
        except Exception as exc:
            log.exception("training %s failed", training_id)
            Training.objects.filter(pk=training_id).update(
                state=Training.State.FAILED,
                error="".join(traceback.format_exception_only(exc)).strip()[:2000],
                finished_at=timezone.now(),
            )
            return "failed"


def _train(training: Training, heartbeat: Heartbeat) -> str:
    campaign, version = training.campaign, training.version
    trainer, parse, base = TRAINERS[campaign.processor](version.params)
    train, heldout, rows = read_examples(campaign, parse, params=version.params)
    data_sha256 = adaptation.data_checksum(rows)
    if training.data_sha256 and training.data_sha256 != data_sha256:
        raise RuntimeError(
            "the examples changed since this training started (data checksum differs); "
            "its checkpoints would mix two datasets — make a new version to train on the new data"
        )
    params = trainer.params
    base_sha256 = training.base_weights_sha256 or _weights_checksum(base)
    if hasattr(trainer, "remember_base"):
        trainer.remember_base(heldout)  # still the base model: run() loads a checkpoint later
    base_metrics = training.base_metrics or (trainer.evaluate(heldout) if heldout else {})
    Training.objects.filter(pk=training.pk).update(
        examples=len(train),
        heldout=len(heldout),
        data_sha256=data_sha256,
        base_model=str(version.params.get("base_model") or version.params.get("model")),
        base_weights_sha256=base_sha256,
        base_metrics=base_metrics,
    )
    linkage = {
        # The training that wrote a checkpoint: one with no row is resumed
        # from only by this training (adaptation.checkpoint_contradictions).
        "training": training.pk,
        "campaign": campaign.name,
        "version": version.number,
        "version_fingerprint": version.fingerprint,
        "processor": campaign.processor,
        "params": version.params,
        "base_model": str(version.params.get("base_model") or version.params.get("model")),
        "base_weights_sha256": base_sha256,
        "data_sha256": data_sha256,
        "examples": len(train),
        "heldout": len(heldout),
        "software": software_versions(),
    }
    root = adaptation.checkpoint_root(training)
    relroot = adaptation.checkpoint_relroot(training)

    def on_checkpoint(progress: Progress) -> None:
        folder = progress.folder
        assert folder is not None  # Trainer.run calls back once it is written
        sidecar = checkpoints.read_sidecar(folder)
        ModelCheckpoint.objects.update_or_create(
            training=training,
            step=progress.step,
            defaults={
                "path": f"{relroot}/{folder.name}",
                "weights_sha256": sidecar["weights_sha256"],
                "train_loss": progress.train_loss,
                "heldout_loss": progress.heldout.get("heldout_loss"),
                "heldout_accuracy": progress.heldout.get("heldout_accuracy"),
                "linkage": {
                    **{k: v for k, v in sidecar.items() if k != "files"},
                    # Its bytes as written: a changed digit anywhere in it (a
                    # step, a checksum) contradicts the record at verify and resume.
                    "sidecar_sha256": checkpoints.sha256_file(folder / checkpoints.SIDECAR),
                    # What the next training estimate of this campaign measures
                    # from (campaigns/adaptation/estimate.py).
                    "timings": {
                        "heldout_eval_s": round(progress.eval_s, 4),
                        "heldout": len(heldout),
                        "write_s": round(progress.write_s, 4),
                    },
                },
                "state": ModelCheckpoint.State.KEPT,
                "problem": "",  # a damaged one of this step, written again
                "seconds": progress.seconds,
            },
        )
        kept = {p.name for p in checkpoints.listing(root)}
        for row in ModelCheckpoint.objects.filter(
            training=training, state=ModelCheckpoint.State.KEPT
        ):
            if Path(row.path).name not in kept:
                ModelCheckpoint.objects.filter(pk=row.pk).update(state=ModelCheckpoint.State.PRUNED)

    def stop(step: int) -> bool:
        heartbeat.beat()
        if heartbeat.lost:
            raise TrainingLost()
        Training.objects.filter(pk=training.pk).update(step=step)
        return Training.objects.filter(pk=training.pk, state=Training.State.STOPPING).exists()

    Training.objects.filter(pk=training.pk).update(total_steps=total_steps(len(train), params))

    def accept(folder: Path, sidecar: dict) -> list[str]:
        return adaptation.checkpoint_contradictions(
            training=training, linkage=linkage, folder=folder, sidecar=sidecar
        )

    outcome = trainer.run(
        train,
        heldout,
        root=root,
        linkage=linkage,
        stop=stop,
        on_checkpoint=on_checkpoint,
        accept=accept,
    )
    final = Training.State.STOPPED if outcome.stopped else Training.State.DONE
    Training.objects.filter(pk=training.pk).update(
        state=final,
        step=outcome.steps,
        total_steps=outcome.total_steps,
        finished_at=timezone.now(),
    )
    if final == Training.State.DONE:
        # The examples it learnt from and was measured on are done.
        Unit.objects.filter(campaign=campaign).exclude(state=UnitState.FAILED).update(
            state=UnitState.SUCCEEDED, updated_at=timezone.now()
        )
    log.info(
        "training %s %s at step %d of %d", training.pk, final, outcome.steps, outcome.total_steps
    )
    return final


@shared_task(name="gpuworker.training_tasks.run_training", acks_late=False)
def run_training_task(training_id: int) -> str:
    # Acknowledged on receipt: a day-long training must never be redelivered
    # by the broker while it runs; the heartbeat sweeper resends a dead one.
    return run_training(training_id)
