"""A new parameter version processes the whole corpus, through its own
checkpoint; every version keeps a complete matrix, downloadable from the page
and comparable with another over every unit both made."""

from __future__ import annotations

import csv
import io
import json
from unittest import mock

import numpy as np
import pytest
from django.core.management import call_command
from django.urls import reverse

from campaigns.exports.inventory import export
from campaigns.models import Attempt, Batch, Checkpoint, Unit, UnitState
from campaigns.review import compare
from campaigns.review.queue import checkpoint_decide
from campaigns.runs import setup, start, versions
from tests.gpuworker.test_image_classification import (  # noqa: F401 (fixtures)
    classifier_params,
    shapes,
    user_model,
)


def started_without_checkpoint(campaign):
    """The campaign started with no checkpoint to stop at, its batches queued, none sent."""
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    return campaign


def _finish(campaign, run_here, owner):
    """Run the current version to the end, passing its checkpoint."""
    run_here(campaign)
    checkpoint = Checkpoint.objects.get(campaign=campaign, version=campaign.current_version)
    assert checkpoint.state == Checkpoint.State.PENDING
    checkpoint_decide(checkpoint=checkpoint, passed=True, user=owner)
    run_here(campaign)
    assert not Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).exists()
    return checkpoint


def _valid_units(campaign) -> set[str]:
    return set(
        Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).values_list(
            "uid", flat=True
        )
    )


@pytest.mark.django_db
def test_a_new_version_processes_the_whole_corpus_through_its_own_checkpoint(
    make_campaign, output_root, run_here, owner, tmp_path
):
    campaign = make_campaign("whole", batch_size=4)
    campaign.checkpoint_after = 6
    campaign.save(update_fields=["checkpoint_after"])
    _finish(campaign, run_here, owner)
    first = campaign.current_version
    done_v1 = _valid_units(campaign)
    assert len(done_v1) > 20

    second = setup.version_create(campaign=campaign, params={**first.params, "pooling": "cls"})
    campaign.refresh_from_db()
    # Every unit v1 made is to do again under v2, not only the holdout.
    pending = set(
        Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).values_list(
            "uid", flat=True
        )
    )
    assert pending == done_v1

    run_here(campaign)
    checkpoint = Checkpoint.objects.get(campaign=campaign, version=second)
    # Its own checkpoint, on a sample of what v2 processed.
    assert checkpoint.state == Checkpoint.State.PENDING
    assert checkpoint.sample
    sampled = Unit.objects.filter(pk__in=checkpoint.sample)
    assert all(u.batch.version_id == second.pk for u in sampled)
    held = start.pending_held(campaign=campaign)
    assert held is not None and held.checkpoint_version == second.number

    checkpoint_decide(checkpoint=checkpoint, passed=True, user=owner)
    run_here(campaign)
    assert _valid_units(campaign) == done_v1
    assert all(
        f"/{second.label}/" in path
        for path in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).values_list(
            "output_path", flat=True
        )
    )

    progress = {p.version.number: p for p in versions.version_progress(campaign=campaign)}
    assert progress[1].valid == progress[2].valid == len(done_v1)
    assert progress[2].current and not progress[1].current

    # One complete matrix per version, the earlier one's outputs kept.
    folder = tmp_path / "export"
    export(campaign, folder)
    for version in (first, second):
        matrix = np.load(folder / f"vectors-{version.label}.npy")
        assert matrix.shape == (len(done_v1), 384)
        assert np.isfinite(matrix).all()
        with open(folder / f"vectors-{version.label}.csv") as f:
            assert {row["id"] for row in csv.DictReader(f)} == done_v1


@pytest.mark.django_db
def test_a_batch_of_the_old_version_finishing_after_the_switch_is_kept_and_redone(
    make_campaign, output_root, run_here
):
    campaign = started_without_checkpoint(make_campaign("switch", batch_size=4))
    first = campaign.current_version
    from gpuworker.runner import pipeline
    from gpuworker.runner.batch import run_batch

    switched = {}
    original = pipeline.BatchRun.finish

    def finish_after_a_switch(self):
        # The parameters change while this batch's model runs.
        if not switched:
            switched["v"] = setup.version_create(
                campaign=campaign, params={**first.params, "pooling": "cls"}
            )
        return original(self)

    running = Batch.objects.filter(campaign=campaign).order_by("pk").first()
    with mock.patch.object(pipeline.BatchRun, "finish", finish_after_a_switch):
        run_batch(running.pk)
    second = switched["v"]
    # The other queued batches of v1 were taken back.
    assert not Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).exists()
    # The batch that ran keeps its v1 outputs (its attempts), and its units are v2's to do.
    made = Attempt.objects.filter(batch=running, outcome=Attempt.Outcome.SUCCEEDED)
    assert made.exists()
    assert set(Unit.objects.filter(attempts__in=made).values_list("state", flat=True)) == {
        UnitState.PENDING
    }
    assert versions.outputs_count(campaign=campaign, version=first) == made.count()
    campaign.refresh_from_db()
    run_here(campaign)
    valid = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
    assert valid.exists()
    assert all(f"/{second.label}/" in p for p in valid.values_list("output_path", flat=True))


@pytest.mark.django_db
def test_each_version_downloads_and_compares_from_the_page_and_the_cli(
    make_campaign, output_root, run_here, client, owner, tmp_path
):
    campaign = make_campaign("matrix", batch_size=4)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    first = campaign.current_version
    second = setup.version_create(campaign=campaign, params={**first.params, "pooling": "cls"})
    campaign.refresh_from_db()
    run_here(campaign)
    done = _valid_units(campaign)
    client.force_login(owner)

    page = client.get(reverse("campaign_versions", args=[campaign.name]))
    assert page.status_code == 200
    body = page.content.decode()
    assert f'data-valid="{len(done)}"' in body
    assert first.label in body and f"{second.label} (current)" in body
    for version in (first, second):
        response = client.get(
            reverse("version_download", args=[campaign.name, version.number, "vectors.npy"])
        )
        assert response.status_code == 200
        matrix = np.load(io.BytesIO(b"".join(response.streaming_content)))
        assert matrix.shape == (len(done), 384) and np.isfinite(matrix).all()
        names = client.get(
            reverse("version_download", args=[campaign.name, version.number, "rows.csv"])
        )
        rows = list(csv.DictReader(io.StringIO(b"".join(names.streaming_content).decode())))
        assert [r["id"] for r in rows] == sorted(
            done, key=lambda uid: Unit.objects.get(campaign=campaign, uid=uid).pk
        )
    # The matrix of v1 equals what export writes for it.
    export(campaign, tmp_path / "export")
    exported = np.load(tmp_path / "export" / f"vectors-{first.label}.npy")
    response = client.get(reverse("version_download", args=[campaign.name, 1, "vectors.npy"]))
    assert np.array_equal(np.load(io.BytesIO(b"".join(response.streaming_content))), exported)

    compared = client.get(reverse("campaign_versions", args=[campaign.name]), {"a": 1, "b": 2})
    assert compared.status_code == 200
    text = compared.content.decode()
    assert f"{first.label} against {second.label}" in text
    assert f"{len(done)} units with a valid output under both" in text
    assert "data-mean-cosine" in text

    out = io.StringIO()
    call_command("campaign", "compare", campaign.name, "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["both"] == report["compared"] == len(done)
    assert 0 < report["mean_cosine"] < 1  # mean and cls pooling differ, but not by everything
    out = io.StringIO()
    call_command("campaign", "versions", campaign.name, stdout=out)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith(f"{second.label} (current): {len(done)} of")
    assert lines[1].startswith(f"{first.label}: {len(done)} of")


@pytest.mark.django_db
def test_an_unreadable_output_is_a_nan_row_and_the_rest_goes_on(
    make_campaign, output_root, run_here, client, owner
):
    campaign = make_campaign("damaged", batch_size=4)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    first = campaign.current_version
    setup.version_create(campaign=campaign, params={**first.params, "pooling": "cls"})
    # v1's outputs now live only in their attempts: lose one of its shards.
    shard = sorted((output_root / campaign.name / first.label).rglob("*.npz"))[0]
    shard.unlink()
    client.force_login(owner)
    response = client.get(reverse("version_download", args=[campaign.name, 1, "vectors.npy"]))
    matrix = np.load(io.BytesIO(b"".join(response.streaming_content)))
    lost = np.isnan(matrix).all(axis=1)
    assert 0 < lost.sum() < len(matrix)
    assert np.isfinite(matrix[~lost]).all()


@pytest.mark.django_db
def test_a_version_made_current_again_takes_back_its_own_outputs(
    make_campaign, output_root, run_here
):
    campaign = make_campaign("back", batch_size=4)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    first = campaign.current_version
    done = _valid_units(campaign)
    setup.version_create(campaign=campaign, params={**first.params, "pooling": "cls"})
    campaign.refresh_from_db()
    run_here(campaign)
    batches = Batch.objects.filter(campaign=campaign).count()

    again = setup.version_create(campaign=campaign, params=first.params)
    assert again.pk == first.pk
    campaign.refresh_from_db()
    # v1's outputs are still valid: nothing to make again.
    assert not Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).exists()
    assert _valid_units(campaign) == done
    assert all(
        f"/{first.label}/" in path
        for path in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).values_list(
            "output_path", flat=True
        )
    )
    run_here(campaign)
    assert Batch.objects.filter(campaign=campaign).count() == batches
    assert versions.outputs_count(campaign=campaign, version=first) == len(done)


@pytest.mark.django_db
def test_a_run_being_planned_stops_when_the_version_changes(make_campaign, monkeypatch):
    campaign = make_campaign("planning", batch_size=2)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    first = campaign.current_version
    monkeypatch.setattr(start, "FIRST_SLICE_UNITS", 4)
    monkeypatch.setattr(start, "RUN_SLICE_UNITS", 4)
    plan = start._plan_and_send
    slices = []

    def plan_then_switch(**kwargs):
        sent = plan(**kwargs)
        if not slices:  # the parameters change after the first slice went out
            setup.version_create(campaign=campaign, params={**first.params, "pooling": "cls"})
        slices.append(sent)
        return sent

    monkeypatch.setattr(start, "_plan_and_send", plan_then_switch)
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    assert len(slices) == 1
    # The first slice's batches were taken back; nothing of v1 waits to run.
    assert not Batch.objects.filter(
        campaign=campaign, version=first, state=Batch.State.QUEUED
    ).exists()


@pytest.mark.django_db
def test_resume_after_a_failed_checkpoint_says_why_instead_of_failing(make_campaign, client, owner):
    from tests.conftest import waiting_at_checkpoint

    campaign = make_campaign("failed-checkpoint")
    checkpoint = waiting_at_checkpoint(campaign)
    checkpoint_decide(checkpoint=checkpoint, passed=False, user=owner, reason="blurred outputs")
    client.force_login(owner)
    response = client.post(reverse("campaign_resume", args=[campaign.name]), follow=True)
    assert response.status_code == 200
    text = response.content.decode()
    assert "Nothing resumed: checkpoint failed: blurred outputs" in text


@pytest.mark.django_db
def test_run_wait_names_a_pause(make_campaign):
    from campaigns.management.commands.campaign import Command
    from campaigns.runs import control

    campaign = make_campaign("paused-wait")
    control.campaign_pause(campaign=campaign)
    campaign.refresh_from_db()
    out = io.StringIO()
    # What `run --wait` prints once nothing is queued or running.
    Command(stdout=out, stderr=io.StringIO())._wait(campaign, timeout=None)
    assert "stopped: Paused: since" in out.getvalue()
    assert "held by review" not in out.getvalue()


def test_a_classifiers_versions_compare_their_top_labels_unit_by_unit(
    user_model,  # noqa: F811 (the imported fixture)
    shapes,  # noqa: F811 (the imported fixture)
    project,
    output_root,
    run_here,
    tmp_path,
    client,
    owner,
):
    # given: v1 names the tiny model's classes circle, square, triangle; v2 is the
    # same model with square and triangle swapped in its labels file, so a unit
    # keeps its top label under v2 exactly when v1 called it a circle
    campaign, _ = setup.campaign_create(
        name="shapes",
        processor="image-classification",
        project=project,
        input_folder=shapes,
        params=classifier_params(user_model, batch_size=8, top_k=3),
        holdout_share=0,
    )
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    first = campaign.current_version
    top_v1 = {}
    for uid, path in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).values_list(
        "uid", "output_path"
    ):
        with np.load(output_root / path) as data:
            top_v1[uid] = str(data["top_labels"][0])
    swapped = tmp_path / "swapped.txt"
    swapped.write_text("circle\ntriangle\nsquare\n")
    second = setup.version_create(
        campaign=campaign, params={**first.params, "labels": str(swapped)}
    )
    campaign.refresh_from_db()
    run_here(campaign)
    assert _valid_units(campaign) == set(top_v1)
    kept = sum(label == "circle" for label in top_v1.values())
    moved = {
        ("square", "triangle"): sum(label == "square" for label in top_v1.values()),
        ("triangle", "square"): sum(label == "triangle" for label in top_v1.values()),
    }
    assert 0 < kept < len(top_v1) and all(moved.values())  # the model tells the shapes apart

    # when
    report = compare.compare_versions(campaign=campaign, a=first, b=second)

    # then: every unit compared, the features unchanged, the labels agree on the circles
    assert report["kind"] == "features"
    assert report["both"] == report["compared"] == report["labelled"] == len(top_v1) == 30
    assert report["label_agreement"] == kept / len(top_v1)
    assert {(c["from"], c["to"]): c["units"] for c in report["label_changes"]} == moved
    assert report["mean_cosine"] == pytest.approx(1.0)
    # and the versions page says so
    client.force_login(owner)
    page = client.get(reverse("campaign_versions", args=[campaign.name]), {"a": 1, "b": 2})
    agreement = f"{kept / len(top_v1):.3f}"
    assert f"<strong data-label-agreement>{agreement}</strong> of 30 units" in page.content.decode()


@pytest.mark.django_db
def test_the_page_compares_a_sample_spread_over_the_corpus_beyond_its_limit(
    make_campaign, output_root, run_here, client, owner, monkeypatch
):
    from campaigns.review.compare import compare_versions
    from campaigns.web import version_views

    campaign = make_campaign("sampled", batch_size=4)
    campaign.checkpoint_after = 0
    campaign.save(update_fields=["checkpoint_after"])
    run_here(campaign)
    first = campaign.current_version
    second = setup.version_create(campaign=campaign, params={**first.params, "pooling": "cls"})
    campaign.refresh_from_db()
    run_here(campaign)
    done = len(_valid_units(campaign))

    whole = compare_versions(campaign=campaign, a=first, b=second)
    assert whole["both"] == done and whole["every"] == 1
    sample = compare_versions(campaign=campaign, a=first, b=second, at_most=5)
    assert sample["every"] > 1 and 0 < sample["both"] < done
    pks = Unit.objects.filter(campaign=campaign, uid__in=[r["unit"] for r in sample["lowest"]])
    assert all(pk % sample["every"] == 0 for pk in pks.values_list("pk", flat=True))

    monkeypatch.setattr(version_views, "PAGE_COMPARE_UNITS", 5)
    client.force_login(owner)
    page = client.get(reverse("campaign_versions", args=[campaign.name]), {"a": 1, "b": 2})
    assert f"a sample: one unit in {sample['every']} by id" in page.content.decode()
    assert f"campaign compare {campaign.name} 1 2 compares every unit" in page.content.decode()
