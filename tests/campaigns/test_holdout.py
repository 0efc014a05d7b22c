"""The holdout: chosen by hash, kept out of profiling, and scored at the end."""

from __future__ import annotations

import csv
import random
from pathlib import Path

import pytest
from django.urls import reverse

from campaigns.models import Attempt, Checkpoint, Unit, UnitState
from campaigns.profiles.sample import sample_build
from campaigns.review import queue as review
from campaigns.review.holdout import holdout_report, is_holdout
from campaigns.runs import setup
from tests.gpuworker.test_image_classification import (  # noqa: F401 (user_model: a fixture)
    CLASSES,
    classifier_params,
    shape_image,
    user_model,
)
from tests.vectors import output_file

WORDS = [
    "river",
    "stone",
    "lantern",
    "orchard",
    "copper",
    "meadow",
    "violin",
    "harbour",
    "pepper",
    "glacier",
    "saddle",
    "comet",
    "ledger",
    "thimble",
    "walnut",
    "falcon",
]


def _texts(folder: Path, count: int) -> Path:
    """Short, distinct texts: enough units that some are held out."""
    rng = random.Random(7)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
        (folder / f"t{i:04d}.txt").write_text(f"Note {i}: {words}.\n", encoding="utf-8")
    return folder


def _holdout_only(campaign, pks) -> None:
    """Exactly these units held out, whatever the hash chose at import."""
    Unit.objects.filter(campaign=campaign).update(holdout=False)
    Unit.objects.filter(pk__in=pks).update(holdout=True)


# --- the choice ------------------------------------------------------------------


def test_is_holdout_is_deterministic_and_about_the_share():
    ids = [f"doc-{i}/page-{i * 7 % 13}.txt" for i in range(20_000)]
    first = [is_holdout(uid, 0.05) for uid in ids]
    assert first == [is_holdout(uid, 0.05) for uid in ids]
    assert 0.04 <= sum(first) / len(ids) <= 0.06
    assert not any(is_holdout(uid, 0) for uid in ids)
    assert all(is_holdout(uid, 1.0) for uid in ids[:100])
    # A larger share keeps what a smaller one held out: raising it adds units.
    assert all(is_holdout(uid, 0.1) for uid, held in zip(ids, first, strict=True) if held)


@pytest.mark.django_db
def test_import_marks_exactly_the_hashed_holdout(project, tmp_path):
    campaign, report = setup.campaign_create(
        name="notes",
        processor="text-embedding",
        project=project,
        input_folder=_texts(tmp_path / "notes", 200),
    )
    assert report.created == 200
    assert campaign.holdout_share == 0.05
    units = dict(Unit.objects.filter(campaign=campaign).values_list("uid", "holdout"))
    expected = {uid for uid in units if is_holdout(uid, 0.05)}
    assert expected, "the ids chosen here should hold some units out"
    assert {uid for uid, held in units.items() if held} == expected


@pytest.mark.django_db
def test_the_holdout_never_enters_a_profiling_sample(project, tmp_path):
    campaign, _ = setup.campaign_create(
        name="profiled",
        processor="text-embedding",
        project=project,
        input_folder=_texts(tmp_path / "profiled", 300),
    )
    held = set(Unit.objects.filter(campaign=campaign, holdout=True).values_list("pk", flat=True))
    assert held
    # Asking for more than there are: every non-holdout unit, and still no holdout one.
    sample, heaviest = sample_build(campaign=campaign, size=1000, heavy=20)
    assert len(sample) == 300 - len(held)
    assert not held & set(sample)
    assert not held & set(heaviest)


# --- embeddings: stability against the previous version ------------------------------


@pytest.mark.django_db
def test_embedding_stability_against_the_previous_version(
    make_campaign, output_root, run_here, client, owner
):
    campaign = make_campaign("stable", batch_size=8)
    run_here(campaign)
    chosen = list(
        Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
        .order_by("uid")
        .values_list("pk", flat=True)[:6]
    )
    _holdout_only(campaign, chosen)

    report = holdout_report(campaign=campaign)
    assert report["units"] == 6 and report["processed"] == 6
    assert report["stability"] is None
    assert "no earlier parameter version to compare" in report["notes"]

    first = campaign.current_version
    first_outputs = [
        output_file(output_root, path)
        for path in Unit.objects.filter(pk__in=chosen).values_list("output_path", flat=True)
    ]
    second = setup.version_create(campaign=campaign, params={**first.params, "pooling": "cls"})
    assert second.number == first.number + 1
    # A new version puts every unit it did not make back to pending (the
    # holdout with them, in its first group); the outputs of the first stay,
    # in their version's folder, for the comparison.
    pending = set(
        Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).values_list("pk", flat=True)
    )
    assert set(chosen) <= pending
    assert not Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).exists()
    assert all(path.is_file() and f"/{first.label}/" in str(path) for path in first_outputs)
    campaign.refresh_from_db()
    run_here(campaign)

    both = set(
        Attempt.objects.filter(
            unit__in=chosen, version=second, outcome=Attempt.Outcome.SUCCEEDED
        ).values_list("unit__uid", flat=True)
    )
    assert len(both) == 6
    report = holdout_report(campaign=campaign)
    assert report["version"] == second.label
    assert report["processed"] == 6
    stability = report["stability"]
    assert stability["previous_version"] == first.label
    assert stability["compared"] == len(both)
    # Mean pooling and the CLS token give related but different vectors.
    assert stability["mean_cosine"] < 1.0
    assert -1.0 <= stability["worst_cosine"] <= stability["mean_cosine"]
    assert stability["worst_unit"] in both

    # The second version's checkpoint opened once its holdout ran, and kept the report;
    # the campaign had nothing else to run, so the end was kept as well.
    checkpoint = Checkpoint.objects.get(campaign=campaign, version=second)
    assert set(checkpoint.holdout_snapshots) == {"opened", "finished"}
    opened = checkpoint.holdout_snapshots["opened"]
    assert opened["version"] == second.label
    assert opened["stability"]["compared"] == 6
    assert opened["stability"]["mean_cosine"] == pytest.approx(stability["mean_cosine"])
    review.checkpoint_decide(checkpoint=checkpoint, passed=True, user=owner)
    checkpoint.refresh_from_db()
    assert checkpoint.holdout_snapshots["decided"]["stability"]["compared"] == 6

    # Each checkpoint page shows its own version's report, not the current one's.
    client.force_login(owner)
    page = client.get(reverse("checkpoint_detail", args=[checkpoint.pk])).content.decode()
    assert f"processed under {second.label}" in page and "data-holdout-cosine" in page
    assert 'data-snapshot="opened"' in page and 'data-snapshot="decided"' in page
    earlier = Checkpoint.objects.get(campaign=campaign, version=first)
    page = client.get(reverse("checkpoint_detail", args=[earlier.pk])).content.decode()
    assert f"processed under {first.label}" in page
    assert "no earlier parameter version to compare" in page and "data-holdout-cosine" not in page


@pytest.mark.django_db
def test_another_processor_gets_counts_only(project, tmp_path):
    folder = tmp_path / "pictures"
    folder.mkdir()
    rng = random.Random(3)
    for i in range(4):
        shape_image(CLASSES[i % 3], rng).save(folder / f"{i}.png")
    campaign, _ = setup.campaign_create(
        name="thumbs", processor="image-transform", project=project, input_folder=folder
    )
    Unit.objects.filter(campaign=campaign).update(holdout=True)
    report = holdout_report(campaign=campaign)
    assert report["units"] == 4 and report["processed"] == 0
    assert "stability" not in report and "accuracy" not in report
    assert any("counted, not scored" in note for note in report["notes"])


# --- labelled classification: accuracy and confusion ---------------------------------


def _classification_params(trained: tuple[Path, Path]) -> dict:
    return classifier_params(trained, batch_size=8)


@pytest.mark.django_db
def test_labelled_classification_reports_accuracy_and_confusion(
    user_model,  # noqa: F811 (the imported fixture)
    project,
    output_root,
    tmp_path,
    run_here,
):
    root = tmp_path / "labelled"
    root.mkdir()
    rng = random.Random(11)
    manifest = root / "manifest.csv"
    with manifest.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "path", "category"])
        for i in range(30):
            kind = CLASSES[i % 3]
            shape_image(kind, rng).save(root / f"img{i:02d}.png")
            writer.writerow([f"img-{i:02d}", f"img{i:02d}.png", kind])
    campaign, report = setup.campaign_create(
        name="labelled",
        processor="image-classification",
        project=project,
        manifest=manifest,
        params=_classification_params(user_model),
    )
    assert report.created == 30
    # img-00 … img-09: every class, so the confusion table has three rows.
    chosen = list(
        Unit.objects.filter(campaign=campaign).order_by("uid").values_list("pk", flat=True)[:10]
    )
    _holdout_only(campaign, chosen)
    run_here(campaign)

    report = holdout_report(campaign=campaign)
    assert report["units"] == 10
    assert report["processed"] == 10
    assert report["labelled"] == 10
    assert report["accuracy"] >= 0.7, report
    confusion = report["confusion"]
    assert set(confusion) == set(CLASSES)
    assert sum(n for row in confusion.values() for n in row.values()) == report["labelled"]
    diagonal = sum(row.get(label, 0) for label, row in confusion.items())
    assert diagonal / report["labelled"] == report["accuracy"]


@pytest.mark.django_db
def test_unlabelled_classification_has_no_accuracy(
    user_model,  # noqa: F811 (the imported fixture)
    project,
    output_root,
    tmp_path,
    run_here,
):
    folder = tmp_path / "unlabelled"
    folder.mkdir()
    rng = random.Random(5)
    for i in range(4):
        shape_image(CLASSES[i % 3], rng).save(folder / f"{i}.png")
    campaign, _ = setup.campaign_create(
        name="unlabelled",
        processor="image-classification",
        project=project,
        input_folder=folder,
        params=_classification_params(user_model),
    )
    Unit.objects.filter(campaign=campaign).update(holdout=True)
    run_here(campaign)
    report = holdout_report(campaign=campaign)
    assert report["processed"] == 4
    assert report["accuracy"] is None and report["labelled"] == 0
    assert any("carries a label" in note for note in report["notes"])


@pytest.mark.django_db
def test_folders_named_as_labels_are_the_truth_and_other_folders_are_not_scored(
    user_model,  # noqa: F811 (the imported fixture)
    project,
    output_root,
    tmp_path,
    run_here,
):
    # given: a folder import, one folder per class, and a folder that is no class
    root = tmp_path / "sorted"
    rng = random.Random(3)
    for kind in [*CLASSES, "scans-2024"]:
        (root / kind).mkdir(parents=True)
        for i in range(4):
            shape = kind if kind in CLASSES else CLASSES[i % 3]
            shape_image(shape, rng).save(root / kind / f"{i}.png")
    campaign, _ = setup.campaign_create(
        name="sorted",
        processor="image-classification",
        project=project,
        input_folder=root,
        params=_classification_params(user_model),
    )
    Unit.objects.filter(campaign=campaign).update(holdout=True)

    # when
    run_here(campaign)

    # then: the class folders are scored against their names, the other is not
    report = holdout_report(campaign=campaign)
    assert report["processed"] == 16
    assert report["labelled"] == 12
    assert set(report["confusion"]) == set(CLASSES)
    assert any("4 holdout unit(s) have a category that is not one" in n for n in report["notes"])
