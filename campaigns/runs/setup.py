"""Writing a campaign's set-up: its project, the campaign itself, its parameter
versions, and the import of its units. Views, commands and tasks call these."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.db import connection, transaction
from django.db.models import Max
from django.utils.text import slugify

from campaigns.intake import project_folders
from campaigns.intake.importing import (
    ImportReport,
    ManifestError,
    import_folder,
    import_manifest,
    import_records,
)
from campaigns.intake.records import RecordColumns
from campaigns.models import (
    Campaign,
    ParameterVersion,
    Project,
    Unit,
)
from campaigns.runs import versions
from campaigns.specs import model_files
from campaigns.specs.processors import ProcessorSpec, get_spec
from campaigns.specs.software import processor_software, software_versions

# Names the campaign pages' URLs use for themselves.
RESERVED_NAMES = {"new"}


def fingerprint(*, processor: str, params: dict[str, Any], software: dict[str, str]) -> str:
    canonical = json.dumps(
        {"processor": processor, "params": params, "software": software},
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def version_create(*, campaign: Campaign, params: dict[str, Any] | None = None) -> ParameterVersion:
    """The version for these parameters and this software: the existing one if identical.

    Its params are the spec's cleaned ones: every parameter the processor
    declares is there, given or filled with the spec's default.
    """
    spec = get_spec(campaign.processor)
    cleaned = spec.clean(params)
    software = {**software_versions(), **processor_software(spec.implementation)}
    files = model_files.digests(spec.model_params, cleaned)
    if files:
        # Part of the fingerprint: the same path holding another model is another version.
        software["files"] = files
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
            versions.switch_to(campaign=campaign, version=version)
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
    checkpoint_after: int | None = None,
    holdout_share: float = 0.05,
    folder_categories: bool = True,
    user=None,
    records: Path | None = None,
    columns: RecordColumns | None = None,
) -> tuple[Campaign, ImportReport]:
    """Create a campaign, its first parameter version, and import its units.

    checkpoint_after: units before the checkpoint (None: max(1%, 200); 0: none).
    folder_categories: a unit without a category takes its top folder's name.
    records: a record file or a folder of them (campaigns/intake/records.py),
    each row a unit, its columns named by `columns`.
    user: the person creating it on the setup page, whose project's folders
    must hold its folder (FolderRefused otherwise). None: the operator (the
    `campaign` command, `demo`), whose folder becomes a folder of the project
    if none of the project's covers it (campaigns/intake/project_folders.py).
    """
    if slugify(name) != name:
        raise ValidationError(
            f"campaign name {name!r} must be lowercase letters, digits and dashes "
            f"(for example {slugify(name) or 'my-campaign'!r})"
        )
    if name in RESERVED_NAMES:
        raise ValidationError(f"{name!r} is a reserved word; choose another name")
    if Campaign.objects.filter(name=name).exists():
        raise ValidationError(
            f"a campaign named {name!r} exists already: choose another name, or add "
            f"units to it with `campaign import {name}`"
        )
    if sum(given is not None for given in (input_folder, manifest, records)) != 1:
        raise ValidationError("give one of an input folder, a manifest or records")
    if records is not None and (columns is None or not columns.text):
        raise ValidationError("records need a text column (--text-column)")
    if not 0 <= holdout_share < 1:
        raise ValidationError("holdout share is a fraction between 0 and 1 (0.05 = 5%)")
    spec = get_spec(processor)
    if records is not None and not spec.takes_text:
        raise ValidationError(
            f"a record's input is its text, and {processor} ({spec.title}) does not take "
            "text: give it a folder of files"
        )
    if columns is not None and columns.params:
        refuse_row_params(spec, columns)
    # Bad parameters, and a model file that is not there, refused before anything is written.
    model_files.digests(spec.model_params, spec.clean(params))
    root = campaign_root(
        input_folder=input_folder, manifest=manifest, input_root=input_root, records=records
    )
    if manifest is None and not root.is_dir():
        raise ManifestError(f"input folder not found: {root}")
    recorded = None
    if user is not None:
        root = project_folders.folder_for_user(user=user, project=project, path=root)
    else:
        recorded = project_folders.folder_record(project=project, path=root)
    campaign = Campaign.objects.create(
        project=project,
        name=name,
        processor=processor,
        input_root=str(root),
        checkpoint_after=checkpoint_after,
        holdout_share=holdout_share,
        records=None
        if records is None or columns is None
        else {
            "source": "." if records.resolve() == root else records.resolve().name,
            "columns": columns.as_dict(),
        },
    )
    try:
        version_create(campaign=campaign, params=params)
        report = campaign_import(
            campaign=campaign, manifest=manifest, folder_categories=folder_categories
        )
    except BaseException as exc:
        # A create is all or nothing: a manifest refused halfway (not UTF-8
        # on line 900,000), an interrupt or a crash leaves no campaign whose
        # name would refuse the corrected command, and no folder it gave the project.
        try:
            _discard(campaign)
            if recorded is not None:
                recorded.delete()
        except Exception as cleanup:
            left = (
                f"campaign {name!r} was created before this error and could not be removed "
                f"({cleanup}); add its units with `campaign import {name}`"
            )
            if not isinstance(exc, Exception):
                exc.add_note(left)
                raise
            messages = getattr(exc, "messages", [str(exc)])
            raise ManifestError("; ".join([*messages, left])) from exc
        raise
    return campaign, report


def refuse_row_params(spec: ProcessorSpec, columns: RecordColumns) -> None:
    """ValidationError unless the processor takes each parameter a row's
    column is given for (ProcessorSpec.row_params)."""
    if not spec.row_params:
        raise ValidationError(
            f"{spec.name} takes no parameters from a row's columns (--param-column); "
            "its parameters are the version's"
        )
    unknown = [name for name, _ in columns.params if name not in spec.row_params]
    if unknown:
        raise ValidationError(
            f"{spec.name} takes no row parameter {', '.join(map(repr, unknown))}; "
            f"a row may set {', '.join(spec.row_params)}"
        )


def campaign_root(
    *,
    input_folder: Path | None,
    manifest: Path | None,
    input_root: Path | None,
    records: Path | None = None,
) -> Path:
    """The folder a new campaign reads (resolved): the input folder, the
    folder a manifest's paths are relative to (`input_root`, else the
    manifest's), or the records folder (a record file's own folder)."""
    if records is not None:
        resolved = records.resolve()
        if not resolved.exists():
            raise ManifestError(f"records not found: {records}")
        return resolved if resolved.is_dir() else resolved.parent
    if manifest is not None:
        return (input_root or manifest.parent).resolve()
    if input_folder is None:
        raise ValidationError("give either an input folder or a manifest")
    return input_folder.resolve()


def _discard(campaign: Campaign) -> None:
    """A campaign whose create failed, with its units and version: nothing ran on it yet."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            # One statement, not the ORM's cascade, which would load every unit it deletes.
            cursor.execute(
                f"DELETE FROM {Unit._meta.db_table} WHERE campaign_id = %s", [campaign.pk]
            )
        Campaign.objects.filter(pk=campaign.pk).delete()


def campaign_import(
    *, campaign: Campaign, manifest: Path | None = None, folder_categories: bool = True
) -> ImportReport:
    # Again at every import, not only at creation: the folder may have been
    # swapped for a symlink, or taken from the project, since.
    project_folders.campaign_folder_check(campaign)
    if campaign.records:
        if manifest is not None:
            raise ValidationError("a record campaign imports its records again, not a manifest")
        return import_records(campaign)
    if manifest is not None:
        return import_manifest(campaign, manifest, folder_categories=folder_categories)
    return import_folder(campaign, folder_categories=folder_categories)


def project_for_user(*, name: str, user=None) -> Project:
    project, _ = Project.objects.get_or_create(name=name)
    if user is not None:
        project.members.add(user)
    return project
