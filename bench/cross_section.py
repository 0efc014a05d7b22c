"""The checkpoint's cross-section at scale: the first group picked by the database.

    .venv/bin/python bench/cross_section.py --units 200000
    DATABASE_URL=postgres://… .venv/bin/python bench/cross_section.py --units 1000000

Imports --units trusted manifest rows (no files are read) in 40 categories,
laid out one after the other in import order, sizes 100 to 5,099 bytes, one
row in a hundred a copy of another's sha256. Then times, each alone: the
identical-inputs count an import ends with (importing._note_identical), the
first group's pick (campaigns.review.cross_section.first_group, the default
allowance of max(1 %, 200)), and campaign_run up to the checkpoint (pick,
plan, claim; broker sends mocked). Prints the categories the first group
covers and the peak RSS. The campaign is deleted afterwards.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CATEGORIES = 40


def write_manifest(path: Path, rows: int) -> None:
    per_category = -(-rows // CATEGORIES)
    with path.open("w", encoding="utf-8") as fh:
        fh.write("id,path,category,size,sha256\n")
        for i in range(rows):
            uid = f"doc-{i:07d}"
            # One in a hundred is a copy of the row before it.
            source = i - 1 if i % 100 == 99 else i
            sha = hashlib.sha256(f"doc-{source:07d}".encode()).hexdigest()
            category = f"cat-{i // per_category:02d}"
            fh.write(f"{uid},{category}/{uid}.txt,{category},{100 + source % 5000},{sha}\n")


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=200_000)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-cross-"))
    os.environ.update(
        {
            "VAR_DIR": str(work / "var"),
            "OUTPUT_ROOT": str(work / "outputs"),
            "DJANGO_SETTINGS_MODULE": "portal.settings",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from campaigns.intake import importing
    from campaigns.models import Batch, Campaign, Unit, UnitState
    from campaigns.review import cross_section
    from campaigns.review.queue import checkpoint_size, run_allowance, units_runnable
    from campaigns.runs import setup, start

    call_command("migrate", verbosity=0)
    manifest = work / "manifest.csv"
    write_manifest(manifest, args.units)
    (work / "empty.csv").write_text("id,path\n")
    campaign, _ = setup.campaign_create(
        name=f"bench-cross-{os.getpid()}",
        processor="text-embedding",
        project=setup.project_for_user(name="bench"),
        manifest=work / "empty.csv",
        input_root=work / "corpus",
    )
    print(f"{connection.vendor}, {args.units:,} units in {CATEGORIES} categories")
    try:
        started = time.perf_counter()
        report = importing.import_manifest(campaign, manifest)
        print(f"import: {time.perf_counter() - started:.1f} s, {report.created:,} units")
        print(f"  identical: {report.identical_groups:,} groups, {report.identical_units:,} units")
        campaign.refresh_from_db()
        version = campaign.current_version

        started = time.perf_counter()
        importing._note_identical(campaign, importing.ImportReport())
        print(f"identical-inputs count alone: {time.perf_counter() - started:.2f} s")

        allowance = run_allowance(campaign=campaign, version=version)
        pending = units_runnable(campaign=campaign, version=version)
        before = _peak_mib()
        started = time.perf_counter()
        chosen = cross_section.first_group(
            pending=pending, allowance=allowance, campaign=campaign, version=version
        )
        seconds = time.perf_counter() - started
        covered = set(
            Unit.objects.filter(pk__in=chosen[:30_000]).values_list("category", flat=True)
        )
        print(
            f"first_group: {len(chosen):,} of {checkpoint_size(campaign):,} in {seconds:.2f} s, "
            f"{len(covered)} categories, peak RSS {_peak_mib():.0f} MiB (before {before:.0f})"
        )

        with mock.patch.object(start.celery_app, "send_task"):
            started = time.perf_counter()
            batches = start.campaign_run(campaign=campaign)
            seconds = time.perf_counter() - started
        queued = Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).count()
        print(
            f"campaign_run to the checkpoint: {batches:,} batches, {queued:,} units, "
            f"{seconds:.2f} s"
        )
    finally:
        Unit.objects.filter(campaign=campaign)._raw_delete(connection.alias)
        Batch.objects.filter(campaign=campaign)._raw_delete(connection.alias)
        Campaign.objects.filter(pk=campaign.pk).delete()


if __name__ == "__main__":
    main()
