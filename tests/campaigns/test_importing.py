from __future__ import annotations

import hashlib
import json

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
