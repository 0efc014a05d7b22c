"""The first group and its spot-check sample with the defaults a real campaign has:
5% holdout, a checkpoint after max(1%, 200) units."""

from __future__ import annotations

import csv
import random
from pathlib import Path
from unittest import mock

import pytest

from campaigns import selectors
from campaigns.models import Checkpoint, Unit, UnitState
from campaigns.review import queue as review
from campaigns.runs import setup, start
from campaigns.specs import processors as processor_specs

pytestmark = pytest.mark.django_db
CATEGORIES = ["invoice", "letter", "memo", "receipt"]


@pytest.fixture
def text_stats(settings):
    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.text_stats.SPEC"]
    processor_specs._registry.cache_clear()
    yield
    processor_specs._registry.cache_clear()


def _manifest(root: Path, count: int) -> Path:
    """`count` texts of 20 to 2,000 bytes in four categories, listed in a manifest."""
    rng = random.Random(11)
    root.mkdir()
    manifest = root / "manifest.csv"
    with manifest.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "path", "category"])
        for i in range(count):
            name = f"doc{i:05d}.txt"
            (root / name).write_text("word " * rng.randint(4, 400))
            writer.writerow([f"doc-{i:05d}", name, CATEGORIES[i % len(CATEGORIES)]])
    return manifest


def test_with_the_defaults_the_sample_is_drawn_outside_the_holdout_across_categories_and_sizes(
    text_stats, project, tmp_path, output_root, run_here
):
    # given: 4,000 units with the default holdout and checkpoint
    campaign, report = setup.campaign_create(
        name="letters",
        processor="text-stats",
        project=project,
        manifest=_manifest(tmp_path / "letters", 4000),
        params={"batch_size": 100},
    )
    assert report.created == 4000
    assert (campaign.checkpoint_after, campaign.holdout_share) == (None, 0.05)
    assert review.checkpoint_size(campaign) == 200
    held = set(Unit.objects.filter(campaign=campaign, holdout=True).values_list("pk", flat=True))
    assert len(held) > 150  # about 5%: a group the size of the checkpoint

    # when
    run_here(campaign)

    # then: the first group is 200 units outside the holdout, plus the whole holdout
    done = campaign.units.exclude(state=UnitState.PENDING)
    assert done.filter(holdout=False).count() == 200
    assert set(done.filter(holdout=True).values_list("pk", flat=True)) == held
    checkpoint = Checkpoint.objects.get(campaign=campaign)
    assert checkpoint.after_units == 200 + len(held)

    # and the spot-check sample is full, holdout-free and stratified
    sample = list(Unit.objects.filter(pk__in=checkpoint.sample).values_list("category", "size"))
    assert len(sample) == 20
    assert not held & set(checkpoint.sample)
    assert {category for category, _ in sample} == set(CATEGORIES)
    sizes = sorted(done.filter(holdout=False).values_list("size", flat=True))
    quartiles = [sizes[len(sizes) * q // 4] for q in (1, 2, 3)]
    buckets = {sum(size > q for q in quartiles) for _, size in sample}
    assert buckets == {0, 1, 2, 3}, (quartiles, sample)

    # nothing more runs until a person passes the spot check
    assert start.campaign_run(campaign=campaign) == 0


def test_the_default_checkpoint_is_one_percent_or_200_units(project, corpus):
    campaign, _ = setup.campaign_create(
        name="sizes", processor="text-embedding", project=project, input_folder=corpus
    )
    assert campaign.checkpoint_after is None
    for total, size in [(39, 39), (200, 200), (4000, 200), (20_000, 200), (50_000, 500)]:
        counts = selectors.Counts(pending=total)
        with mock.patch.object(selectors, "campaign_counts", return_value=counts):
            assert review.checkpoint_size(campaign) == size, total
    campaign.checkpoint_after = 0
    assert review.checkpoint_size(campaign) == 0
