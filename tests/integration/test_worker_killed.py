"""SIGKILL the worker mid-batch, three times; then nothing is lost or duplicated."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import pytest

from campaigns import selectors
from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import control, setup, start
from campaigns.verify.reconcile import campaign_verify
from tests.vectors import unit_vector
from tests.worker import wait_until

pytestmark = pytest.mark.integration

TOPICS = ["harbour", "railway", "library", "harvest", "solar", "backup", "tides", "vaccines"]


def _corpus(root: Path, n: int) -> None:
    # Long texts (all truncated at 256 tokens), so every batch takes a while.
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        words = " ".join(
            f"{topic} report {i} paragraph {j} with figures {i * j}." for j in range(60)
        )
        (root / f"doc-{i:03d}.txt").write_text(words + "\n")
    (root / "empty.txt").write_bytes(b"")


def test_three_kills_then_resume_leave_exactly_one_valid_output_per_unit(
    start_worker, project, tmp_path, output_root, settings
):
    # given: 96 long texts and one bad input, batches of 16, a 2 s lease
    settings.BATCH_LEASE_SECONDS = 2
    corpus = tmp_path / "long-corpus"
    corpus.mkdir()
    _corpus(corpus, 96)
    campaign, _ = setup.campaign_create(
        name="killed",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"batch_size": 16},
    )
    start.campaign_run(campaign=campaign)

    # when: a worker is SIGKILLed while it holds a batch, three times
    killed_mid_batch = 0
    for _attempt in range(8):
        if killed_mid_batch == 3:
            break
        worker = start_worker()
        held = Batch.objects.filter(
            campaign=campaign, state=Batch.State.RUNNING, lease_expires_at__isnull=False
        )
        wait_until(
            lambda held=held: held.exclude(lease_token="").exists(),
            timeout=120,
            interval=0.02,
            worker=worker,
        )
        victim = held.exclude(lease_token="").first()
        time.sleep(0.2)
        worker.kill()
        victim.refresh_from_db()
        if victim.state == Batch.State.RUNNING:
            killed_mid_batch += 1
    assert killed_mid_batch == 3

    # then: a new worker (with the periodic sweeper) finishes, resume finds nothing more
    worker = start_worker(beat=True)
    wait_until(
        lambda: not selectors.campaign_counts(campaign=campaign).active, timeout=240, worker=worker
    )
    _report, _retried, _enqueued = control.campaign_resume(campaign=campaign)
    wait_until(
        lambda: not selectors.campaign_counts(campaign=campaign).active, timeout=120, worker=worker
    )

    counts = selectors.campaign_counts(campaign=campaign)
    assert (counts.succeeded, counts.failed, counts.pending) == (96, 1, 0)
    assert Batch.objects.filter(campaign=campaign, deliveries__gte=2).count() >= 1
    assert Batch.objects.filter(campaign=campaign).exclude(state=Batch.State.DONE).count() == 0

    # exactly one valid output per unit, no partial file, no duplicate result rows
    assert not [p for p in Path(output_root).rglob("*") if p.name.endswith(".tmp")]
    for unit in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED):
        vector = unit_vector(output_root, unit.output_path)
        assert hashlib.sha256(vector.tobytes()).hexdigest() == unit.output_sha256
        assert Attempt.objects.filter(unit=unit, outcome="succeeded").count() == 1, unit.uid
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["valid"] == 96 and report["input_invalid"] == 1
    assert report["output_missing"] == report["output_incomplete"] == 0
    assert report["orphan_outputs"] == 0
