"""Flag rules applied by the worker, and the checkpoint that stops a campaign."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from django.core.exceptions import ValidationError
from PIL import Image, ImageDraw

from campaigns import review, selectors, services
from campaigns.models import Checkpoint, ReviewItem, Unit, UnitState
from tests.gpuworker.test_image_classification import (
    CLASSES,
    COLOURS,
    SIZE,
    TinyCNN,
    _tensor,
    classifier_params,
    shape_image,
)


def _ambiguous(rng: random.Random, first: str, second: str) -> Image.Image:
    """Two equal blocks in two classes' colours: as much one category as the other."""
    background = tuple(rng.randint(0, 90) for _ in range(3))
    image = Image.new("RGB", (SIZE, SIZE), background)
    draw = ImageDraw.Draw(image)
    top, height = rng.randint(4, 24), rng.randint(12, 20)
    draw.rectangle((6, top, 23, top + height), fill=COLOURS[first])
    draw.rectangle((24, top, 41, top + height), fill=COLOURS[second])
    return image


@pytest.fixture(scope="module")
def calibrated_model(tmp_path_factory):
    """A tiny CNN that learnt two-shape images are half one class, half the other
    (soft labels): on such inputs it answers close to both, as a good model should."""
    torch.manual_seed(0)
    rng = random.Random(0)
    model = TinyCNN()
    optimiser = torch.optim.Adam(model.parameters(), lr=0.01)
    for _step in range(200):
        images, targets = [], []
        for _ in range(32):
            first = rng.randrange(3)
            target = torch.zeros(3)
            if rng.random() < 0.4:
                second = (first + rng.randrange(1, 3)) % 3
                images.append(_ambiguous(rng, CLASSES[first], CLASSES[second]))
                target[first] = target[second] = 0.5
            else:
                images.append(shape_image(CLASSES[first], rng))
                target[first] = 1.0
            targets.append(target)
        x = torch.from_numpy(np.stack([_tensor(image) for image in images]))
        loss = torch.nn.functional.cross_entropy(model(x)[0], torch.stack(targets))
        optimiser.zero_grad()
        loss.backward()
        optimiser.step()
    folder = tmp_path_factory.mktemp("calibrated")
    torch.jit.script(model.eval()).save(str(folder / "tiny.pt"))
    (folder / "labels.txt").write_text("\n".join(CLASSES) + "\n")
    return folder / "tiny.pt", folder / "labels.txt"


@pytest.fixture
def shapes_folder(tmp_path):
    rng = random.Random(7)
    root = tmp_path / "shapes"
    (root / "clear").mkdir(parents=True)
    (root / "ambiguous").mkdir()
    for i in range(12):
        kind = CLASSES[i % 3]
        shape_image(kind, rng).save(root / "clear" / f"{kind}-{i}.png")
    pairs = [("circle", "square"), ("square", "triangle"), ("circle", "triangle")]
    for i in range(6):
        first, second = pairs[i % 3]
        _ambiguous(rng, first, second).save(root / "ambiguous" / f"{first}-{second}-{i}.png")
    return root


def test_ambiguous_images_are_flagged_close_to_several_categories_and_clear_ones_are_not(
    project,
    shapes_folder,
    calibrated_model,
    output_root,
    run_here,
):
    campaign, _ = services.campaign_create(
        name="shapes",
        processor="image-classification",
        project=project,
        input_folder=shapes_folder,
        params=classifier_params(calibrated_model, flag_min_margin=0.3, flag_min_confidence=0.6),
    )
    run_here(campaign)

    flagged = set(
        ReviewItem.objects.filter(campaign=campaign, source="rule").values_list(
            "unit__uid", flat=True
        )
    )
    ambiguous = {u for u in campaign.units.values_list("uid", flat=True) if "ambiguous" in u}
    assert flagged == ambiguous
    reasons = set(
        ReviewItem.objects.filter(campaign=campaign, source="rule").values_list("reason", flat=True)
    )
    assert "close_categories" in reasons
    detail = ReviewItem.objects.filter(reason="close_categories").first().detail
    assert " vs " in detail and "margin" in detail
    # flagged outputs are written and valid, and wait for a person
    states = dict(campaign.units.values_list("uid", "state"))
    assert {states[u] for u in ambiguous} == {UnitState.NEEDS_REVIEW}
    assert {s for u, s in states.items() if u not in ambiguous} == {UnitState.SUCCEEDED}


def test_texts_that_embed_the_same_are_flagged_as_duplicates(
    project, tmp_path, output_root, run_here
):
    root = tmp_path / "texts"
    root.mkdir()
    (root / "a.txt").write_text("The harbour reopens on Monday.\n")
    (root / "b.txt").write_text("THE HARBOUR REOPENS ON MONDAY.\n")  # uncased model: same tokens
    (root / "c.txt").write_text("A completely different sentence about GPUs.\n")
    campaign, _ = services.campaign_create(
        name="dupes", processor="text-embedding", project=project, input_folder=root
    )
    run_here(campaign)
    items = ReviewItem.objects.filter(campaign=campaign, reason="duplicate_vector")
    assert set(items.values_list("unit__uid", flat=True)) == {"a.txt", "b.txt"}
    assert "b.txt" in items.get(unit__uid="a.txt").detail


def test_a_text_cut_beyond_the_share_is_flagged_truncated(make_campaign, output_root, run_here):
    campaign = make_campaign(flag_truncated_share=0.5)
    run_here(campaign)
    item = ReviewItem.objects.get(campaign=campaign, reason="truncated")
    assert item.unit.uid == "long/annual-report.txt"
    assert "cut at max_tokens 256" in item.detail
    assert campaign.current_version.params["flag_truncated_share"] == 0.5  # recorded


def test_a_repeating_defect_keeps_the_campaign_paused_until_a_new_version(
    project, corpus, output_root, run_here
):
    # given: a norm threshold no vector meets, and a checkpoint after 10 units
    campaign, _ = services.campaign_create(
        name="defect",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"flag_norm_min": 1000.0, "batch_size": 5},
        checkpoint_after=10,
    )
    run_here(campaign)

    # then: only the first group ran, and the checkpoint failed on its own
    processed = Unit.objects.filter(campaign=campaign).exclude(state=UnitState.PENDING).count()
    assert 10 <= processed < campaign.units.count()
    checkpoint = Checkpoint.objects.get(campaign=campaign)
    assert checkpoint.state == Checkpoint.State.FAILED
    assert "repeating defect: abnormal vector norm" in checkpoint.reason
    status = review.verification_status(campaign=campaign)
    assert (status.status, status.by) == ("failed", "flag rules")
    with pytest.raises(ValidationError, match="checkpoint failed"):
        services.campaign_run(campaign=campaign)
    pending = campaign.units.filter(state=UnitState.PENDING).count()
    assert pending > 0

    # when the method is fixed (a new parameter version), the campaign may go on
    services.version_create(
        campaign=campaign,
        params={**campaign.current_version.params, "flag_norm_min": 0.05},
    )
    campaign.refresh_from_db()
    assert review.run_allowance(campaign=campaign, version=campaign.current_version) == 10


def test_a_passed_checkpoint_lets_the_campaign_finish(
    project, corpus, output_root, run_here, owner
):
    campaign, _ = services.campaign_create(
        name="spot",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"batch_size": 4},
        checkpoint_after=12,
    )
    run_here(campaign)
    checkpoint = Checkpoint.objects.get(campaign=campaign)
    assert checkpoint.state == Checkpoint.State.PENDING
    assert review.verification_status(campaign=campaign).status == "checkpoint pending"
    spot = ReviewItem.objects.filter(checkpoint=checkpoint)
    assert spot.count() == len(checkpoint.sample) > 0
    # the spot check is not simply the first results
    first = sorted(campaign.units.exclude(state=UnitState.PENDING).values_list("pk", flat=True))
    assert checkpoint.sample != first[: len(checkpoint.sample)] or len(first) <= 20
    assert services.campaign_run(campaign=campaign) == 0  # nothing beyond the first group
    assert campaign.units.filter(state=UnitState.PENDING).exists()

    review.checkpoint_decide(checkpoint=checkpoint, passed=True, user=owner)
    run_here(campaign)
    counts = selectors.campaign_counts(campaign=campaign)
    assert counts.pending == 0 and counts.active == 0
    status = review.verification_status(campaign=campaign)
    assert (status.status, status.by) == ("passed", "owner")


def test_accepting_one_flag_does_not_undo_the_rejection_of_another(
    make_campaign, output_root, run_here, owner
):
    from campaigns.review import review_decide, unit_flag

    campaign = make_campaign(flag_truncated_share=0.5)
    run_here(campaign)
    truncated = ReviewItem.objects.get(campaign=campaign, reason="truncated")
    manual = unit_flag(unit=truncated.unit, user=owner, note="reads oddly")
    review_decide(item=truncated, decision="rejected", user=owner, note="too long to embed")
    review_decide(item=manual, decision="accepted", user=owner)
    unit = Unit.objects.get(pk=truncated.unit_id)
    assert (unit.state, unit.error_class) == ("failed", "rejected_by_review")
    # and a later decision on the rejected item itself does undo it
    review_decide(item=truncated, decision="accepted", user=owner)
    unit.refresh_from_db()
    assert unit.state == "succeeded"
    assert truncated.decisions.count() == 2


def test_after_the_checkpoint_a_batch_drifting_to_one_category_is_flagged(
    project, tmp_path, calibrated_model, output_root, run_here, owner
):
    rng = random.Random(3)
    root = tmp_path / "drift"
    (root / "a-mixed").mkdir(parents=True)
    (root / "b-squares").mkdir()
    for i in range(9):
        kind = CLASSES[i % 3]
        shape_image(kind, rng).save(root / "a-mixed" / f"{i:02d}-{kind}.png")
    for i in range(12):
        shape_image("square", rng).save(root / "b-squares" / f"{i:02d}.png")
    campaign, _ = services.campaign_create(
        name="drift",
        processor="image-classification",
        project=project,
        input_folder=root,
        params=classifier_params(calibrated_model, batch_size=12),
        checkpoint_after=9,
        holdout_share=0,
    )
    run_here(campaign)  # the mixed first group, then the checkpoint
    checkpoint = Checkpoint.objects.get(campaign=campaign)
    assert not ReviewItem.objects.filter(campaign=campaign, reason="category_drift").exists()
    review.checkpoint_decide(checkpoint=checkpoint, passed=True, user=owner)

    run_here(campaign)  # twelve squares in one batch

    drifted = ReviewItem.objects.filter(campaign=campaign, reason="category_drift")
    assert set(drifted.values_list("unit__uid", flat=True)) == {
        f"b-squares/{i:02d}.png" for i in range(12)
    }
    assert "square is 100% of this batch, 33% of the checkpoint sample" in drifted.first().detail
