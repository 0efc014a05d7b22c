"""A real worker process, the configured broker and database, a heterogeneous corpus."""

from __future__ import annotations

import hashlib
import json
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
from django.core.management import call_command

from campaigns import selectors
from campaigns.models import Attempt, Batch, Campaign, Unit, UnitState
from campaigns.runs import start
from tests.conftest import DEMO_BAD, DEMO_GOOD
from tests.vectors import unit_vector
from tests.worker import wait_until

pytestmark = pytest.mark.integration


def test_a_worker_process_embeds_the_corpus_and_every_count_adds_up(
    start_worker, make_campaign, corpus, output_root
):
    # given: the demo corpus plus a unit whose input vanishes before the run
    (corpus / "late").mkdir()
    (corpus / "late" / "vanishes.txt").write_text("here at import, gone at run time\n")
    campaign = make_campaign("integration", batch_size=5)
    (corpus / "late" / "vanishes.txt").unlink()
    originals = {p: p.read_bytes() for p in corpus.rglob("*") if p.is_file()}

    # when: a real worker takes the batches from the broker
    worker = start_worker()
    batches = start.campaign_run(campaign=campaign)
    assert batches == 8  # 40 units, batches of 5
    wait_until(
        lambda: not selectors.campaign_counts(campaign=campaign).active, timeout=180, worker=worker
    )

    # then: every unit is accounted for, exactly once
    counts = selectors.campaign_counts(campaign=campaign)
    assert (counts.succeeded, counts.failed, counts.pending, counts.running) == (
        DEMO_GOOD,
        DEMO_BAD + 1,
        0,
        0,
    )
    assert counts.by_error == {"input_invalid": DEMO_BAD, "input_missing": 1}
    assert Batch.objects.filter(campaign=campaign, state=Batch.State.DONE).count() == 8
    assert Attempt.objects.filter(unit__campaign=campaign).count() == DEMO_GOOD + DEMO_BAD + 1

    # every success has its file, checked, with the recorded size and checksum
    for unit in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED):
        vector = unit_vector(output_root, unit.output_path)
        assert vector.shape == (384,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-4
        assert (vector.nbytes, hashlib.sha256(vector.tobytes()).hexdigest()) == (
            unit.output_size,
            unit.output_sha256,
        )
    # one shard a batch that had a success, no file a unit, no temp file left
    shards = list(Path(output_root).rglob("*.npz"))
    assert (
        len(shards)
        == Batch.objects.filter(campaign=campaign, attempts__outcome="succeeded").distinct().count()
    )
    assert not list(Path(output_root).rglob("*.npy"))
    assert not list(Path(output_root).rglob("*.tmp"))

    # different texts, different vectors
    a = unit_vector(
        output_root, Unit.objects.get(campaign=campaign, uid="news/rail-strike.txt").output_path
    )
    b = unit_vector(
        output_root, Unit.objects.get(campaign=campaign, uid="recipes/bread.txt").output_path
    )
    assert float(a @ b) < 0.9

    gone = Unit.objects.get(campaign=campaign, uid="late/vanishes.txt")
    assert gone.error_message == "input file not found: late/vanishes.txt"

    # originals untouched
    assert {p: p.read_bytes() for p in corpus.rglob("*") if p.is_file()} == originals

    # the CLI reads the same numbers
    out = StringIO()
    call_command("campaign", "status", campaign.name, "--json", stdout=out)
    assert json.loads(out.getvalue())["succeeded"] == DEMO_GOOD
    assert "succeeded" in worker.output()


def test_a_started_campaigns_rest_is_planned_by_the_worker_and_runs(
    start_worker, make_campaign, monkeypatch
):
    # given: a campaign past its checkpoint, started as the web page starts it,
    # with slices small enough that most of it is left for the worker to plan
    monkeypatch.setattr(start, "RUN_SLICE_UNITS", 10)
    campaign = make_campaign("started", batch_policy="token_budget", token_budget=1024)
    Campaign.objects.filter(pk=campaign.pk).update(checkpoint_after=0)
    campaign.refresh_from_db()
    worker = start_worker()

    # when
    batches, more = start.campaign_start(campaign=campaign)

    # then: the first slice went out at once, the worker planned the other 29
    # units from the portal queue, and every unit ran
    assert batches >= 1 and more
    wait_until(
        lambda: (
            not selectors.campaign_counts(campaign=campaign).active
            and not Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).exists()
        ),
        timeout=180,
        worker=worker,
    )
    counts = selectors.campaign_counts(campaign=campaign)
    assert (counts.succeeded, counts.failed) == (DEMO_GOOD, DEMO_BAD)
    assert Batch.objects.filter(campaign=campaign).count() > batches
    assert not Unit.objects.filter(campaign=campaign, cost__isnull=True).exists()
