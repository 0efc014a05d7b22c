"""verify and resume against real files (batches run in-process; the worker
process variant is tests/integration/test_worker_killed.py)."""

from __future__ import annotations

import csv
import hashlib
import os
import time
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow.parquet as pq
import pytest

from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import control, start
from campaigns.storage.vector_shards import load_shard, shard_bytes, split_member
from campaigns.verify.reconcile import campaign_verify
from gpuworker.runner.batch import run_batch
from tests.conftest import DEMO_BAD, DEMO_GOOD
from tests.vectors import output_file, unit_vector

pytestmark = pytest.mark.django_db


def _run_queued(campaign) -> int:
    ran = 0
    for pk in Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).values_list(
        "pk", flat=True
    ):
        run_batch(pk)
        ran += 1
    return ran


@pytest.fixture
def enqueue(django_capture_on_commit_callbacks):
    """Runs services with the broker send captured: the batches then run in-process."""

    def call(fn, **kwargs):
        with (
            mock.patch.object(start.celery_app, "send_task"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            return fn(**kwargs)

    return call


@pytest.fixture
def done(make_campaign, output_root, enqueue):
    campaign = make_campaign("checked", batch_size=8)
    enqueue(start.campaign_run, campaign=campaign)
    _run_queued(campaign)
    return campaign


def _succeeded(campaign, n, prefix=""):
    return list(
        Unit.objects.filter(
            campaign=campaign, state=UnitState.SUCCEEDED, uid__startswith=prefix
        ).order_by("uid")[:n]
    )


def test_a_finished_campaign_verifies_clean(done):
    report = campaign_verify(campaign=done).as_dict()
    assert report["total"] == DEMO_GOOD + DEMO_BAD
    assert report["valid"] == DEMO_GOOD
    assert report["input_invalid"] == DEMO_BAD
    assert report["output_missing"] == report["output_incomplete"] == 0
    assert report["orphan_outputs"] == 0 and report["corrected"] == 0


def test_missing_and_truncated_outputs_are_told_apart_and_only_they_are_recomputed(
    done, output_root, enqueue
):
    # given: one batch's shard deleted, another's truncated
    shards = _shards(done)
    gone, cut = sorted(shards)[1:3]
    (output_root / gone).unlink()
    (output_root / cut).write_bytes((output_root / cut).read_bytes()[:100])
    hit = {uid for shard in (gone, cut) for uid in shards[shard]}
    untouched = {
        shard: (output_root / shard).stat().st_mtime_ns
        for shard in shards
        if shard not in (gone, cut)
    }
    time.sleep(0.01)

    # when
    report = campaign_verify(campaign=done).as_dict()

    # then: every unit of those two batches, and no other
    assert report["output_missing"] == len(shards[gone])
    assert report["output_incomplete"] == len(shards[cut])
    assert report["valid"] == DEMO_GOOD - len(hit)
    missing = {s["id"] for s in report["samples"]["output_missing"]}
    assert missing == set(shards[gone])
    incomplete = report["samples"]["output_incomplete"]
    assert {s["id"] for s in incomplete} == set(shards[cut])
    assert "shard" in incomplete[0]["reason"]
    pending = Unit.objects.filter(campaign=done, state=UnitState.PENDING)
    assert set(pending.values_list("uid", flat=True)) == hit

    # and resume recomputes those and no other
    _report, _retried, batches = enqueue(control.campaign_resume, campaign=done)
    assert batches == 2
    _run_queued(done)
    assert Unit.objects.filter(campaign=done, state=UnitState.SUCCEEDED).count() == DEMO_GOOD
    assert {s: (output_root / s).stat().st_mtime_ns for s in untouched} == untouched
    assert set(_shards(done)) & {gone, cut} == set()
    assert campaign_verify(campaign=done).as_dict()["valid"] == DEMO_GOOD


def _shards(campaign) -> dict[str, list[str]]:
    """Each shard file its units' results point into, with those units' ids."""
    shards: dict[str, list[str]] = {}
    for uid, rel in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).values_list(
        "uid", "output_path"
    ):
        shards.setdefault(split_member(rel)[0], []).append(uid)
    return shards


def test_a_removed_input_is_input_missing_not_a_missing_output_and_is_not_retried(
    done, corpus, enqueue
):
    gone = _succeeded(done, 2, prefix="news/")
    for unit in gone:
        (corpus / unit.source_path).unlink()
    report = campaign_verify(campaign=done).as_dict()
    assert report["input_missing"] == 2
    assert report["output_missing"] == 0
    _report, _retried, batches = enqueue(control.campaign_resume, campaign=done)
    assert batches == 0
    for unit in gone:
        unit.refresh_from_db()
        assert (unit.state, unit.error_class) == ("failed", "input_missing")
        assert "not found" in unit.error_message
    # even --retry-failed leaves an input that is still gone alone
    _report, retried, _batches = enqueue(control.campaign_resume, campaign=done, retry_failed=True)
    assert Unit.objects.filter(campaign=done, error_class="input_missing").count() == 2


def test_a_modified_input_is_input_changed_and_retry_makes_a_new_output(
    done, corpus, output_root, enqueue
):
    (unit,) = _succeeded(done, 1, prefix="recipes/bread")
    old_output = unit_vector(output_root, unit.output_path)
    (corpus / unit.source_path).write_text("Sourdough needs a starter fed the day before.\n")
    report = campaign_verify(campaign=done).as_dict()
    assert report["input_changed"] == 1
    unit.refresh_from_db()
    assert (unit.state, unit.error_class) == ("failed", "input_changed")

    enqueue(control.campaign_resume, campaign=done, retry_failed=True)
    _run_queued(done)
    unit.refresh_from_db()
    assert unit.state == UnitState.SUCCEEDED
    assert not np.array_equal(unit_vector(output_root, unit.output_path), old_output)
    latest = Attempt.objects.filter(unit=unit).order_by("-finished_at").first()
    assert latest.input_sha256 == unit.sha256
    assert latest.metrics.get("adopted") is not True


def test_same_size_corruption_needs_deep(done, output_root):
    (unit,) = _succeeded(done, 1)
    shard, row = split_member(unit.output_path)
    path = output_root / shard
    loaded = load_shard(path)
    vectors = loaded.vectors.copy()
    vectors[row, -1] += 1e-4  # one value of one row: same size, still a whole shard
    path.write_bytes(shard_bytes(loaded.ids.tolist(), vectors))
    assert campaign_verify(campaign=done).as_dict()["output_incomplete"] == 0
    deep = campaign_verify(campaign=done, deep=True).as_dict()
    assert deep["output_incomplete"] == 1
    assert deep["samples"]["output_incomplete"][0]["id"] == unit.uid
    assert "checksum" in deep["samples"]["output_incomplete"][0]["reason"]


def test_stale_temp_files_are_removed_and_orphans_reported(done, output_root):
    (unit,) = _succeeded(done, 1)
    folder = output_file(output_root, unit.output_path).parent
    stale = folder / ".crashed.npy.abc123.tmp"
    stale.write_bytes(b"partial")
    orphan = folder / "not-from-any-unit.npy"
    orphan.write_bytes(b"x")
    report = campaign_verify(campaign=done).as_dict()
    assert report["stale_temp_files_removed"] == 1
    assert not stale.exists()
    assert report["orphan_outputs"] == 1
    assert orphan.exists()  # reported, never deleted: the user decides
    assert report["orphan_samples"] == [str(orphan.relative_to(output_root))]


def test_a_redelivered_batch_adopts_valid_outputs_instead_of_recomputing(
    make_campaign, output_root, enqueue
):
    campaign = make_campaign("redeliver", batch_size=50)
    enqueue(start.campaign_run, campaign=campaign)
    batch = Batch.objects.get(campaign=campaign)
    run_batch(batch.pk)
    files = {p: p.stat().st_mtime_ns for p in Path(output_root).rglob("*.npz")}
    assert len(files) == 1
    # the worker died after writing, before recording: the database forgot
    Unit.objects.filter(campaign=campaign).exclude(error_class__startswith="input").update(
        state=UnitState.QUEUED, output_path="", output_size=None, output_sha256=""
    )
    Batch.objects.filter(pk=batch.pk).update(state=Batch.State.QUEUED)
    run_batch(batch.pk)
    assert Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).count() == DEMO_GOOD
    assert {p: p.stat().st_mtime_ns for p in Path(output_root).rglob("*.npz")} == files
    adopted = Attempt.objects.filter(unit__campaign=campaign, metrics__adopted=True).count()
    assert adopted == DEMO_GOOD


def test_verify_counts_every_unit_once_across_many_chunks(done, monkeypatch):
    monkeypatch.setattr("campaigns.verify.reconcile._CHUNK", 7)
    report = campaign_verify(campaign=done).as_dict()
    assert report["total"] == DEMO_GOOD + DEMO_BAD


def test_verify_takes_no_input_hash_for_untouched_files(done, monkeypatch):
    calls = []
    import campaigns.verify.reconcile as reconcile

    monkeypatch.setattr(reconcile, "sha256_of", lambda fd, size: calls.append(fd) or "x")
    campaign_verify(campaign=done)
    assert calls == []
    os.utime(Path(done.input_root) / "news/rail-strike.txt")  # touched, same bytes
    report = campaign_verify(campaign=done).as_dict()
    assert len(calls) == 1  # the touched file earns a checksum
    assert report["input_changed"] == 1  # our fake checksum differs: changed


def test_export_consolidates_the_vectors_of_each_version(done, output_root, tmp_path):
    from campaigns.exports.inventory import export

    written = {p.name for p in export(done, tmp_path / "dossier")}
    label = done.current_version.label
    assert {f"vectors-{label}.npy", f"vectors-{label}.csv"} <= written
    matrix = np.load(tmp_path / "dossier" / f"vectors-{label}.npy")
    assert matrix.shape == (DEMO_GOOD, 384)
    with open(tmp_path / "dossier" / f"vectors-{label}.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == DEMO_GOOD
    for row in rows[:5]:
        vector = unit_vector(output_root, row["output_path"])
        assert np.array_equal(matrix[int(row["row"])], vector)
    assert all(row["error"] == "" for row in rows)

    # A shard deleted since: its rows say so and hold NaN, the others are whole.
    lost = rows[0]["output_path"].split("#")[0]
    (output_root / lost).unlink()
    export(done, tmp_path / "again")
    again = np.load(tmp_path / "again" / f"vectors-{label}.npy")
    with open(tmp_path / "again" / f"vectors-{label}.csv") as fh:
        rows = list(csv.DictReader(fh))
    gone = [int(r["row"]) for r in rows if r["output_path"].startswith(lost + "#")]
    assert gone and all(rows[i]["error"].startswith("output unreadable: ") for i in gone)
    assert np.isnan(again[gone]).all()
    kept = [i for i in range(len(rows)) if i not in gone]
    assert all(rows[i]["error"] == "" for i in kept)
    assert np.array_equal(again[kept], matrix[kept])


def test_a_redelivered_batch_recomputes_the_rows_of_a_damaged_shard(
    make_campaign, output_root, enqueue
):
    campaign = make_campaign("damaged", batch_size=50)
    enqueue(start.campaign_run, campaign=campaign)
    batch = Batch.objects.get(campaign=campaign)
    run_batch(batch.pk)
    (first,) = Path(output_root).rglob("*.npz")
    first.write_bytes(first.read_bytes()[:200])  # the disk lost its tail
    # the worker died after writing, before recording: the database never knew
    Attempt.objects.filter(batch=batch).delete()
    Unit.objects.filter(campaign=campaign).update(
        state=UnitState.QUEUED, output_path="", output_size=None, output_sha256=""
    )
    Batch.objects.filter(pk=batch.pk).update(state=Batch.State.QUEUED)
    run_batch(batch.pk)
    assert not Attempt.objects.filter(unit__campaign=campaign, metrics__adopted=True).exists()
    second = {
        split_member(rel)[0]
        for rel in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).values_list(
            "output_path", flat=True
        )
    }
    assert len(second) == 1 and output_root / second.pop() != first
    report = campaign_verify(campaign=campaign).as_dict()
    assert report["valid"] == DEMO_GOOD
    # the damaged copy no unit points into is reported, never deleted
    assert report["orphan_outputs"] == 1 and first.exists()
    assert report["orphan_samples"] == [str(first.relative_to(output_root))]


def test_a_shard_only_an_earlier_attempt_points_into_is_not_an_orphan(done, output_root):
    (unit,) = _succeeded(done, 1)
    shard = split_member(unit.output_path)[0]
    # the unit's result moved on (say, rerun elsewhere); its first attempt keeps the row
    others = Unit.objects.filter(campaign=done, output_path__startswith=shard + "#")
    others.update(output_path="elsewhere/none.npy")
    assert Attempt.objects.filter(unit=unit, output_path__startswith=shard).exists()
    report = campaign_verify(campaign=done).as_dict()
    assert report["orphan_outputs"] == 0
    Attempt.objects.filter(output_path__startswith=shard + "#").update(output_path="")
    report = campaign_verify(campaign=done).as_dict()
    assert report["orphan_outputs"] == 1
    assert report["orphan_samples"] == [shard]


def test_outputs_written_a_file_a_unit_before_shards_still_verify_and_export(
    done, output_root, tmp_path
):
    """A campaign from before shards: its .npy files sit beside new shard rows."""
    from campaigns.exports.inventory import consolidate_vectors
    from campaigns.storage.outputs import vector_to_npy
    from campaigns.storage.paths import output_relpath

    old, new = _succeeded(done, 2)
    vector = unit_vector(output_root, old.output_path)
    rel = str(
        output_relpath(
            campaign=done.name,
            version_label=done.current_version.label,
            uid=old.uid,
            suffix=".npy",
        )
    )
    data = vector_to_npy(vector)
    (output_root / rel).parent.mkdir(parents=True, exist_ok=True)
    (output_root / rel).write_bytes(data)
    Unit.objects.filter(pk=old.pk).update(
        output_path=rel, output_size=len(data), output_sha256=hashlib.sha256(data).hexdigest()
    )
    assert campaign_verify(campaign=done, deep=True).as_dict()["valid"] == DEMO_GOOD
    matrix_path, ids_path, table_path = consolidate_vectors(done, tmp_path)
    with open(ids_path) as fh:
        row_of = {r["id"]: int(r["row"]) for r in csv.DictReader(fh)}
    matrix = np.load(matrix_path)
    assert np.array_equal(matrix[row_of[old.uid]], vector)
    table = pq.read_table(table_path, columns=["id", "vector"]).to_pylist()
    assert table[row_of[old.uid]]["id"] == old.uid
    assert np.array_equal(np.asarray(table[row_of[old.uid]]["vector"], np.float32), vector)
    assert np.array_equal(matrix[row_of[new.uid]], unit_vector(output_root, new.output_path))
    # and a damaged old file is still caught
    (output_root / rel).write_bytes(data[:-4])
    report = campaign_verify(campaign=done).as_dict()
    assert report["output_incomplete"] == 1
    assert report["samples"]["output_incomplete"][0]["id"] == old.uid
