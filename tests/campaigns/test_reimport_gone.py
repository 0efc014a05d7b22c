"""A re-import of a folder or a manifest notices the files gone since, and
only those: a manifest adds rows, so a row it does not hold is no loss
(docs/importing.md, "Importing again")."""

from __future__ import annotations

import json
import os
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from campaigns.models import ErrorClass, Unit, UnitState
from campaigns.runs import control, setup

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
GONE = "its file is gone (re-import); it was not run"


def _folder(path: Path, names) -> Path:
    path.mkdir(exist_ok=True)
    for name in names:
        (path / name).write_text(f"The text of {name}, a short one.", encoding="utf-8")
    return path


def _manifest(path: Path, ids) -> Path:
    path.write_text(
        "".join(json.dumps({"id": uid, "path": f"{uid}.txt"}) + "\n" for uid in ids),
        encoding="utf-8",
    )
    return path


def _create(project, **kwargs):
    return setup.campaign_create(
        name="gone", processor="text-embedding", project=project, checkpoint_after=0, **kwargs
    )


def _units(campaign) -> dict[str, Unit]:
    return {u.uid: u for u in Unit.objects.filter(campaign=campaign)}


def test_a_file_deleted_from_the_folder_is_removed_and_its_pending_unit_fails(project, tmp_path):
    # given: a, b, c imported; c has run
    corpus = _folder(tmp_path / "corpus", ["a.txt", "b.txt", "c.txt"])
    campaign, _ = _create(project, input_folder=corpus)
    Unit.objects.filter(campaign=campaign, uid="c.txt").update(state=UnitState.SUCCEEDED)
    before = _units(campaign)

    # when: b is deleted and d added
    (corpus / "b.txt").unlink()
    _folder(corpus, ["d.txt"])
    report = setup.campaign_import(campaign=campaign)

    # then
    assert (report.created, report.existing, report.removed) == (1, 2, 1)
    assert report.problems == [f"b.txt: {GONE}"]
    units = _units(campaign)
    b = units["b.txt"]
    assert (b.state, b.error_class, b.error_message) == (
        UnitState.FAILED,
        ErrorClass.INPUT_MISSING,
        GONE,
    )
    assert units["d.txt"].state == UnitState.PENDING
    for uid in ("a.txt", "c.txt"):
        assert (units[uid].state, units[uid].sha256, units[uid].updated_at) == (
            before[uid].state,
            before[uid].sha256,
            before[uid].updated_at,
        )

    # and again: nothing new is gone, b is still named
    again = setup.campaign_import(campaign=campaign)
    assert (again.created, again.removed) == (0, 1)
    assert again.problems == [
        "b.txt: its file is gone (re-import); the unit is kept as it was (failed)"
    ]

    # and back: b's file returns, and resume --retry-failed runs it
    _folder(corpus, ["b.txt"])
    back = setup.campaign_import(campaign=campaign)
    assert (back.created, back.existing, back.removed) == (0, 4, 0)
    control.campaign_resume(campaign=campaign, retry_failed=True)
    assert _units(campaign)["b.txt"].state == UnitState.QUEUED


def test_a_unit_that_ran_keeps_its_state_and_output_when_its_file_is_deleted(
    project, tmp_path, output_root, run_here
):
    corpus = _folder(tmp_path / "corpus", ["a.txt", "c.txt"])
    campaign, _ = _create(project, input_folder=corpus)
    run_here(campaign)
    ran = _units(campaign)["c.txt"]
    assert ran.state == UnitState.SUCCEEDED and ran.output_path

    (corpus / "c.txt").unlink()
    out = StringIO()
    call_command("campaign", "import", campaign.name, stdout=out)

    printed = out.getvalue()
    assert "1 files gone" in printed
    assert "c.txt: its file is gone (re-import); the unit is kept as it was (succeeded)" in printed
    c = _units(campaign)["c.txt"]
    assert (c.state, c.output_path, c.error_class) == (UnitState.SUCCEEDED, ran.output_path, "")
    assert _units(campaign)["a.txt"].state == UnitState.SUCCEEDED


def _import_manifest_json(campaign, manifest: Path) -> dict:
    out = StringIO()
    call_command(
        "campaign", "import", campaign.name, "--manifest", str(manifest), "--json", stdout=out
    )
    return json.loads(out.getvalue())


def test_a_row_dropped_from_the_manifest_whose_file_is_there_is_left_alone(project, tmp_path):
    corpus = _folder(tmp_path / "corpus", ["a.txt", "b.txt", "c.txt", "d.txt"])
    manifest = _manifest(tmp_path / "m.jsonl", "abc")
    campaign, _ = _create(project, manifest=manifest, input_root=corpus)
    Unit.objects.filter(campaign=campaign, uid="c").update(state=UnitState.SUCCEEDED)
    before = _units(campaign)

    _manifest(manifest, "acd")
    report = _import_manifest_json(campaign, manifest)

    assert (report["created"], report["existing"], report["removed"]) == (1, 2, 0)
    assert report["problems"] == []
    units = _units(campaign)
    assert (units["b"].state, units["b"].error_class, units["b"].updated_at) == (
        UnitState.PENDING,
        "",
        before["b"].updated_at,
    )
    assert (units["a"].state, units["c"].state, units["d"].state) == (
        UnitState.PENDING,
        UnitState.SUCCEEDED,
        UnitState.PENDING,
    )


def test_a_row_dropped_from_the_manifest_whose_file_was_deleted_is_removed(project, tmp_path):
    corpus = _folder(tmp_path / "corpus", ["a.txt", "b.txt", "c.txt"])
    manifest = _manifest(tmp_path / "m.jsonl", "abc")
    campaign, _ = _create(project, manifest=manifest, input_root=corpus)

    (corpus / "b.txt").unlink()
    _manifest(manifest, "ac")
    report = _import_manifest_json(campaign, manifest)

    assert (report["created"], report["existing"], report["removed"]) == (0, 2, 1)
    assert report["problems"] == [f"b: {GONE}"]
    b = _units(campaign)["b"]
    assert (b.state, b.error_class, b.error_message) == (
        UnitState.FAILED,
        ErrorClass.INPUT_MISSING,
        GONE,
    )


def test_a_second_manifest_of_new_rows_only_adds_them(project, tmp_path):
    # given: a campaign made from a manifest of a, b, c; c has run
    corpus = _folder(tmp_path / "corpus", ["a.txt", "b.txt", "c.txt", "d.txt", "e.txt"])
    campaign, _ = _create(
        project, manifest=_manifest(tmp_path / "first.jsonl", "abc"), input_root=corpus
    )
    Unit.objects.filter(campaign=campaign, uid="c").update(state=UnitState.SUCCEEDED)
    before = _units(campaign)

    # when: a manifest of the new rows d and e is imported, as the docs say
    report = _import_manifest_json(campaign, _manifest(tmp_path / "more.jsonl", "de"))

    # then: both added, nothing removed, the first three untouched
    assert (report["created"], report["existing"], report["removed"]) == (2, 0, 0)
    assert report["problems"] == []
    units = _units(campaign)
    assert sorted(units) == ["a", "b", "c", "d", "e"]
    for uid in "abc":
        assert (units[uid].state, units[uid].error_class, units[uid].updated_at) == (
            before[uid].state,
            "",
            before[uid].updated_at,
        )


def test_a_manifest_campaign_imported_from_its_folder_removes_nothing(project, tmp_path):
    # given: a campaign made from a manifest (ids a, b), its files in the folder
    corpus = _folder(tmp_path / "corpus", ["a.txt", "b.txt"])
    campaign, _ = _create(
        project, manifest=_manifest(tmp_path / "m.jsonl", "ab"), input_root=corpus
    )
    before = _units(campaign)

    # when: `campaign import NAME` reads its folder (ids a.txt, b.txt there)
    out = StringIO()
    call_command("campaign", "import", campaign.name, stdout=out)

    # then: the manifest's units are not gone: their files are there
    assert "0 files gone" in out.getvalue()
    units = _units(campaign)
    for uid in "ab":
        assert (units[uid].state, units[uid].updated_at) == (
            UnitState.PENDING,
            before[uid].updated_at,
        )


def test_a_manifest_row_whose_file_is_gone_is_changed_not_removed(project, tmp_path):
    corpus = _folder(tmp_path / "corpus", ["a.txt", "b.txt"])
    manifest = _manifest(tmp_path / "m.jsonl", "ab")
    campaign, _ = _create(project, manifest=manifest, input_root=corpus)

    (corpus / "b.txt").unlink()
    report = setup.campaign_import(campaign=campaign, manifest=manifest)

    assert (report.changed, report.removed) == (1, 0)
    b = _units(campaign)["b"]
    assert (b.state, b.error_class) == (UnitState.FAILED, ErrorClass.INPUT_MISSING)
    assert "now fails: input file not found" in b.error_message


def test_the_units_of_a_sub_folder_not_read_are_not_removed(project, tmp_path):
    # given: sub/x.txt imported, then sub/ made a link to a folder outside
    corpus = _folder(tmp_path / "corpus", ["a.txt"])
    _folder(corpus / "sub", ["x.txt"])
    campaign, _ = _create(project, input_folder=corpus)
    (corpus / "sub").rename(tmp_path / "elsewhere")
    (corpus / "sub").symlink_to(tmp_path / "elsewhere", target_is_directory=True)

    report = setup.campaign_import(campaign=campaign)

    # then: skipped, and the unit left alone: the import did not look
    assert (report.skipped_count, report.removed) == (1, 0)
    assert _units(campaign)["sub/x.txt"].state == UnitState.PENDING


def test_a_file_whose_name_is_not_utf8_is_found_by_its_name_on_disk(project, tmp_path):
    # given: a folder campaign with a file whose name is not UTF-8 (stored escaped)
    corpus = _folder(tmp_path / "corpus", ["a.txt"])
    odd = os.path.join(os.fsencode(corpus), b"caf\xe9.txt")
    with open(odd, "wb") as fh:
        fh.write(b"The text of a file with an odd name.")
    campaign, _ = _create(project, input_folder=corpus)
    assert "caf\\xe9.txt" in _units(campaign)

    # when: a manifest of another file is imported, the odd one still there
    _folder(corpus, ["n.txt"])
    manifest = _manifest(tmp_path / "m.jsonl", ["n"])
    kept = setup.campaign_import(campaign=campaign, manifest=manifest)

    # then: not gone; and once deleted, it is
    assert (kept.created, kept.removed) == (1, 0)
    os.unlink(odd)
    gone = setup.campaign_import(campaign=campaign, manifest=manifest)
    assert (gone.removed, gone.problems) == (1, [f"caf\\xe9.txt: {GONE}"])


def test_a_file_that_cannot_be_looked_at_is_not_removed(project, tmp_path):
    # given: sub/x.txt imported, then sub/ made a link to itself (a loop)
    corpus = _folder(tmp_path / "corpus", ["a.txt"])
    _folder(corpus / "sub", ["x.txt"])
    campaign, _ = _create(project, input_folder=corpus)
    (corpus / "sub" / "x.txt").unlink()
    (corpus / "sub").rmdir()
    (corpus / "sub").symlink_to("sub")

    report = setup.campaign_import(campaign=campaign)

    # then: the disk says "too many links", not "no such file": kept
    assert report.removed == 0
    assert _units(campaign)["sub/x.txt"].state == UnitState.PENDING


@pytest.mark.skipif(AS_ROOT, reason="root reads a folder whatever its mode")
def test_the_units_of_a_folder_without_permission_are_not_removed(project, tmp_path):
    corpus = _folder(tmp_path / "corpus", ["a.txt"])
    _folder(corpus / "sub", ["x.txt"])
    campaign, _ = _create(project, input_folder=corpus)
    (corpus / "sub").chmod(0)
    try:
        report = setup.campaign_import(campaign=campaign)
    finally:
        (corpus / "sub").chmod(0o755)

    assert (report.skipped_count, report.removed) == (1, 0)
    assert _units(campaign)["sub/x.txt"].state == UnitState.PENDING


def test_a_campaign_folder_that_is_gone_fails_no_unit(project, tmp_path):
    # given: a campaign made from a manifest of a, b, c in a folder
    corpus = _folder(tmp_path / "corpus", ["a.txt", "b.txt", "c.txt"])
    campaign, _ = _create(
        project, manifest=_manifest(tmp_path / "first.jsonl", "abc"), input_root=corpus
    )

    # when: the folder is renamed (or its disk not mounted) and new rows imported
    corpus.rename(tmp_path / "elsewhere")
    report = _import_manifest_json(campaign, _manifest(tmp_path / "more.jsonl", "d"))

    # then: no unit is taken as gone, and the report says why first
    assert report["removed"] == 0
    assert "the campaign's folder cannot be read" in report["problems"][0]
    assert {u.state for u in Unit.objects.filter(campaign=campaign, uid__in="abc")} == {
        UnitState.PENDING
    }


def test_an_emptied_folder_fails_no_unit(project, tmp_path):
    # given: a folder campaign of a, b
    corpus = _folder(tmp_path / "corpus", ["a.txt", "b.txt"])
    campaign, _ = _create(project, input_folder=corpus)

    # when: the folder is empty at the re-import (an unmounted mount point looks so)
    for name in ("a.txt", "b.txt"):
        (corpus / name).unlink()
    report = setup.campaign_import(campaign=campaign)

    # then
    assert report.removed == 0
    assert "the campaign's folder is empty" in report.problems[0]
    assert {u.state for u in Unit.objects.filter(campaign=campaign)} == {UnitState.PENDING}
