"""A campaign's parameter versions at scale: what the versions section, the
per-version download, the comparison and export cost over N units.

    .venv/bin/python bench/versions_scale.py --units 100000 [--dimension 384]
    DATABASE_URL=postgres://postgres@127.0.0.1:5432/bench_versions \\
        .venv/bin/python bench/versions_scale.py --units 100000

Imports N trusted manifest rows (bench/import_scale.py's), then makes two
versions' outputs without a model: v1's in shards of 64 rows with a batch
and an attempt per unit, then a switch to v2 (every unit pending again) and
v2's outputs the same way, recorded on the unit rows as a worker does. Then
times, with the process's RSS after each: the versions table
(runs/versions.version_progress), the download of v1's matrix (read from its
attempts) and v2's (from the unit rows), the same as Parquet tables, the
comparison of the two, and `campaign export`'s matrices (with their CSV and
Parquet rows).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

SHARD_ROWS = 64


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _make_outputs(campaign, version, dimension: int, *, current: bool, seed: int) -> None:
    """Shards, batches and attempts for every unit, as a worker records them."""
    import numpy as np
    from django.conf import settings
    from django.db import transaction
    from django.utils import timezone

    from campaigns.db.row_updates import update_rows
    from campaigns.models import Attempt, Batch, Unit, UnitState
    from campaigns.storage.vector_shards import member_path, shard_bytes

    rng = np.random.default_rng(seed)
    root = Path(settings.OUTPUT_ROOT)
    ids = list(Unit.objects.filter(campaign=campaign).order_by("pk").values_list("pk", "uid"))
    now = timezone.now()
    for start in range(0, len(ids), 50 * SHARD_ROWS):
        chunk = ids[start : start + 50 * SHARD_ROWS]
        with transaction.atomic():
            attempts, results = [], []
            for offset in range(0, len(chunk), SHARD_ROWS):
                rows = chunk[offset : offset + SHARD_ROWS]
                batch = Batch.objects.create(
                    campaign=campaign, version=version, size=len(rows), state="done"
                )
                vectors = rng.standard_normal((len(rows), dimension)).astype("<f4")
                rel = f"{campaign.name}/{version.label}/shards/b{batch.pk}.npz"
                (root / rel).parent.mkdir(parents=True, exist_ok=True)
                (root / rel).write_bytes(shard_bytes([uid for _, uid in rows], vectors))
                for row, (pk, _uid) in enumerate(rows):
                    path = member_path(rel, row)
                    attempts.append(
                        Attempt(
                            unit_id=pk,
                            batch=batch,
                            version=version,
                            outcome="succeeded",
                            output_path=path,
                            output_size=dimension * 4,
                            started_at=now,
                            finished_at=now,
                            duration_ms=1,
                        )
                    )
                    results.append((pk, UnitState.SUCCEEDED, batch.pk, path))
            Attempt.objects.bulk_create(attempts, batch_size=2000)
            if current:
                update_rows(Unit, ("state", "batch", "output_path"), results, also={})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--dimension", type=int, default=384)
    args = parser.parse_args()

    from django_env import setup as django_setup

    work = django_setup("bench-versions-", os.environ.get("DATABASE_URL", ""))
    from django.db import connection
    from import_scale import write_manifest

    from campaigns.exports.inventory import consolidate_vectors
    from campaigns.exports.matrices import matrix_stream
    from campaigns.exports.tables import table_stream
    from campaigns.intake.importing import import_manifest
    from campaigns.review.compare import compare_versions
    from campaigns.runs import setup, versions

    manifest = work / "manifest.jsonl"
    write_manifest(manifest, args.units, "jsonl")
    (work / "empty.jsonl").write_text("")
    campaign, _ = setup.campaign_create(
        name="bench-versions",
        processor="text-embedding",
        project=setup.project_for_user(name="bench"),
        manifest=work / "empty.jsonl",
        input_root=work / "corpus",
        checkpoint_after=0,
    )
    import_manifest(campaign, manifest)
    first = campaign.current_version
    _make_outputs(campaign, first, args.dimension, current=False, seed=1)
    second = setup.version_create(campaign=campaign, params={"pooling": "cls"})
    campaign.refresh_from_db()
    _make_outputs(campaign, second, args.dimension, current=True, seed=2)
    print(
        f"{connection.vendor}, {args.units:,} units, dimension {args.dimension}, "
        f"2 versions; RSS before {_rss_mib():.0f} MiB"
    )

    def timed(label: str, work) -> None:
        started = time.perf_counter()
        result = work()
        seconds = time.perf_counter() - started
        print(f"{label}: {seconds:.2f} s, RSS {_rss_mib():.0f} MiB  ({result})")

    timed(
        "versions table",
        lambda: [p.valid for p in versions.version_progress(campaign=campaign)],
    )
    for version in (first, second):
        matrix = matrix_stream(campaign=campaign, version=version)
        assert matrix is not None
        timed(
            f"download {version.label} ({'unit rows' if version == second else 'attempts'})",
            lambda matrix=matrix: f"{sum(map(len, matrix.body)) / 2**20:.0f} MiB streamed",
        )
    for version in (first, second):
        table = table_stream(campaign=campaign, version=version)
        assert table is not None
        timed(
            f"download {version.label} as Parquet",
            lambda table=table: f"{sum(map(len, table.body)) / 2**20:.0f} MiB streamed",
        )
    timed(
        "compare v1 v2",
        lambda: f"{compare_versions(campaign=campaign, a=first, b=second)['compared']} compared",
    )
    (work / "export").mkdir()
    timed("export matrices", lambda: len(consolidate_vectors(campaign, work / "export")))


if __name__ == "__main__":
    main()
