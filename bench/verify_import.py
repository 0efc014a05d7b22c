"""Import of N manifest rows and verify over N outputs (default and --deep).

    .venv/bin/python bench/verify_import.py --units 100000

    .venv/bin/python bench/verify_import.py --units 100000 --layout files

Runs on a throw-away SQLite database and folders under a temp dir (or
--database-url for PostgreSQL). Inputs are small text files; outputs are real
384-d float32 vectors, written directly (the model is not what is measured
here): by default as the text embedding writes them, shards of --shard-rows
rows whose units are drawn at random (a token budget groups by length, so a
batch's units are scattered in id order: the reader's worst case); with
--layout files, one .npy a unit at its deterministic path (the layout older
campaigns still have). Results go in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--layout", choices=("shards", "files"), default="shards")
    parser.add_argument("--shard-rows", type=int, default=40)
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-verify-"))
    os.environ["VAR_DIR"] = str(work / "var")
    os.environ["OUTPUT_ROOT"] = str(work / "outputs")
    os.environ["DJANGO_SETTINGS_MODULE"] = "portal.settings"
    if args.database_url:
        os.environ["DATABASE_URL"] = args.database_url
    import django

    django.setup()
    import numpy as np
    from django.conf import settings
    from django.core.management import call_command

    from campaigns.exports.inventory import consolidate_vectors
    from campaigns.models import Unit, UnitState
    from campaigns.runs import setup
    from campaigns.storage.outputs import vector_to_npy
    from campaigns.storage.paths import output_relpath, shard_relpath
    from campaigns.storage.vector_shards import member_path, row_sha256, shard_bytes
    from campaigns.verify.reconcile import campaign_verify

    call_command("migrate", verbosity=0)
    n = args.units
    corpus = work / "corpus"
    for i in range(n):
        folder = corpus / f"{i // 1000:03d}"
        if i % 1000 == 0:
            folder.mkdir(parents=True)
        (folder / f"doc-{i:06d}.txt").write_text(f"document number {i}\n")
    manifest = corpus / "manifest.jsonl"
    with manifest.open("w") as fh:
        for i in range(n):
            fh.write(json.dumps({"id": f"doc-{i:06d}", "path": f"{i // 1000:03d}/doc-{i:06d}.txt"}))
            fh.write("\n")

    project = setup.project_for_user(name="bench")
    started = time.perf_counter()
    campaign, report = setup.campaign_create(
        checkpoint_after=0,  # measuring speed: no stop for a spot check
        name="bench",
        processor="text-embedding",
        project=project,
        manifest=manifest,
    )
    import_s = time.perf_counter() - started
    assert report.created == n, report

    # Outputs as a finished campaign would have them.
    label = campaign.current_version.label
    vector = (np.ones(384) / np.sqrt(384)).astype(np.float32)
    data = vector_to_npy(vector)
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    out_root = Path(settings.OUTPUT_ROOT)
    updates = list(Unit.objects.filter(campaign=campaign).only("pk", "uid"))
    if args.layout == "files":
        for unit in updates:
            rel = output_relpath(campaign="bench", version_label=label, uid=unit.uid, suffix=".npy")
            path = out_root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            unit.state, unit.output_path = UnitState.SUCCEEDED, str(rel)
            unit.output_size, unit.output_sha256 = len(data), sha
    else:
        order = np.random.default_rng(0).permutation(len(updates))
        step = args.shard_rows
        for batch_id, start in enumerate(range(0, len(order), step), start=1):
            members = [updates[i] for i in order[start : start + step]]
            rel = str(
                shard_relpath(campaign="bench", version_label=label, batch_id=batch_id, token="b")
            )
            path = out_root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(
                shard_bytes([u.uid for u in members], np.tile(vector, (len(members), 1)))
            )
            for row, unit in enumerate(members):
                unit.state, unit.output_path = UnitState.SUCCEEDED, member_path(rel, row)
                unit.output_size, unit.output_sha256 = vector.nbytes, row_sha256(vector)
    Unit.objects.bulk_update(
        updates, ["state", "output_path", "output_size", "output_sha256"], batch_size=2000
    )

    rows = [("import manifest (stat + sha256 of each input, insert)", import_s)]
    for deep in (False, True):
        started = time.perf_counter()
        result = campaign_verify(campaign=campaign, deep=deep).as_dict()
        assert result["valid"] == n, result
        rows.append((f"verify{' --deep' if deep else ''}", time.perf_counter() - started))
    (work / "export").mkdir()
    started = time.perf_counter()
    (matrix, _ids, _table) = consolidate_vectors(campaign, work / "export")
    assert np.load(matrix, mmap_mode="r").shape == (n, 384)
    rows.append(
        (
            "export: the vectors in one matrix, its rows as CSV and Parquet",
            time.perf_counter() - started,
        )
    )

    engine = settings.DATABASES["default"]["ENGINE"].rsplit(".", 1)[-1]
    print(f"# {n} units, database {engine}, {os.cpu_count()} cores, outputs: {args.layout}")
    print("| step | seconds | units/s |")
    print("|---|---:|---:|")
    for name, seconds in rows:
        print(f"| {name} | {seconds:.1f} | {n / seconds:,.0f} |")


if __name__ == "__main__":
    main()
