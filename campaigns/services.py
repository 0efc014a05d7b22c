"""Everything that writes campaign data. Views, commands and tasks call these."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max
from django.utils.text import slugify

from portal.celery import app as celery_app

from .importing import ImportReport, import_folder, import_manifest
from .models import Batch, Campaign, ParameterVersion, Project, Unit, UnitState
from .processor_specs import get_spec
from .software import software_versions

RUN_BATCH_TASK = "gpuworker.tasks.run_batch"


def fingerprint(*, processor: str, params: dict[str, Any], software: dict[str, str]) -> str:
    canonical = json.dumps(
        {"processor": processor, "params": params, "software": software},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def version_create(*, campaign: Campaign, params: dict[str, Any] | None = None) -> ParameterVersion:
    """The version for these parameters and this software: the existing one if identical."""
    cleaned = get_spec(campaign.processor).clean(params)
    software = software_versions()
    fp = fingerprint(processor=campaign.processor, params=cleaned, software=software)
    with transaction.atomic():
        Campaign.objects.select_for_update().filter(pk=campaign.pk).first()
        version = ParameterVersion.objects.filter(campaign=campaign, fingerprint=fp).first()
        if version is None:
            last = campaign.versions.aggregate(n=Max("number"))["n"] or 0
            version = ParameterVersion.objects.create(
                campaign=campaign,
                number=last + 1,
                params=cleaned,
                software=software,
                fingerprint=fp,
            )
        if campaign.current_version_id != version.pk:
            campaign.current_version = version
            campaign.save(update_fields=["current_version"])
    return version


def campaign_create(
    *,
    name: str,
    processor: str,
    project: Project,
    input_folder: Path | None = None,
    manifest: Path | None = None,
    input_root: Path | None = None,
    params: dict[str, Any] | None = None,
) -> tuple[Campaign, ImportReport]:
    """Create a campaign, its first parameter version, and import its units."""
    if slugify(name) != name:
        raise ValidationError(
            f"campaign name {name!r} must be lowercase letters, digits and dashes "
            f"(for example {slugify(name) or 'my-campaign'!r})"
        )
    if Campaign.objects.filter(name=name).exists():
        raise ValidationError(f"a campaign named {name!r} exists already")
    if (input_folder is None) == (manifest is None):
        raise ValidationError("give either an input folder or a manifest")
    spec = get_spec(processor)
    spec.clean(params)  # refuse bad parameters before anything is written
    if manifest is not None:
        root = (input_root or manifest.parent).resolve()
    else:
        root = input_folder.resolve()
    campaign = Campaign.objects.create(
        project=project, name=name, processor=processor, input_root=str(root)
    )
    version_create(campaign=campaign, params=params)
    report = campaign_import(campaign=campaign, manifest=manifest)
    return campaign, report


def campaign_import(*, campaign: Campaign, manifest: Path | None = None) -> ImportReport:
    if manifest is not None:
        return import_manifest(campaign, manifest)
    return import_folder(campaign)


def campaign_run(*, campaign: Campaign) -> int:
    """Group the pending units into batches and enqueue one task per batch.

    Returns the number of batches enqueued. A task carries the batch id only
    and is sent after commit, so a worker never looks for a row that is not
    there yet.
    """
    version = campaign.current_version
    if version is None:
        raise ValidationError(f"campaign {campaign.name} has no parameter version")
    batch_size = version.params.get("batch_size", 16)
    created: list[int] = []
    with transaction.atomic():
        # Original order: by import order. Length-grouping comes with issue 4.
        pending = list(
            Unit.objects.filter(campaign=campaign, state=UnitState.PENDING)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        for start in range(0, len(pending), batch_size):
            ids = pending[start : start + batch_size]
            batch = Batch.objects.create(campaign=campaign, version=version, size=len(ids))
            claimed = Unit.objects.filter(pk__in=ids, state=UnitState.PENDING).update(
                state=UnitState.QUEUED, batch=batch
            )
            if claimed != len(ids):
                batch.size = claimed
                batch.save(update_fields=["size"])
            created.append(batch.pk)
        transaction.on_commit(lambda: _enqueue(created))
    return len(created)


def _enqueue(batch_ids: list[int]) -> None:
    for batch_id in batch_ids:
        # By name: the web process must not import gpuworker (and so torch).
        celery_app.send_task(RUN_BATCH_TASK, args=[batch_id])


def project_for_user(*, name: str, user=None) -> Project:
    project, _ = Project.objects.get_or_create(name=name)
    if user is not None:
        project.members.add(user)
    return project
