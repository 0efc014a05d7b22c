"""Adoption only of what no record contradicts: an output verify judged damaged,
or one a dead worker left from input bytes that changed since, is recomputed on
resume, never taken back — image files a unit and vector shards a batch alike.
(Training checkpoints: tests/gpuworker/test_checkpoint_adoption.py.)"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from PIL import Image

from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import control, leases, setup, start
from campaigns.specs.builtin import check_image_output
from campaigns.storage.outputs import InvalidOutput
from campaigns.storage.vector_shards import split_member
from campaigns.verify.reconcile import campaign_verify
from gpuworker.runner import pipeline
from gpuworker.runner.batch import run_batch
from tests.conftest import DEMO_GOOD
from tests.vectors import unit_vector

pytestmark = pytest.mark.django_db

RESIZE = {"operation": "resize", "width": 48, "height": 40, "format": "png", "batch_size": 16}


@pytest.fixture
def enqueue(django_capture_on_commit_callbacks):
    """Runs a service with the broker send captured, then every queued batch here."""

    def call(fn, **kwargs):
        with (
            mock.patch.object(start.celery_app, "send_task"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            result = fn(**kwargs)
        campaign = kwargs["campaign"]
        for pk in Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).values_list(
            "pk", flat=True
        ):
            run_batch(pk)
        return result

    return call


def _noise(path: Path, seed: int) -> None:
    rng = random.Random(seed)
    image = Image.frombytes("RGB", (64, 64), bytes(rng.randrange(256) for _ in range(64 * 64 * 3)))
    path.parent.mkdir(parents=True, exist_ok=True)
    image.save(path, format="PNG")


@pytest.fixture
def pictures(tmp_path) -> Path:
    root = tmp_path / "pictures"
    for i in range(3):
        _noise(root / f"pic-{i}.png", seed=i)
    return root


def _campaign(name, project, root, **params):
    campaign, _ = setup.campaign_create(
        name=name,
        processor="image-transform",
        project=project,
        input_folder=root,
        params=params,
        checkpoint_after=0,
    )
    return campaign


def _outputs(campaign, output_root) -> dict[str, bytes]:
    units = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
    return {u.uid: (output_root / u.output_path).read_bytes() for u in units}


def _flip_a_byte_that_still_decodes(path: Path, params: dict) -> None:
    """One byte flipped, same size, in a place where the image still decodes at
    the size asked: a damage only the recorded checksum can see."""
    data = bytearray(path.read_bytes())
    for offset in range(len(data) // 2, len(data)):
        data[offset] ^= 0xFF
        path.write_bytes(bytes(data))
        try:
            check_image_output(path, params, None)
            return
        except (InvalidOutput, OSError):
            data[offset] ^= 0xFF
    raise AssertionError(f"no byte of {path} flips into a decodable image")


def test_an_output_verify_found_damaged_is_recomputed_on_resume_never_adopted(
    project, pictures, output_root, run_here, enqueue
):
    clean = _campaign("clean", project, pictures, **RESIZE)
    run_here(clean)
    campaign = _campaign("flipped", project, pictures, **RESIZE)
    run_here(campaign)
    # given: a byte flipped in the middle of each of the three outputs
    for unit in Unit.objects.filter(campaign=campaign):
        _flip_a_byte_that_still_decodes(
            output_root / unit.output_path, campaign.current_version.params
        )

    # when: a deep verify, then resume
    report = campaign_verify(campaign=campaign, deep=True).as_dict()

    # then: verify calls all three damaged and sets them aside
    assert report["output_incomplete"] == 3 and report["valid"] == 0
    assert all("checksum differs" in s["reason"] for s in report["samples"]["output_incomplete"])
    assert report["damaged_set_aside"] == 3
    aside = sorted(p.name for p in output_root.glob("flipped/*/.damaged/*/*.png"))
    assert len(aside) == 3
    assert "set aside as flipped/" in report["samples"]["output_incomplete"][0]["reason"]

    enqueue(control.campaign_resume, campaign=campaign)

    # and resume recomputed every one: none adopted, all equal to a clean run's
    assert Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).count() == 3
    assert not Attempt.objects.filter(unit__campaign=campaign, metrics__adopted=True).exists()
    deep = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert deep["valid"] == 3 and deep["output_incomplete"] == 0
    assert deep["orphan_outputs"] == 0  # what was set aside is no orphan
    assert _outputs(campaign, output_root) == _outputs(clean, output_root)


def _die_after_writing(batch_id: int) -> None:
    """The batch's worker writes its outputs, then dies before recording them;
    its lease runs out and the sweeper puts the batch back in the queue."""

    def killed(**kwargs):
        raise SystemExit("killed before recording")

    with mock.patch.object(pipeline, "batch_record", killed), pytest.raises(SystemExit):
        run_batch(batch_id)
    batch = Batch.objects.get(pk=batch_id)
    assert batch.state == Batch.State.RUNNING
    Batch.objects.filter(pk=batch_id).update(lease_expires_at=batch.started_at)
    assert leases.batches_requeue_expired(campaign=batch.campaign) == [batch_id]


@pytest.mark.parametrize("rerun", ["retry-failed", "pause-import-resume"])
def test_a_dead_workers_output_of_an_input_changed_since_is_recomputed(
    rerun, project, pictures, tmp_path, output_root, enqueue, django_capture_on_commit_callbacks
):
    campaign = _campaign("changing", project, pictures, **RESIZE)
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    (batch,) = Batch.objects.filter(campaign=campaign)
    # given: the worker wrote all three outputs and died before recording them
    _die_after_writing(batch.pk)
    written = sorted(output_root.glob("changing/*/*/*.png"))
    assert len(written) == 3
    # and then one input changed under its unrecorded output
    _noise(pictures / "pic-1.png", seed=99)

    # when: the unit runs again, as the failure message or the page recommends
    if rerun == "retry-failed":
        run_batch(batch.pk)  # the batch again: its input changed, the unit fails so
        changed = Unit.objects.get(campaign=campaign, uid="pic-1.png")
        assert changed.error_class == "input_changed"
        enqueue(control.campaign_resume, campaign=campaign, retry_failed=True)
    else:
        with django_capture_on_commit_callbacks(execute=True):
            control.campaign_pause(campaign=campaign)
        setup.campaign_import(campaign=campaign)
        enqueue(control.campaign_resume, campaign=campaign)

    # then: the changed input's output is its new transform, and deep verify agrees
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert all(u.state == UnitState.SUCCEEDED for u in units.values()), units
    latest = Attempt.objects.filter(unit=units["pic-1.png"]).order_by("-finished_at").first()
    assert latest.metrics.get("adopted") is not True
    assert latest.input_sha256 == units["pic-1.png"].sha256
    fresh = tmp_path / "fresh"
    shutil.copytree(pictures, fresh)
    clean = _campaign("clean", project, fresh, **RESIZE)
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=clean)
    for pk in Batch.objects.filter(campaign=clean).values_list("pk", flat=True):
        run_batch(pk)
    assert _outputs(campaign, output_root) == _outputs(clean, output_root)
    deep = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert deep["valid"] == 3 and deep["output_incomplete"] == 0


def test_a_redelivered_batch_adopts_only_what_its_dead_claim_wrote_and_vouched_for(
    project, pictures, output_root
):
    campaign = _campaign("vouched", project, pictures, **RESIZE)
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    (batch,) = Batch.objects.filter(campaign=campaign)
    _die_after_writing(batch.pk)
    first, second, third = sorted(output_root.glob("vouched/*/*/*.png"))
    # given: one output damaged since, one replaced by a whole other image
    _flip_a_byte_that_still_decodes(first, campaign.current_version.params)
    shutil.copyfile(third, second)

    run_batch(batch.pk)

    # then: only the third, as its claim wrote it, is adopted; the others are made again
    attempts = Attempt.objects.filter(batch=batch, outcome="succeeded")
    assert attempts.count() == 3
    assert attempts.filter(metrics__adopted=True).count() == 1
    assert campaign_verify(campaign=campaign, deep=True).as_dict()["valid"] == 3
    # the batch is recorded: its lease record vouches for nothing any more
    assert not list(output_root.glob("vouched/*/.leases/*"))


# --- vector shards --------------------------------------------------------------------


def _vectors(campaign, output_root) -> dict[str, np.ndarray]:
    units = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
    return {u.uid: unit_vector(output_root, u.output_path) for u in units}


def test_a_shard_verify_found_damaged_is_set_aside_and_its_rows_recomputed(
    make_campaign, output_root, run_here, enqueue
):
    clean = make_campaign("clean", batch_size=8)
    run_here(clean)
    campaign = make_campaign("flipped", batch_size=8)
    run_here(campaign)
    unit = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).first()
    shard = output_root / split_member(unit.output_path)[0]
    hit = set(
        Unit.objects.filter(
            campaign=campaign, output_path__startswith=split_member(unit.output_path)[0] + "#"
        ).values_list("uid", flat=True)
    )
    # given: one byte flipped in the middle of a shard, same size
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))

    report = campaign_verify(campaign=campaign, deep=True).as_dict()

    assert report["output_incomplete"] == len(hit)
    assert report["damaged_set_aside"] == 1
    assert not shard.exists()
    assert list(output_root.glob(f"flipped/*/.damaged/shards/*/{shard.name}"))

    enqueue(control.campaign_resume, campaign=campaign)

    assert not Attempt.objects.filter(unit__campaign=campaign, metrics__adopted=True).exists()
    deep = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert deep["valid"] == DEMO_GOOD and deep["output_incomplete"] == 0
    assert deep["orphan_outputs"] == 0
    mine, theirs = _vectors(campaign, output_root), _vectors(clean, output_root)
    assert mine.keys() == theirs.keys()
    for uid in mine:
        np.testing.assert_allclose(mine[uid], theirs[uid], atol=1e-5)


@pytest.mark.parametrize("rerun", ["retry-failed", "pause-import-resume"])
def test_a_dead_workers_shard_row_of_an_input_changed_since_is_recomputed(
    rerun, make_campaign, corpus, output_root, enqueue, django_capture_on_commit_callbacks
):
    campaign = make_campaign("changing", batch_size=50)
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    (batch,) = Batch.objects.filter(campaign=campaign)
    _die_after_writing(batch.pk)
    (old,) = output_root.glob("changing/*/shards/*/*.npz")
    unit = Unit.objects.get(campaign=campaign, uid="recipes/bread.txt")
    (corpus / unit.source_path).write_text("Sourdough needs a starter fed the day before.\n")

    if rerun == "retry-failed":
        run_batch(batch.pk)
        unit.refresh_from_db()
        assert unit.error_class == "input_changed"
        enqueue(control.campaign_resume, campaign=campaign, retry_failed=True)
    else:
        with django_capture_on_commit_callbacks(execute=True):
            control.campaign_pause(campaign=campaign)
        setup.campaign_import(campaign=campaign)
        enqueue(control.campaign_resume, campaign=campaign)

    unit.refresh_from_db()
    assert unit.state == UnitState.SUCCEEDED
    assert split_member(unit.output_path)[0] != str(old.relative_to(output_root))
    latest = Attempt.objects.filter(unit=unit).order_by("-finished_at").first()
    assert latest.metrics.get("adopted") is not True and latest.input_sha256 == unit.sha256
    clean = make_campaign("clean", batch_size=50)
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=clean)
    for pk in Batch.objects.filter(campaign=clean).values_list("pk", flat=True):
        run_batch(pk)
    fresh = Unit.objects.get(campaign=clean, uid=unit.uid)
    np.testing.assert_allclose(
        unit_vector(output_root, unit.output_path),
        unit_vector(output_root, fresh.output_path),
        atol=1e-5,
    )
    assert campaign_verify(campaign=campaign, deep=True).as_dict()["valid"] == DEMO_GOOD


def test_verify_removes_the_lease_records_of_finished_batches_and_reports_no_orphan(
    project, pictures, output_root, run_here
):
    from campaigns.storage.paths import lease_record_relpath

    campaign = _campaign("recorded", project, pictures, **RESIZE)
    run_here(campaign)
    (batch,) = Batch.objects.filter(campaign=campaign)
    # given: a record its worker could not remove after recording the batch
    left = output_root / lease_record_relpath(
        campaign=campaign.name,
        version_label=campaign.current_version.label,
        batch_id=batch.pk,
        token="f" * 32,
    )
    left.parent.mkdir(parents=True, exist_ok=True)
    left.write_text(json.dumps({"batch": batch.pk, "token": "f", "outputs": {}}))

    report = campaign_verify(campaign=campaign).as_dict()

    assert not left.exists()
    assert report["stale_temp_files_removed"] == 1
    assert report["orphan_outputs"] == 0 and report["valid"] == 3


def test_verify_goes_on_past_names_in_the_leases_folder_no_claim_wrote(
    project, pictures, output_root, run_here
):
    from campaigns.storage.paths import lease_folder

    campaign = _campaign("odd-leases", project, pictures, **RESIZE)
    run_here(campaign)
    leases = output_root / lease_folder(
        campaign=campaign.name, version_label=campaign.current_version.label
    )
    # given: a folder named like a record, and names int() refuses or misreads
    (leases / "b1-folder.json").mkdir(parents=True)
    for name in ("b" + "9" * 5000 + "-x.json", "b²-x.json", "b٣-x.json"):
        (leases / name[:200]).write_text("{}")

    report = campaign_verify(campaign=campaign).as_dict()

    assert report["valid"] == 3
    assert (leases / "b1-folder.json").is_dir()
