"""A large record file's first group (the checkpoint's cross-section), run in process.

    .venv/bin/python bench/first_group.py /tmp/rec1m/records-1000000.parquet --batches 60

(the checkout the script lies in runs: copy it into another one to measure that).

Creates a record campaign over the file (its `id` and `text` columns; records
from `bench/import_records.py --keep`) with the default checkpoint, plans its
first group (`campaign_run`, the broker send mocked), then runs the first
--batches batches here with the model replaced by an instant stand-in (as
bench/orchestration.py does): ms a unit, and how many Parquet row groups were
decoded while planning (the weighing) and by the batches.
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("records", type=Path)
    parser.add_argument("--batches", type=int, default=60)
    args = parser.parse_args()
    # Celery puts the working folder first on sys.path: this checkout's code, not the caller's.
    os.chdir(REPO)
    sys.path.insert(0, str(REPO))
    from bench import django_env, instant_model

    django_env.setup("bench-first-group-")
    import numpy as np

    from campaigns.intake import record_reads
    from campaigns.intake.records import RecordColumns
    from campaigns.models import Batch, Unit
    from campaigns.runs import setup, start
    from gpuworker.processors import text_embedding
    from gpuworker.runner.batch import run_batch

    rng = np.random.default_rng(0)

    instant_embed = instant_model.instant_embed(rng)

    decodes = [0]
    decoded_once = record_reads._decoded_once

    def counted(key, decode):
        def counting():
            decodes[0] += 1
            return decode()

        return decoded_once(key, counting)

    project = setup.project_for_user(name="bench")
    started = time.perf_counter()
    campaign, _ = setup.campaign_create(
        name="first-group",
        processor="text-embedding",
        project=project,
        records=args.records,
        columns=RecordColumns(text="text", id="id"),
    )
    print(f"imported in {time.perf_counter() - started:.1f} s")
    with (
        mock.patch.object(start.celery_app, "send_task"),
        mock.patch.object(text_embedding.TextEmbeddingProcessor, "embed", instant_embed),
        mock.patch.object(record_reads, "_decoded_once", counted),
    ):
        started = time.perf_counter()
        start.campaign_run(campaign=campaign)
        pks = list(
            Batch.objects.filter(campaign=campaign).order_by("pk").values_list("pk", flat=True)
        )
        print(f"first group: {len(pks)} batches planned in {time.perf_counter() - started:.1f} s")
        planning = decodes[0]
        started, cpu = time.perf_counter(), time.process_time()
        for pk in pks[: args.batches]:
            run_batch(pk)
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    done = Unit.objects.filter(campaign=campaign, state="succeeded").count()
    print(
        f"{REPO}: {min(args.batches, len(pks))} batches, {done} units, {seconds:.1f} s, "
        f"{1000 * seconds / max(done, 1):.2f} ms a unit, {1000 * cpu / max(done, 1):.2f} CPU "
        f"ms a unit; row groups (or slices of one) decoded: {planning} planning, "
        f"{decodes[0] - planning} running; peak RSS "
        f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024} MiB"
    )


if __name__ == "__main__":
    main()
