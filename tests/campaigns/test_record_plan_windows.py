"""A record campaign's batches read one stretch of its rows each, the first
group (a cross-section of the whole file) included (campaigns/runs/batching.py,
RECORD_WINDOW_IDS)."""

from __future__ import annotations

import json
import random
from unittest import mock

import pytest

from campaigns.intake.records import RecordColumns
from campaigns.models import Batch, Unit
from campaigns.runs import setup, start

pytestmark = pytest.mark.django_db


def test_the_first_groups_batches_each_read_one_stretch_of_the_records(project, tmp_path):
    # given: 2,000 rows of varied lengths, the default checkpoint (a first
    # group drawn across the whole file) and stretches of 400 ids
    rng = random.Random(5)
    records = tmp_path / "docs.jsonl"
    records.write_text(
        "".join(
            json.dumps({"id": f"d{i}", "text": "word " * rng.randint(3, 120)}) + "\n"
            for i in range(2000)
        )
    )
    campaign, report = setup.campaign_create(
        name="stretches",
        processor="text-embedding",
        project=project,
        records=records,
        columns=RecordColumns(text="text", id="id"),
    )
    assert report.created == 2000

    # when: the run plans the first group
    with (
        mock.patch.object(start, "RECORD_WINDOW_IDS", 400),
        mock.patch.object(start.celery_app, "send_task"),
    ):
        start.campaign_run(campaign=campaign)

    # then: the group spans the file, and no batch mixes two stretches
    stretches = []
    for batch in Batch.objects.filter(campaign=campaign):
        pks = list(Unit.objects.filter(batch=batch).values_list("pk", flat=True))
        stretches.append({pk // 400 for pk in pks})
    assert len(set().union(*stretches)) >= 4
    assert all(len(s) == 1 for s in stretches), stretches
