"""A record campaign's rows the prefetch prepared are not read again by their
batch (gpuworker/runner/run.py: `rows_of` takes only the units not prepared)."""

from __future__ import annotations

from collections import Counter
from unittest import mock

import pytest

from campaigns.intake.records import RecordColumns
from campaigns.models import Batch, Unit, UnitState
from campaigns.runs import setup, start
from gpuworker.runner import read as runner_read
from gpuworker.runner.batch import run_batch
from gpuworker.runner.pipeline import finisher
from gpuworker.runner.prefetch import prefetch
from tests.campaigns.test_records import write_jsonl

pytestmark = pytest.mark.django_db(transaction=True)


def test_rows_prepared_ahead_are_read_once(project, tmp_path, output_root):
    rows = [{"id": f"r{i}", "text": f"text number {i}"} for i in range(24)]
    campaign, _ = setup.campaign_create(
        name="recs",
        processor="text-embedding",
        project=project,
        records=write_jsonl(tmp_path / "c.jsonl", rows),
        columns=RecordColumns(id="id", text="text"),
        params={"batch_policy": "length_grouped", "batch_size": 8},
        checkpoint_after=0,
    )
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    reads: Counter = Counter()
    real = runner_read.read_records

    def counted(root, places, *args, **kwargs):
        reads.update(p.row for p in places)
        return real(root, places, *args, **kwargs)

    try:
        with mock.patch.object(runner_read, "read_records", counted):
            for batch in Batch.objects.filter(campaign=campaign).order_by("pk"):
                assert run_batch(batch.pk, hand_off=True) == "handed off"
            finisher.drain()
    finally:
        prefetch.drop()
        finisher.drain()
    later = Batch.objects.filter(campaign=campaign).order_by("pk")[1:]
    assert [b.metrics.get("prefetched") for b in later] == [b.size for b in later]
    assert set(reads.values()) == {1}, reads  # each row read once, ahead or by its batch
    assert len(reads) == 24
    assert not Unit.objects.filter(campaign=campaign).exclude(state=UnitState.SUCCEEDED).exists()
