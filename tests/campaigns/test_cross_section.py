"""The checkpoint looks at a cross-section of the corpus: the first group and its
spot check span the categories (a folder import's top folders) and the input
sizes, and identical inputs are reported at import and checked once."""

from __future__ import annotations

import csv
import json
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from campaigns.models import Checkpoint, Unit, UnitState
from campaigns.review import cross_section
from campaigns.review.queue import units_runnable
from campaigns.runs import setup
from campaigns.specs import processors as processor_specs

pytestmark = pytest.mark.django_db
LATE = ["sierra", "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu"]


@pytest.fixture
def text_stats(settings):
    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.text_stats.SPEC"]
    processor_specs._registry.cache_clear()
    yield
    processor_specs._registry.cache_clear()


def _late_categories(root: Path) -> Path:
    """300 'alpha' texts growing in size, then 15 texts of each of eight
    categories that sort late, listed in that order in a manifest."""
    root.mkdir()
    manifest = root / "manifest.csv"
    rows = [("alpha", i) for i in range(300)]
    rows += [(category, i) for category in LATE for i in range(15)]
    with manifest.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "path", "category"])
        for n, (category, i) in enumerate(rows):
            name = f"{category}-{i:03d}.txt"
            (root / name).write_text(f"{category} {n} " + "word " * (5 + i * 3))
            writer.writerow([name[:-4], name, category])
    return manifest


def _processed(campaign) -> list[tuple[str, int]]:
    return list(
        campaign.units.filter(holdout=False)
        .exclude(state=UnitState.PENDING)
        .values_list("category", "size")
    )


def test_the_first_group_and_its_sample_include_categories_that_sort_late(
    text_stats, project, tmp_path, output_root, run_here
):
    # given: the late categories are the last 120 of 420 units
    campaign, _ = setup.campaign_create(
        name="late",
        processor="text-stats",
        project=project,
        manifest=_late_categories(tmp_path / "late"),
        checkpoint_after=60,
        params={"batch_size": 16, "batch_policy": "length_grouped"},
    )
    outside = campaign.units.filter(holdout=False)
    sizes = sorted(outside.values_list("size", flat=True))

    # when: the run before the checkpoint
    run_here(campaign)

    # then: the first group holds every category and the whole range of sizes
    group = _processed(campaign)
    assert len(group) == 60
    assert {category for category, _ in group} == {"alpha", *LATE}
    quartiles = [sizes[len(sizes) * q // 4] for q in (1, 2, 3)]
    assert {sum(size > q for q in quartiles) for _, size in group} == {0, 1, 2, 3}
    # and so does the spot check drawn from it
    checkpoint = Checkpoint.objects.get(campaign=campaign)
    sampled = set(Unit.objects.filter(pk__in=checkpoint.sample).values_list("category", flat=True))
    assert len(checkpoint.sample) == 20
    assert sampled == {"alpha", *LATE}


def test_the_first_group_is_the_same_on_every_run_of_a_version(text_stats, project, tmp_path):
    campaign, _ = setup.campaign_create(
        name="same",
        processor="text-stats",
        project=project,
        manifest=_late_categories(tmp_path / "same"),
    )
    version = campaign.current_version
    pending = units_runnable(campaign=campaign, version=version)

    def pick() -> list[int]:
        return cross_section.first_group(
            pending=pending, allowance=40, campaign=campaign, version=version
        )

    assert pick() == pick()
    assert len(pick()) == 40
    assert not campaign.units.filter(pk__in=pick(), holdout=True).exists()


def _folders(root: Path) -> Path:
    """Eight identical files in 'archive' (first in import order), six texts
    each in 'letters' and 'notes', and one file at the top level."""
    for folder in ("archive", "letters", "notes"):
        (root / folder).mkdir(parents=True)
    (root / "readme.txt").write_text("What this corpus holds.")
    for i in range(8):
        (root / "archive" / f"copy-{i}.txt").write_text("The same scanned page, again.")
    for i in range(6):
        (root / "letters" / f"letter-{i}.txt").write_text(f"Dear reader {i}, " + "yes " * i)
        (root / "notes" / f"note-{i}.txt").write_text(f"Note {i}: " + "remember " * (i * 4))
    return root


def test_a_folder_import_takes_top_folders_as_categories_and_reports_identical_inputs(
    project, tmp_path
):
    campaign, report = setup.campaign_create(
        name="folders",
        processor="text-embedding",
        project=project,
        input_folder=_folders(tmp_path / "corpus"),
    )
    categories = dict(campaign.units.values_list("uid", "category"))
    assert categories["archive/copy-3.txt"] == "archive"
    assert categories["letters/letter-0.txt"] == "letters"
    assert categories["notes/note-5.txt"] == "notes"
    assert categories["readme.txt"] == ""
    assert (report.identical_groups, report.identical_units) == (1, 8)
    assert report.identical_examples == [
        ["archive/copy-0.txt", "archive/copy-1.txt", "archive/copy-2.txt"]
    ]
    assert "8 units are identical inputs" in report.identical_summary()
    assert "archive/copy-0.txt = archive/copy-1.txt" in report.identical_summary()


def test_the_command_reports_identical_inputs_and_can_leave_folders_out(tmp_path):
    corpus = _folders(tmp_path / "corpus")
    out = StringIO()
    args = ["create", "plain", "--processor", "text-embedding", "--input", str(corpus)]
    call_command("campaign", *args, "--no-folder-categories", stdout=out, stderr=StringIO())
    assert "8 units are identical inputs (the same sha256) in 1 group" in out.getvalue()
    assert set(Unit.objects.filter(campaign__name="plain").values_list("category", flat=True)) == {
        ""
    }
    out = StringIO()
    args = ["create", "json", "--processor", "text-embedding", "--input", str(corpus), "--json"]
    call_command("campaign", *args, stdout=out, stderr=StringIO())
    report = json.loads(out.getvalue())
    assert (report["identical_groups"], report["identical_units"]) == (1, 8)


def test_a_manifest_row_without_a_category_takes_its_top_folder(project, tmp_path):
    root = _folders(tmp_path / "corpus")
    manifest = root / "manifest.jsonl"
    manifest.write_text(
        '{"path": "letters/letter-1.txt", "category": "post"}\n'
        '{"path": "notes/note-1.txt"}\n'
        '{"path": "readme.txt"}\n'
    )
    campaign, _ = setup.campaign_create(
        name="listed", processor="text-embedding", project=project, manifest=manifest
    )
    assert dict(campaign.units.values_list("uid", "category")) == {
        "letters/letter-1.txt": "post",
        "notes/note-1.txt": "notes",
        "readme.txt": "",
    }


def test_identical_inputs_are_checked_once_and_the_first_group_skips_them(
    text_stats, project, tmp_path, output_root, run_here, settings
):
    # given: a folder whose head in import order is eight identical files
    settings.CHECKPOINT_SAMPLE_SIZE = 20
    campaign, _ = setup.campaign_create(
        name="copies",
        processor="text-stats",
        project=project,
        input_folder=_folders(tmp_path / "corpus"),
        checkpoint_after=10,
        holdout_share=0,
    )

    # when: the first group of 10 (of 21 units, 14 of them distinct inputs)
    run_here(campaign)

    # then: it spends its allowance on distinct inputs, across the folders
    group = campaign.units.exclude(state=UnitState.PENDING)
    assert group.count() == 10
    assert group.filter(category="archive").count() == 1
    assert set(group.values_list("category", flat=True)) >= {"archive", "letters", "notes"}
    # and the spot check shows each input once
    checkpoint = Checkpoint.objects.get(campaign=campaign)
    sampled = list(Unit.objects.filter(pk__in=checkpoint.sample).values_list("sha256", flat=True))
    assert len(sampled) == 10 and len(set(sampled)) == len(sampled)


def test_the_spot_check_samples_one_of_each_identical_input(
    text_stats, project, tmp_path, output_root, run_here, settings
):
    # given: every unit in the first group, eight of them the same file
    settings.CHECKPOINT_SAMPLE_SIZE = 20
    campaign, _ = setup.campaign_create(
        name="all-in",
        processor="text-stats",
        project=project,
        input_folder=_folders(tmp_path / "corpus"),
        checkpoint_after=21,
        holdout_share=0,
    )

    # when
    run_here(campaign)

    # then: 14 distinct inputs, each sampled once
    checkpoint = Checkpoint.objects.get(campaign=campaign)
    sampled = list(Unit.objects.filter(pk__in=checkpoint.sample).values_list("sha256", flat=True))
    assert len(sampled) == 14 and len(set(sampled)) == 14
