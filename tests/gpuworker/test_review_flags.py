"""Flag rules applied by the worker, and the checkpoint that stops a campaign."""

from __future__ import annotations

import random
from unittest import mock

import numpy as np
import pytest
import torch
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models.functions import Coalesce
from PIL import Image, ImageDraw

from campaigns import selectors
from campaigns.db.batch_statements import earlier_outputs, earlier_outputs_statement
from campaigns.models import Attempt, Checkpoint, ReviewItem, Unit, UnitState
from campaigns.review import queue as review
from campaigns.review.flags import classification_flags, image_input_flags, norm_flags
from campaigns.runs import control, setup, start
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
    campaign, _ = setup.campaign_create(
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
    campaign, _ = setup.campaign_create(
        name="dupes", processor="text-embedding", project=project, input_folder=root
    )
    run_here(campaign)
    items = ReviewItem.objects.filter(campaign=campaign, reason="duplicate_vector")
    assert set(items.values_list("unit__uid", flat=True)) == {"a.txt", "b.txt"}
    assert "b.txt" in items.get(unit__uid="a.txt").detail


def test_a_text_embedding_like_one_of_an_earlier_batch_is_flagged_through_the_index(
    project, tmp_path, output_root, run_here
):
    root = tmp_path / "texts"
    root.mkdir()
    (root / "a.txt").write_text("The harbour reopens on Monday.\n")
    for i in range(3):
        (root / f"b{i}.txt").write_text(f"Unrelated sentence number {i} about GPUs.\n")
    (root / "z.txt").write_text("THE HARBOUR REOPENS ON MONDAY.\n")  # same tokens, last batch
    campaign, _ = setup.campaign_create(
        name="dupes-late",
        processor="text-embedding",
        project=project,
        input_folder=root,
        # One text a batch: no padding, so equal tokens give equal vectors.
        params={"batch_policy": "original", "batch_size": 1},
    )
    run_here(campaign)
    item = ReviewItem.objects.get(campaign=campaign, reason="duplicate_vector")
    assert item.unit.uid == "z.txt" and "a.txt" in item.detail  # a.txt ran four batches before

    # The lookup can probe the index with both its columns: a scan of every
    # attempt of the version, each batch, grew with the campaign.
    # The statement the worker sends (compiled once, with as many hashes as asked).
    digests = ["0" * 16, "1" * 16, "2" * 16]
    sql, params = earlier_outputs_statement(campaign.current_version_id, digests)
    explain = "EXPLAIN " if connection.vendor == "postgresql" else "EXPLAIN QUERY PLAN "

    def plan_of() -> str:
        with connection.cursor() as cursor:
            cursor.execute(explain + sql, params)
            return "\n".join(" ".join(map(str, row)) for row in cursor.fetchall())

    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # a handful of rows: a scan would win otherwise
            cursor.execute("SET LOCAL enable_seqscan = off")
            # At this size the index on the version alone ties with ours, and the
            # statistics earlier tests left decide: dropped inside this test's
            # transaction, so the plan says whether the lookup can use ours at all.
            cursor.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'campaigns_attempt' "
                "AND indexdef LIKE '%%(version_id)'"
            )
            for (name,) in cursor.fetchall():
                cursor.execute(f'DROP INDEX "{name}"')
        plan = plan_of()
        # With five rows the planner filters the index's own expression
        # instead of probing with it; at scale it probes (bench/RESULTS.md).
        assert "using attempt_version_vector_hash" in plan, plan
        assert "(metrics ->> 'vector_hash'::text)" in plan, plan
    else:
        plan = plan_of()
        assert "attempt_version_vector_hash (version_id=? AND <expr>=?)" in plan, plan
    assert earlier_outputs(campaign.current_version_id, digests) == []
    # The same statement finds a hash that is there, with its unit and input.
    twins = Attempt.objects.filter(unit__uid__in=["a.txt", "z.txt"], unit__campaign=campaign)
    digest = twins[0].metrics["vector_hash"]
    found = earlier_outputs(campaign.current_version_id, [digest, "0" * 16])
    assert sorted(found) == sorted((digest, t.unit.uid, t.input_sha256) for t in twins)
    assert {uid for _, uid, _ in found} == {"a.txt", "z.txt"}
    assert earlier_outputs(campaign.current_version_id + 1, [digest]) == []


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
    campaign, _ = setup.campaign_create(
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
        start.campaign_run(campaign=campaign)
    pending = campaign.units.filter(state=UnitState.PENDING).count()
    assert pending > 0

    # when the method is fixed (a new parameter version), the campaign may go on
    setup.version_create(
        campaign=campaign,
        params={**campaign.current_version.params, "flag_norm_min": 0.05},
    )
    campaign.refresh_from_db()
    assert review.run_allowance(campaign=campaign, version=campaign.current_version) == 10


def test_a_passed_checkpoint_lets_the_campaign_finish(
    project, corpus, output_root, run_here, owner, settings
):
    # A sample smaller than the group, so that which units it takes can be judged.
    settings.CHECKPOINT_SAMPLE_SIZE = 4
    campaign, _ = setup.campaign_create(
        name="spot",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"batch_size": 4},
        checkpoint_after=12,
        folder_categories=False,
    )
    run_here(campaign)
    checkpoint = Checkpoint.objects.get(campaign=campaign)
    assert checkpoint.state == Checkpoint.State.PENDING
    assert review.verification_status(campaign=campaign).status == "checkpoint pending"
    spot = ReviewItem.objects.filter(checkpoint=checkpoint)
    assert spot.count() == len(checkpoint.sample) > 0
    # the spot check is not simply the first results: one unit of each input-size
    # quartile of the group (without their folders the demo texts have no
    # category), none held out
    group = campaign.units.exclude(state=UnitState.PENDING).filter(
        holdout=False, state__in=(UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW)
    )
    assert group.count() > len(checkpoint.sample) == 4
    # The quartiles as the rule cuts them (NTILE over size, then id): units
    # of the same size on either side of a cut are in different quartiles.
    ordered = list(group.order_by(Coalesce("size", 0), "pk").values_list("pk", flat=True))
    base, larger = divmod(len(ordered), 4)
    quartile_of, at = {}, 0
    for quartile in range(4):
        width = base + (quartile < larger)
        quartile_of.update((pk, quartile) for pk in ordered[at : at + width])
        at += width
    sampled = Unit.objects.filter(pk__in=checkpoint.sample)
    assert not sampled.filter(holdout=True).exists()
    buckets = sorted(quartile_of[pk] for pk in checkpoint.sample)
    assert buckets == [0, 1, 2, 3], [(u.pk, u.size) for u in sampled]
    assert start.campaign_run(campaign=campaign) == 0  # nothing beyond the first group
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
    from campaigns.review.queue import review_decide, unit_flag

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
    for i in range(9):
        kind = CLASSES[i % 3]
        shape_image(kind, rng).save(root / "a-mixed" / f"{i:02d}-{kind}.png")
    campaign, _ = setup.campaign_create(
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
    # Squares only, added after the checkpoint (before it they would have been
    # part of the first group's cross-section).
    (root / "b-squares").mkdir()
    for i in range(12):
        shape_image("square", rng).save(root / "b-squares" / f"{i:02d}.png")
    assert setup.campaign_import(campaign=campaign).created == 12

    run_here(campaign)  # twelve squares in one batch

    drifted = ReviewItem.objects.filter(campaign=campaign, reason="category_drift")
    assert set(drifted.values_list("unit__uid", flat=True)) == {
        f"b-squares/{i:02d}.png" for i in range(12)
    }
    assert "square is 100% of this batch, 33% of the checkpoint sample" in drifted.first().detail


# --- outputs their check refuses: failed, and in the queue ------------------------


def test_a_nan_vector_fails_the_unit_and_reaches_the_queue_and_the_checkpoint(
    project, corpus, output_root, run_here, owner
):
    # given: a model that answers NaN for every text, and a checkpoint after 10 units
    from gpuworker.processors.text_embedding import TextEmbeddingProcessor

    def nan_output(self, result, index):
        return np.full(self.dimension, np.nan, dtype=np.float32)

    campaign, _ = setup.campaign_create(
        name="nans",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"batch_size": 5},
        checkpoint_after=10,
    )
    with mock.patch.object(TextEmbeddingProcessor, "output", nan_output):
        run_here(campaign)

    # then: each output is a failure (it never counts) with an item saying why
    items = ReviewItem.objects.filter(campaign=campaign, reason="non_finite")
    refused = campaign.units.filter(error_class="output_invalid")
    assert items.count() == refused.count() >= 5
    item = items.first()
    assert (item.state, item.source, item.attempt.outcome) == ("open", "rule", "failed")
    assert "NaN or Inf" in item.detail
    unit = item.unit
    assert (unit.state, unit.error_class, unit.output_path) == ("failed", "output_invalid", "")
    # the defect fills the spot-check sample: the checkpoint fails on its own
    checkpoint = Checkpoint.objects.get(campaign=campaign)
    assert set(checkpoint.sample) <= set(items.values_list("unit_id", flat=True))
    assert checkpoint.state == Checkpoint.State.FAILED
    assert "repeating defect: NaN or Inf in the output" in checkpoint.reason

    # accepting the item acknowledges it: the corrupt output still does not count
    review.review_decide(item=item, decision="accepted", user=owner)
    unit.refresh_from_db()
    assert (unit.state, unit.error_class) == ("failed", "output_invalid")


def test_a_transformed_image_of_the_wrong_size_fails_and_is_reviewed(
    project, tmp_path, output_root, run_here
):
    import gpuworker.processors.image_transform as transform

    root = tmp_path / "pictures"
    root.mkdir()
    Image.new("RGB", (120, 80), (200, 30, 30)).save(root / "wide.png")
    campaign, _ = setup.campaign_create(
        name="resized",
        processor="image-transform",
        project=project,
        input_folder=root,
        params={"operation": "resize", "width": 32, "height": 32},
        checkpoint_after=0,
    )
    # a transformation that forgets to resize
    with mock.patch.object(transform, "expected_size", lambda w, h, params: (w, h)):
        run_here(campaign)

    unit = campaign.units.get()
    assert (unit.state, unit.error_class) == ("failed", "output_invalid")
    item = ReviewItem.objects.get(unit=unit)
    assert item.reason == "wrong_output"
    assert "120×80, asked 32×32" in item.detail


# --- each rule, on a suspect input and not on a normal one ------------------------


def test_low_confidence_is_flagged_below_the_threshold_only():
    params = {"flag_min_margin": 0.0, "flag_min_confidence": 0.5}
    labels = ["circle", "square", "triangle"]
    assert classification_flags([0.4, 0.35, 0.25], labels, params) == [
        ("low_confidence", "top-1 circle at 0.40")
    ]
    assert classification_flags([0.9, 0.06, 0.04], labels, params) == []
    assert classification_flags([0.4, 0.35, 0.25], labels, {"flag_min_confidence": 0}) == []


def test_tiny_and_extreme_aspect_inputs_are_flagged_and_a_normal_one_is_not():
    params = {"flag_min_side": 16, "flag_max_aspect": 6}
    assert image_input_flags(10, 40, params) == [("tiny_input", "10×40 pixels")]
    assert image_input_flags(20, 200, params) == [("extreme_aspect", "20×200 pixels")]
    assert image_input_flags(640, 480, params) == []
    assert image_input_flags(10, 200, {"flag_min_side": 0, "flag_max_aspect": 0}) == []


def test_the_worker_flags_tiny_and_extreme_aspect_images(project, tmp_path, output_root, run_here):
    root = tmp_path / "odd"
    root.mkdir()
    Image.new("RGB", (12, 12), (10, 10, 10)).save(root / "tiny.png")
    Image.new("RGB", (300, 30), (10, 90, 10)).save(root / "strip.png")
    Image.new("RGB", (64, 48), (90, 10, 10)).save(root / "normal.png")
    campaign, _ = setup.campaign_create(
        name="odd",
        processor="image-transform",
        project=project,
        input_folder=root,
        checkpoint_after=0,
    )
    run_here(campaign)
    flagged = dict(ReviewItem.objects.filter(campaign=campaign).values_list("unit__uid", "reason"))
    assert flagged == {"tiny.png": "tiny_input", "strip.png": "extreme_aspect"}
    assert campaign.units.get(uid="normal.png").state == UnitState.SUCCEEDED
    assert campaign.current_version.params["flag_max_aspect"] == 6  # recorded


def test_flag_norm_max_flags_a_vector_above_it_and_not_one_below():
    from campaigns.specs.builtin import TEXT_EMBEDDING
    from gpuworker.processors import get_processor

    texts = ["Hello", "The harbour reopened on Monday after three weeks of repairs."]
    plain = get_processor("text-embedding", TEXT_EMBEDDING.clean({}))
    norms = plain.embed(texts).norms
    assert norms[0] != norms[1]
    threshold = float(norms.mean())
    processor = get_processor("text-embedding", TEXT_EMBEDDING.clean({"flag_norm_max": threshold}))
    result = processor.embed(texts)
    high, low = (0, 1) if norms[0] > norms[1] else (1, 0)
    (reason, detail), *rest = processor.flags(result, high)
    assert not rest and reason == "abnormal_norm" and f"above {threshold:g}" in detail
    assert processor.flags(result, low) == []
    assert plain.flags(plain.embed(texts), high) == []  # 0: never
    assert norm_flags(5.0, {"flag_norm_max": 3.0})[0][0] == "abnormal_norm"
    assert norm_flags(2.0, {"flag_norm_max": 3.0}) == []


def test_a_text_changed_to_one_that_embeds_the_same_is_not_its_own_duplicate(
    project, tmp_path, output_root, run_here
):
    root = tmp_path / "texts"
    root.mkdir()
    (root / "a.txt").write_text("The harbour reopens on Monday.\n")
    (root / "c.txt").write_text("A completely different sentence about GPUs.\n")
    campaign, _ = setup.campaign_create(
        name="self-twin",
        processor="text-embedding",
        project=project,
        input_folder=root,
        # One text a batch: no padding, so equal tokens give equal vectors.
        params={"batch_policy": "original", "batch_size": 1},
    )
    run_here(campaign)
    # given: the input changes to other bytes with the same tokens (uncased model)
    (root / "a.txt").write_text("THE HARBOUR REOPENS ON MONDAY.\n")
    setup.campaign_import(campaign=campaign)
    # when: the changed unit runs again
    with mock.patch.object(start.celery_app, "send_task"):
        control.campaign_resume(campaign=campaign, retry_failed=True)
    run_here(campaign)
    # then: its own earlier output is no twin
    unit = campaign.units.get(uid="a.txt")
    assert unit.attempts.filter(outcome="succeeded").count() == 2
    flagged = ReviewItem.objects.filter(campaign=campaign, reason="duplicate_vector")
    assert list(flagged.values_list("unit__uid", "detail")) == []
    assert unit.state == UnitState.SUCCEEDED


def test_the_probe_finds_each_earlier_output_once_whatever_its_place_in_the_list(
    make_campaign, run_here
):
    """The probe's list of hashes is padded to a power of two with its last
    hash repeated (SQLite compiles a few texts): a hash found is found once."""
    campaign = make_campaign("probe")
    run_here(campaign)
    found = Attempt.objects.filter(
        version_id=campaign.current_version_id, outcome="succeeded"
    ).values_list("metrics__vector_hash", "unit__uid")[:2]
    (digest, uid), (other, other_uid) = found
    missing = ["f" * 16, "e" * 16]
    for digests in ([digest, *missing], [*missing, digest], [other, *missing, digest]):
        rows = earlier_outputs(campaign.current_version_id, digests)
        expected = {(digest, uid)} | ({(other, other_uid)} if other in digests else set())
        assert sorted((h, u) for h, u, _ in rows) == sorted(expected)
