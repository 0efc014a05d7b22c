"""The task body, called in-process (the integration tests run it in a real worker)."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch

from campaigns.models import Attempt, Batch, ReviewItem, Unit, UnitState
from campaigns.runs import setup, start
from campaigns.storage.vector_shards import load_shard, split_member
from gpuworker.processors.text_embedding import TextEmbeddingProcessor
from gpuworker.runner.batch import run_batch
from tests.conftest import DEMO_BAD, DEMO_GOOD
from tests.vectors import unit_vector

pytestmark = pytest.mark.django_db


@pytest.fixture
def queued(make_campaign, output_root, django_capture_on_commit_callbacks):
    campaign = make_campaign(batch_size=8)
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
    return campaign


def test_every_unit_ends_succeeded_with_a_valid_file_or_failed_with_a_reason(queued, output_root):
    for batch in Batch.objects.filter(campaign=queued):
        assert run_batch(batch.pk) == "done"
    units = Unit.objects.filter(campaign=queued)
    assert units.filter(state=UnitState.SUCCEEDED).count() == DEMO_GOOD
    assert units.filter(state=UnitState.FAILED).count() == DEMO_BAD
    rows_of: dict[str, list[int]] = {}
    for unit in units.filter(state=UnitState.SUCCEEDED):
        shard, row = split_member(unit.output_path)
        rows_of.setdefault(shard, []).append(row)
        vector = unit_vector(output_root, unit.output_path)
        assert vector.shape == (384,) and vector.dtype == np.float32
        assert unit.output_size == 384 * 4
        assert unit.output_sha256 == hashlib.sha256(vector.tobytes()).hexdigest()
        assert np.isclose(np.linalg.norm(vector), 1.0, atol=1e-4)
        assert shard.startswith(f"{queued.name}/{queued.current_version.label}/shards/")
    # One shard a batch that had successes, its rows the batch's units, each named in it.
    assert len(rows_of) == Batch.objects.filter(campaign=queued).count()
    for shard, rows in rows_of.items():
        loaded = load_shard(Path(output_root) / shard, dimension=384)
        assert sorted(rows) == list(range(len(loaded.ids)))
        named = dict(
            Unit.objects.filter(campaign=queued, uid__in=loaded.ids.tolist()).values_list(
                "uid", "output_path"
            )
        )
        assert all(named[uid] == f"{shard}#{row}" for row, uid in enumerate(loaded.ids.tolist()))
    reasons = dict(units.filter(state=UnitState.FAILED).values_list("uid", "error_message"))
    assert reasons["bad/empty.txt"] == "empty file"
    assert reasons["bad/whitespace-only.txt"].startswith("whitespace only")
    assert reasons["bad/latin1-not-utf8.txt"].startswith("not valid UTF-8")
    assert reasons["bad/photo-not-text.png"].startswith("binary file")
    assert Attempt.objects.filter(unit__campaign=queued).count() == DEMO_GOOD + DEMO_BAD
    long = Attempt.objects.get(unit__uid="long/annual-report.txt")
    assert long.metrics["truncated"] is True


def test_a_batch_runs_once_even_if_delivered_twice(queued):
    batch = Batch.objects.filter(campaign=queued).first()
    assert run_batch(batch.pk) == "done"
    assert run_batch(batch.pk) == "not runnable"
    assert Attempt.objects.filter(batch=batch).count() == batch.size


def test_a_batch_that_is_gone_is_ignored(db):
    assert run_batch(987654) == "gone"


def test_batch_records_tokens_time_and_memory(queued):
    batch = Batch.objects.filter(campaign=queued).order_by("pk").first()
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert batch.state == Batch.State.DONE
    assert batch.metrics["items"] == batch.size
    assert batch.padded_tokens >= batch.real_tokens > 0
    assert "memory" in batch.metrics and batch.metrics["runtime"]["torch"]
    # The worker's own packages, beside those its version recorded at creation.
    runtime = batch.metrics["runtime"]
    assert runtime["transformers"] == metadata.version("transformers")
    assert runtime["pillow"] == metadata.version("pillow")
    assert runtime["git_commit"] == batch.version.software["git_commit"]


def test_an_output_that_fails_its_check_is_not_counted(queued):
    batch = Batch.objects.filter(campaign=queued).order_by("pk").first()
    # A processor that gives 383 numbers instead of 384.
    with mock.patch.object(TextEmbeddingProcessor, "output", lambda self, r, i: r.vectors[i][:-1]):
        run_batch(batch.pk)
    units = Unit.objects.filter(batch=batch, uid__startswith="bad/").count()
    failed = Unit.objects.filter(batch=batch, error_class="output_invalid")
    assert failed.count() == batch.size - units
    assert "expected (n, 384)" in failed.first().error_message


def test_one_bad_row_fails_its_unit_only_and_goes_to_review(queued):
    batch = Batch.objects.filter(campaign=queued).order_by("pk")[1]
    victim = Unit.objects.filter(batch=batch).order_by("pk")[2]
    real_output = TextEmbeddingProcessor.output

    def output(self, result, index):
        vector = real_output(self, result, index).copy()
        if index == 2:
            vector[0] = np.nan
        return vector

    with mock.patch.object(TextEmbeddingProcessor, "output", output):
        run_batch(batch.pk)
    victim.refresh_from_db()
    assert (victim.state, victim.error_class) == ("failed", "output_invalid")
    assert "NaN" in victim.error_message and victim.output_path == ""
    assert ReviewItem.objects.get(unit=victim).reason == "non_finite"
    others = Unit.objects.filter(batch=batch).exclude(pk=victim.pk)
    assert set(others.values_list("state", flat=True)) == {"succeeded"}


def test_a_model_failure_fails_the_batch_with_its_reason_and_the_next_batch_runs(queued):
    first, second = Batch.objects.filter(campaign=queued).order_by("pk")[:2]
    with mock.patch.object(TextEmbeddingProcessor, "run", side_effect=RuntimeError("boom")):
        run_batch(first.pk)
    first.refresh_from_db()
    assert first.state == Batch.State.FAILED and "boom" in first.error
    assert set(Unit.objects.filter(batch=first).values_list("state", flat=True)) == {"failed"}
    run_batch(second.pk)
    assert Unit.objects.filter(batch=second, state=UnitState.SUCCEEDED).exists()


def test_an_input_changed_after_import_is_refused_not_mixed(queued, corpus):
    (corpus / "news" / "rail-strike.txt").write_text("Completely different news.\n")
    batch = Unit.objects.get(campaign=queued, uid="news/rail-strike.txt").batch
    run_batch(batch.pk)
    unit = Unit.objects.get(campaign=queued, uid="news/rail-strike.txt")
    assert (unit.state, unit.error_class) == ("failed", "input_changed")
    assert not unit.output_path


def test_results_of_a_worker_that_lost_its_lease_are_dropped(queued):
    batch = Batch.objects.filter(campaign=queued).order_by("pk").first()
    real_run = TextEmbeddingProcessor.run

    def stall_then_run(self, items):
        # Meanwhile the sweeper gave the batch to someone else.
        Batch.objects.filter(pk=batch.pk).update(lease_token="someone-else")
        return real_run(self, items)

    with mock.patch.object(TextEmbeddingProcessor, "run", stall_then_run):
        assert run_batch(batch.pk) == "lease lost"
    assert not Attempt.objects.filter(batch=batch).exists()
    assert set(Unit.objects.filter(batch=batch).values_list("state", flat=True)) == {"running"}


def test_a_failure_records_a_traceback_digest(queued):
    batch = Batch.objects.filter(campaign=queued).order_by("pk").last()
    with mock.patch.object(TextEmbeddingProcessor, "run", side_effect=RuntimeError("boom")):
        run_batch(batch.pk)
    failed = Attempt.objects.filter(batch=batch, error_class="processing_error")
    assert failed.exists()
    digests = set(failed.values_list("traceback_digest", flat=True))
    assert len(digests) == 1 and len(digests.pop()) == 12


# Committed rows: the heartbeat thread has its own connection and must see the batch.
@pytest.mark.django_db(transaction=True)
def test_the_lease_is_renewed_while_a_batch_runs(queued, settings):
    settings.BATCH_LEASE_SECONDS = 1  # renewed every 0.25 s
    batch = Batch.objects.filter(campaign=queued).order_by("pk").last()
    seen = []
    real_run = TextEmbeddingProcessor.run

    def slow_run(self, items):
        import time

        first = Batch.objects.get(pk=batch.pk).lease_expires_at
        time.sleep(0.8)
        seen.append((first, Batch.objects.get(pk=batch.pk).lease_expires_at))
        return real_run(self, items)

    with mock.patch.object(TextEmbeddingProcessor, "run", slow_run):
        assert run_batch(batch.pk) == "done"
    first, later = seen[0]
    assert later > first


def test_out_of_memory_splits_the_batch_and_a_unit_too_big_alone_fails(queued):
    import torch

    batch = Batch.objects.filter(campaign=queued).order_by("pk").last()
    real_run = TextEmbeddingProcessor.run

    def tight_device(self, items):
        # A device that holds two short texts at a time, and never the long report.
        if len(items) > 2 or any(len(t) > 5000 for t in items):
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_run(self, items)

    long_unit = Unit.objects.get(campaign=queued, uid="long/annual-report.txt")
    Unit.objects.filter(pk=long_unit.pk).update(batch=batch)
    Batch.objects.filter(pk=batch.pk).update(size=batch.size + 1)
    with mock.patch.object(TextEmbeddingProcessor, "run", tight_device):
        assert run_batch(batch.pk) == "done"
    batch.refresh_from_db()
    units = Unit.objects.filter(batch=batch)
    assert units.get(pk=long_unit.pk).error_class == "out_of_memory"
    assert "even alone" in units.get(pk=long_unit.pk).error_message
    good = units.exclude(pk=long_unit.pk).exclude(uid__startswith="bad/")
    assert good.count() >= 4
    assert set(good.values_list("state", flat=True)) == {"succeeded"}
    assert batch.metrics["oom_splits"][0] == good.count() + 1
    assert batch.state == Batch.State.DONE


def test_batch_measurements_are_stored_as_columns(queued):
    batch = Batch.objects.filter(campaign=queued).order_by("pk").last()
    run_batch(batch.pk)
    batch.refresh_from_db()
    assert batch.padded_tokens >= batch.real_tokens > 0
    assert batch.compute_seconds > 0
    # The host process's RSS always; on CUDA the device's memory beside it.
    assert batch.rss > 0
    if torch.cuda.is_available():
        assert batch.mem_reserved >= batch.mem_allocated > 0
    else:
        assert batch.mem_allocated is None
    assert batch.policy == "length_grouped"


def test_the_failed_attempt_is_released_before_the_halves_run(queued):
    """On a real device the failed forward pass's activations must be freed
    before the halves try: a retry made while the exception is still being
    handled keeps its frames, and so its tensors, alive."""
    import gc
    import weakref

    import torch

    batch = Batch.objects.filter(campaign=queued).order_by("pk").last()
    real_run = TextEmbeddingProcessor.run
    failed_attempts: list[weakref.ref] = []
    alive_at_retry: list[int] = []

    class Activations:  # stands for the tensors a failed pass had allocated
        pass

    def tight_device(self, items):
        gc.collect()
        alive_at_retry.append(sum(1 for ref in failed_attempts if ref() is not None))
        if len(items) > 2:
            activations = Activations()
            failed_attempts.append(weakref.ref(activations))
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real_run(self, items)

    with mock.patch.object(TextEmbeddingProcessor, "run", tight_device):
        assert run_batch(batch.pk) == "done"
    assert len(failed_attempts) >= 1
    assert alive_at_retry[1:] and max(alive_at_retry) == 0
    assert set(
        Unit.objects.filter(batch=batch)
        .exclude(uid__startswith="bad/")
        .values_list("state", flat=True)
    ) == {"succeeded"}


def test_a_text_of_only_zero_width_characters_or_marks_fails_like_a_whitespace_only_one(
    project, tmp_path, output_root, run_here
):
    root = tmp_path / "texts"
    root.mkdir()
    (root / "invisible.txt").write_text("\u200b\u200c\u2060\x01\n", encoding="utf-8")
    (root / "blank.txt").write_text(" \n\t\n")
    # combining marks and variation selectors alone: the packaged model's
    # tokenizer (all-MiniLM-L6-v2, accents stripped) leaves only [CLS] [SEP]
    (root / "marks.txt").write_text("\u0301\u0301", encoding="utf-8")
    (root / "selector.txt").write_text("\ufe0f", encoding="utf-8")
    (root / "words.txt").write_text("The harbour reopens on Monday.\n")
    (root / "accent.txt").write_text("cafe\u0301 \u2764\ufe0f", encoding="utf-8")
    campaign, _ = setup.campaign_create(
        name="invisible", processor="text-embedding", project=project, input_folder=root
    )
    run_here(campaign)
    units = {u.uid: u for u in campaign.units.all()}
    for uid in ("words.txt", "accent.txt"):
        assert units[uid].state == UnitState.SUCCEEDED, uid
    for uid in ("invisible.txt", "blank.txt", "marks.txt", "selector.txt"):
        assert units[uid].state == UnitState.FAILED, uid
        assert units[uid].error_class == "input_invalid"
        assert units[uid].error_message.endswith("nothing to embed"), units[uid].error_message
        assert not units[uid].output_path
    assert "U+0301" in units["marks.txt"].error_message
    assert "U+FE0F" in units["selector.txt"].error_message


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="cut short"),
        pytest.param(lambda data: data[:-40] + bytes(40), id="bytes changed in place"),
    ],
)
def test_a_shard_the_storage_does_not_keep_as_written_fails_its_units_to_be_redone(
    queued, output_root, damage
):
    """A storage that acknowledges the write and then gives back other bytes:
    no unit counts, none goes to a person's review (the output was never
    wrong, the storage was), and each may be redone once the storage is fixed."""
    from gpuworker.runner import write

    batch = Batch.objects.filter(campaign=queued).order_by("pk").first()
    real_write = write.write_atomic

    def losing_storage(path, data):
        written = real_write(path, data)
        path.write_bytes(damage(data))
        return written

    with mock.patch.object(write, "write_atomic", losing_storage):
        assert run_batch(batch.pk) == "done"
    units = Unit.objects.filter(batch=batch)
    ran = units.exclude(error_class__in=["input_invalid", "input_too_large", "input_empty"])
    assert ran.exists()
    for unit in ran:
        assert (unit.state, unit.error_class) == (UnitState.FAILED, "output_write_error")
        assert "read back is not what was written" in unit.error_message
    assert not ReviewItem.objects.filter(unit__batch=batch).exists()

    # Once the storage keeps what it is given, resume's retry makes them.
    Batch.objects.filter(pk=batch.pk).update(state=Batch.State.QUEUED)
    units.filter(error_class="output_write_error").update(state=UnitState.QUEUED)
    assert run_batch(batch.pk) == "done"
    assert not units.filter(error_class="output_write_error").exists()
    assert units.filter(state=UnitState.SUCCEEDED).count() == ran.count()
