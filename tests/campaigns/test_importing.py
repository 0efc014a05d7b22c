from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from campaigns import services
from campaigns.importing import ManifestError
from campaigns.models import ErrorClass, Unit, UnitState
from tests.conftest import DEMO_BAD, DEMO_GOOD


def _create(project, **kwargs):
    return services.campaign_create(
        name="imp", processor="text-embedding", project=project, **kwargs
    )


def test_folder_import_makes_one_unit_per_file_with_size_and_checksum(project, corpus):
    campaign, report = _create(project, input_folder=corpus)
    assert report.created == DEMO_GOOD + DEMO_BAD
    unit = Unit.objects.get(campaign=campaign, uid="news/harbour-reopens.txt")
    data = (corpus / "news" / "harbour-reopens.txt").read_bytes()
    assert unit.size == len(data)
    assert unit.sha256 == hashlib.sha256(data).hexdigest()
    assert unit.state == UnitState.PENDING


def test_reimporting_the_same_folder_creates_no_duplicates(project, corpus):
    campaign, _ = _create(project, input_folder=corpus)
    report = services.campaign_import(campaign=campaign)
    assert report.created == 0
    assert report.existing == DEMO_GOOD + DEMO_BAD
    assert Unit.objects.filter(campaign=campaign).count() == DEMO_GOOD + DEMO_BAD


def test_csv_manifest_keeps_ids_categories_and_metadata(project, corpus):
    manifest = corpus / "manifest.csv"
    manifest.write_text(
        "id,path,category,lang\n"
        "doc-1,news/harbour-reopens.txt,news,en\n"
        "doc-2,multilingual/french.txt,news,fr\n",
        encoding="utf-8",
    )
    campaign, report = _create(project, manifest=manifest)
    assert report.created == 2
    unit = Unit.objects.get(campaign=campaign, uid="doc-2")
    assert unit.source_path == "multilingual/french.txt"
    assert unit.category == "news"
    assert unit.metadata == {"lang": "fr"}


def test_bad_manifest_rows_become_failed_units_with_reasons(project, corpus):
    manifest = corpus / "manifest.jsonl"
    lines = [
        json.dumps({"id": "ok", "path": "short/question.txt"}),
        json.dumps({"id": "escape", "path": "../../etc/passwd"}),
        json.dumps({"id": "gone", "path": "no/such/file.txt"}),
        "{not json",
        json.dumps({"id": "nopath"}),
    ]
    manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    campaign, report = _create(project, manifest=manifest)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert units["ok"].state == UnitState.PENDING
    assert units["escape"].error_class == ErrorClass.INPUT_INVALID
    assert "leaves the corpus folder" in units["escape"].error_message
    assert units["gone"].error_class == ErrorClass.INPUT_MISSING
    assert units["manifest-line-4"].error_message.startswith("line 4 is not JSON")
    assert units["nopath"].error_message == "line 5 has no path"
    assert report.failed == 4
    assert all(u.state == UnitState.FAILED for uid, u in units.items() if uid != "ok")


def test_a_manifest_that_is_not_utf8_is_refused_as_a_whole(project, corpus):
    manifest = corpus / "manifest.csv"
    manifest.write_bytes("id,path\ncafé,a.txt\n".encode("latin-1"))
    with pytest.raises(ManifestError, match="not UTF-8"):
        _create(project, manifest=manifest)


def test_awkward_manifest_rows_each_get_a_clear_outcome_and_outputs_stay_inside(
    project, corpus, output_root, tmp_path, django_capture_on_commit_callbacks
):
    from unittest import mock

    from campaigns.models import Batch
    from gpuworker.batch_runner import run_batch

    # given
    long_name = "n" * 200 + ".txt"
    (corpus / "deep" / ("d" * 100)).mkdir(parents=True)
    (corpus / "deep" / ("d" * 100) / long_name).write_text("a file with a 300-char path\n")
    (corpus / "ünïcödé 文字.txt").write_text("unicode names stay readable\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("not part of the corpus\n")
    long_path = f"deep/{'d' * 100}/{long_name}"
    manifest = corpus / "manifest.jsonl"
    manifest.write_text(
        "\n".join(
            json.dumps(r)
            for r in [
                {"id": "escape", "path": "../../etc/passwd"},
                {"id": "absolute", "path": str(outside)},
                {"id": "dup", "path": "short/question.txt"},
                {"id": "dup", "path": "short/one-word.txt"},
                {"id": "ünïcödé 文字", "path": "ünïcödé 文字.txt"},
                {"id": long_path, "path": long_path},
            ]
        )
        + "\n",
        encoding="utf-8",
    )

    # when
    campaign, report = _create(project, manifest=manifest)
    with (
        mock.patch("campaigns.services.celery_app.send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        services.campaign_run(campaign=campaign)
    for batch in Batch.objects.filter(campaign=campaign):
        run_batch(batch.pk)

    # then
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert set(units) == {"escape", "absolute", "dup", "ünïcödé 文字", long_path}
    assert "leaves the corpus folder" in units["escape"].error_message
    assert "leaves the corpus folder" in units["absolute"].error_message
    assert units["dup"].source_path == "short/question.txt"  # the first one is kept
    assert report.duplicates == 1
    assert any("duplicate id" in p for p in report.problems)
    assert units["ünïcödé 文字"].state == UnitState.SUCCEEDED
    assert "ünïcödé_文字" in units["ünïcödé 文字"].output_path
    assert units[long_path].state == UnitState.SUCCEEDED
    assert len(Path(units[long_path].output_path).name) < 120
    root = output_root.resolve()
    for path in output_root.rglob("*"):
        assert root in path.resolve().parents
    assert outside.read_text() == "not part of the corpus\n"


def test_reimport_of_a_changed_input_is_shown_not_mixed(project, corpus):
    campaign, _ = _create(project, input_folder=corpus)
    Unit.objects.filter(campaign=campaign, uid="news/rail-strike.txt").update(
        state=UnitState.SUCCEEDED
    )
    (corpus / "news" / "rail-strike.txt").write_text("Trains run normally today.\n")
    (corpus / "news" / "solar-farm.txt").write_text("Never processed, now different.\n")
    report = services.campaign_import(campaign=campaign)
    assert report.changed == 2
    done_before = Unit.objects.get(campaign=campaign, uid="news/rail-strike.txt")
    assert (done_before.state, done_before.error_class) == ("failed", "input_changed")
    never_run = Unit.objects.get(campaign=campaign, uid="news/solar-farm.txt")
    assert never_run.state == "pending"
    data = (corpus / "news" / "solar-farm.txt").read_bytes()
    assert never_run.sha256 == hashlib.sha256(data).hexdigest()
