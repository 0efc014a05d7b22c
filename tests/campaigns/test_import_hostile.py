"""Imports fail per row, never per campaign: names that are not UTF-8, manifests
with a byte-order mark, special files, linked folders, and a create that fails."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import unicodedata
from io import StringIO
from pathlib import Path
from unittest import mock

import pytest
from django.core.management import CommandError, call_command
from django.urls import reverse

from campaigns.intake import importing
from campaigns.intake.inputs import InputError, read_bytes
from campaigns.models import Campaign, ErrorClass, ParameterVersion, Unit, UnitState
from campaigns.runs import control, setup, start
from campaigns.verify.reconcile import campaign_verify

LATIN1_NAME = b"caf\xe9.txt"


def _create(project, name="hostile", **kwargs):
    return setup.campaign_create(name=name, processor="text-embedding", project=project, **kwargs)


def _units(campaign) -> dict[str, Unit]:
    return {u.uid: u for u in Unit.objects.filter(campaign=campaign)}


def _folder(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    (root / "letters").mkdir(parents=True)
    (root / "a.txt").write_text("a first text", encoding="utf-8")
    (root / "letters" / "b.txt").write_text("a second text", encoding="utf-8")
    return root


def _call(*args) -> str:
    out = StringIO()
    call_command("campaign", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


# Names that are not UTF-8


def _write(folder: bytes | Path, name: bytes, data: bytes) -> None:
    with open(os.path.join(os.fsencode(folder), name), "wb") as fh:
        fh.write(data)


def test_a_file_name_that_is_not_utf8_imports_under_its_escaped_name_and_is_read(
    project, tmp_path, client, owner
):
    root = _folder(tmp_path)
    _write(root / "letters", LATIN1_NAME, b"une lettre")
    campaign, report = _create(project, input_folder=root)

    units = _units(campaign)
    assert set(units) == {"a.txt", "letters/b.txt", "letters/caf\\xe9.txt"}
    latin1 = units["letters/caf\\xe9.txt"]
    assert (latin1.state, latin1.category) == (UnitState.PENDING, "letters")
    assert latin1.sha256 == hashlib.sha256(b"une lettre").hexdigest()
    assert read_bytes(root, latin1.source_path) == b"une lettre"
    assert (report.created, report.failed) == (3, 0)

    # The page and the exports show the escaped name.
    client.force_login(owner)
    page = client.get(reverse("campaign_detail", args=[campaign.name]))
    assert page.status_code == 200
    assert "caf\\xe9.txt" in page.content.decode()
    response = client.get(reverse("campaign_export", args=[campaign.name, "manifest.csv"]))
    assert response.status_code == 200
    assert "caf\\xe9.txt" in b"".join(response.streaming_content).decode("utf-8")


def test_a_unit_once_failed_for_its_name_reads_its_file_when_retried(
    project, tmp_path, output_root, run_here, django_capture_on_commit_callbacks
):
    # given: a unit as an import that failed names that are not UTF-8 left it
    root = _folder(tmp_path)
    _write(root / "letters", LATIN1_NAME, b"une lettre")
    campaign, _ = _create(project, input_folder=root)
    Unit.objects.filter(campaign=campaign, uid="letters/caf\\xe9.txt").update(
        state=UnitState.FAILED,
        error_class=ErrorClass.INPUT_UNREADABLE,
        error_message="the file name is not valid UTF-8",
        size=None,
        sha256="",
    )
    # when
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        control.campaign_resume(campaign=campaign, retry_failed=True)
    run_here(campaign)
    # then
    unit = campaign.units.get(uid="letters/caf\\xe9.txt")
    assert unit.state == UnitState.SUCCEEDED, unit.error_message


def test_a_folder_name_that_is_not_utf8_keeps_its_files_as_units(project, tmp_path):
    root = _folder(tmp_path)
    folder = os.path.join(os.fsencode(root), b"d\xe9j\xe0")
    os.mkdir(folder)
    for name in (b"one.txt", b"two.txt"):
        _write(folder, name, name)
    campaign, report = _create(project, input_folder=root)
    units = _units(campaign)
    for name in ("one.txt", "two.txt"):
        unit = units[f"d\\xe9j\\xe0/{name}"]
        assert (unit.state, unit.category) == (UnitState.PENDING, "d\\xe9j\\xe0")
        assert read_bytes(root, unit.source_path) == name.encode()
    assert (report.created, report.failed) == (4, 0)


#: File names that a lossy escape gives one id (a byte that is not UTF-8 beside
#: the same text with a real backslash, a backslash beside a slash, text that
#: reads as an escape), each with the id it gets.
COLLIDING_NAMES = {
    (b"bad\xe9name.txt",): "bad\\xe9name.txt",
    (b"bad\\xe9name.txt",): "bad\\\\xe9name.txt",
    (b"a\\b.txt",): "a\\b.txt",
    (b"a", b"b.txt"): "a/b.txt",
    (b"two\\\\slashes.txt",): "two\\\\\\\\slashes.txt",
    (b"two\\slashes.txt",): "two\\slashes.txt",
}


def test_names_a_lossy_escape_would_merge_are_units_of_their_own_that_read_their_own_bytes(
    project, tmp_path, output_root, run_here
):
    # given: each file holds a text of its own
    root = tmp_path / "corpus"
    root.mkdir()
    texts = {}
    for number, (parts, uid) in enumerate(COLLIDING_NAMES.items()):
        folder = os.path.join(os.fsencode(root), *parts[:-1])
        os.makedirs(folder, exist_ok=True)
        texts[uid] = f"the file number {number}".encode()
        _write(folder, parts[-1], texts[uid])

    # when
    campaign, report = _create(project, input_folder=root)

    # then: six ids, each unit hashed from and read back as its own file
    assert (report.created, report.failed, report.duplicates) == (6, 0, 0)
    units = _units(campaign)
    assert set(units) == set(texts)
    for uid, unit in units.items():
        assert read_bytes(root, unit.source_path) == texts[uid]
        assert unit.sha256 == hashlib.sha256(texts[uid]).hexdigest()

    # and the worker reads and embeds each; a deep verify finds every input as imported
    run_here(campaign)
    failed = campaign.units.exclude(state=UnitState.SUCCEEDED)
    assert not failed.exists(), list(failed.values_list("uid", "error_message"))
    verified = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert verified["input_missing"] == verified["input_changed"] == 0


def test_a_name_in_decomposed_unicode_is_read_under_its_own_name(project, tmp_path):
    # A name written by macOS (NFD): the id is its NFC form, the file is read
    # under the name it has.
    root = _folder(tmp_path)
    decomposed = unicodedata.normalize("NFD", "café.txt")
    (root / decomposed).write_text("un café")
    campaign, report = _create(project, input_folder=root)
    unit = _units(campaign)["café.txt"]
    assert unit.state == UnitState.PENDING, unit.error_message
    assert read_bytes(root, unit.source_path) == "un café".encode()
    assert report.failed == 0


def test_a_lone_surrogate_escape_in_a_jsonl_manifest_fails_its_row_only(project, tmp_path):
    root = _folder(tmp_path)
    manifest = root / "m.jsonl"
    manifest.write_text(
        '{"id": "ok", "path": "a.txt"}\n'
        '{"id": "caf\\udce9", "path": "letters/b.txt"}\n'
        '{"id": "pair-\\ud83d\\ude00", "path": "letters/b.txt", "note": "x\\udc80"}\n'
        '{"id": "emoji-\\ud83d\\ude00", "path": "letters/b.txt"}\n',
        encoding="utf-8",
    )
    campaign, report = _create(project, manifest=manifest)
    units = _units(campaign)
    assert units["ok"].state == UnitState.PENDING
    assert units["emoji-\U0001f600"].state == UnitState.PENDING
    for line in (2, 3):
        failed = units[f"manifest-line-{line}"]
        assert failed.error_class == ErrorClass.INPUT_INVALID
        assert "surrogate" in failed.error_message
    assert report.failed == 2


# Manifest rows a database column or the importer's own marks could mistake


def _jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def test_a_manifest_column_named_like_the_importers_own_marker_is_metadata(project, corpus):
    # The importer marks a broken line with an object of its own, never with a
    # key a row could also hold.
    manifest = corpus / "manifest.jsonl"
    manifest.write_text(
        json.dumps({"id": "ok", "path": "short/question.txt", "__error__": "boom"}) + "\n",
        encoding="utf-8",
    )
    campaign, report = _create(project, manifest=manifest)
    unit = Unit.objects.get(campaign=campaign)
    assert (unit.uid, unit.state, unit.error_message) == ("ok", UnitState.PENDING, "")
    assert unit.metadata == {"__error__": "boom"}
    assert report.failed == 0


@pytest.mark.parametrize("kind", ["jsonl", "csv"])
def test_a_nul_in_a_failed_rows_path_is_shown_escaped_and_the_import_goes_on(
    project, tmp_path, kind
):
    """PostgreSQL refuses a NUL in any text column: a failed row keeps its path
    readable, `\\x00` where the NUL was, and the rest of the manifest imports."""
    (tmp_path / "fine.txt").write_text("fine")
    rows = [
        {"path": "no-id\u0000.txt"},
        {"id": "nul\u0000id", "path": "both\u0000.txt"},
        {"id": "nul-path", "path": "a\u0000.txt"},
        {"id": "fine", "path": "fine.txt"},
    ]
    if kind == "jsonl":
        manifest = _jsonl(tmp_path / "manifest.jsonl", rows)
    else:
        manifest = tmp_path / "manifest.csv"
        lines = ["id,path"] + [f"{row.get('id', '')},{row['path']}" for row in rows]
        manifest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    campaign, report = _create(project, manifest=manifest)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    first = 1 if kind == "jsonl" else 2  # a CSV's line 1 is its header
    assert set(units) == {
        f"manifest-line-{first}",
        f"manifest-line-{first + 1}",
        "nul-path",
        "fine",
    }
    assert units["fine"].state == UnitState.PENDING
    paths = sorted(u.source_path for u in units.values() if u.state == UnitState.FAILED)
    assert paths == ["a\\x00.txt", "both\\x00.txt", "no-id\\x00.txt"]
    for unit in units.values():
        for text in (unit.uid, unit.source_path, unit.error_message):
            assert "\x00" not in text
            text.encode("utf-8")
    assert report.failed == 3


def test_the_text_of_a_nul_escape_in_metadata_is_kept(project, tmp_path):
    # "C:\u0000" written as text (a backslash, then u0000) holds no NUL:
    # PostgreSQL's jsonb takes it, and the row imports.
    (tmp_path / "a.txt").write_text("a")
    manifest = _jsonl(
        tmp_path / "manifest.jsonl", [{"id": "a", "path": "a.txt", "dir": "C:\\u0000"}]
    )
    campaign, report = _create(project, manifest=manifest)
    unit = Unit.objects.get(campaign=campaign)
    assert (unit.state, unit.metadata) == (UnitState.PENDING, {"dir": "C:\\u0000"})
    assert report.failed == 0


# Manifests with a byte-order mark ("CSV UTF-8" from a spreadsheet)


@pytest.mark.parametrize("header", ["id,path", "path,id"])
def test_a_csv_manifest_with_a_byte_order_mark_keeps_its_ids(project, tmp_path, header):
    root = _folder(tmp_path)
    manifest = root / "m.csv"
    rows = {"doc-1": "a.txt", "doc-2": "letters/b.txt"}
    lines = [header] + [
        f"{uid},{path}" if header == "id,path" else f"{path},{uid}" for uid, path in rows.items()
    ]
    manifest.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode("utf-8") + b"\r\n")
    campaign, report = _create(project, manifest=manifest)
    units = _units(campaign)
    assert set(units) == {"doc-1", "doc-2"}
    assert units["doc-2"].source_path == "letters/b.txt"
    assert units["doc-2"].state == UnitState.PENDING
    assert report.failed == 0


def test_a_jsonl_manifest_with_a_byte_order_mark_reads_its_first_line(project, tmp_path):
    root = _folder(tmp_path)
    manifest = root / "m.jsonl"
    manifest.write_bytes(
        b"\xef\xbb\xbf"
        + json.dumps({"id": "doc-1", "path": "a.txt"}).encode()
        + b"\n"
        + json.dumps({"id": "doc-2", "path": "letters/b.txt"}).encode()
        + b"\n"
    )
    campaign, report = _create(project, manifest=manifest)
    assert {u.uid: u.state for u in Unit.objects.filter(campaign=campaign)} == {
        "doc-1": UnitState.PENDING,
        "doc-2": UnitState.PENDING,
    }
    assert report.failed == 0


# A create that fails leaves nothing behind


def _refused_manifests(root: Path) -> dict[str, tuple[Path, str]]:
    latin1 = root / "latin1.csv"
    latin1.write_bytes("id,path\ncafé,a.txt\n".encode("latin-1"))
    empty = root / "empty.csv"
    empty.write_bytes(b"")
    no_path = root / "nopath.csv"
    no_path.write_text("id,file\ndoc-1,a.txt\n", encoding="utf-8")
    return {
        "latin1": (latin1, "not UTF-8"),
        "empty": (empty, "needs a 'path' column"),
        "no-path": (no_path, "needs a 'path' column"),
    }


def test_a_refused_create_leaves_no_campaign_and_the_corrected_one_works(project, tmp_path):
    root = _folder(tmp_path)
    for what, (manifest, message) in _refused_manifests(root).items():
        with pytest.raises(importing.ManifestError, match=message):
            _create(project, manifest=manifest)
        assert not Campaign.objects.filter(name="hostile").exists(), what
    with pytest.raises(importing.ManifestError, match="input folder not found"):
        _create(project, input_folder=tmp_path / "nowhere")
    assert not Campaign.objects.exists()
    assert not ParameterVersion.objects.exists()

    campaign, report = _create(project, input_folder=root)
    assert report.created == 5  # the two texts and the three manifests


def test_a_manifest_refused_after_chunks_were_written_leaves_no_unit(
    project, tmp_path, monkeypatch
):
    monkeypatch.setattr(importing, "CHUNK_ROWS_DEFAULT", 3)
    monkeypatch.setattr(importing, "READ_AHEAD", (2, 2))
    root = _folder(tmp_path)
    manifest = root / "late.csv"
    good = "".join(f"doc-{i},a.txt\n" for i in range(20))
    manifest.write_bytes(("id,path\n" + good).encode() + "café,a.txt\n".encode("latin-1"))
    with pytest.raises(importing.ManifestError, match="not UTF-8"):
        _create(project, manifest=manifest)
    assert not Campaign.objects.exists()
    assert not Unit.objects.exists()


def test_the_command_refuses_a_bad_create_then_takes_the_corrected_one(tmp_path, db):
    root = _folder(tmp_path)
    manifest = root / "m.csv"
    manifest.write_bytes("id,path\ncafé,a.txt\n".encode("latin-1"))
    args = ("create", "letters", "--processor", "text-embedding", "--project", "acme")
    with pytest.raises(CommandError, match="not UTF-8"):
        _call(*args, "--manifest", str(manifest))
    manifest.write_text("id,path\ncafé,a.txt\n", encoding="utf-8")
    assert "created campaign letters" in _call(*args, "--manifest", str(manifest))
    assert Unit.objects.get(uid="café").state == UnitState.PENDING


def test_creating_a_name_that_exists_says_how_to_add_units(project, tmp_path):
    root = _folder(tmp_path)
    _create(project, input_folder=root)
    with pytest.raises(Exception, match="campaign import hostile"):
        _create(project, input_folder=root)


# Special files and linked folders


def test_a_fifo_or_a_socket_is_not_a_regular_file_not_a_folder(project, tmp_path):
    root = _folder(tmp_path)
    os.mkfifo(root / "pipe")
    (root / "folder.txt").mkdir()
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(root / "sock"))
        campaign, report = _create(project, input_folder=root)
    finally:
        server.close()
    units = _units(campaign)
    pipe, sock = units["pipe"], units["sock"]
    assert pipe.error_class == ErrorClass.INPUT_INVALID
    assert pipe.error_message == "input is not a regular file but a FIFO (named pipe): pipe"
    assert sock.error_message == "input is not a regular file but a socket: sock"
    assert "folder" not in pipe.error_message
    assert units["a.txt"].state == UnitState.PENDING
    assert report.failed == 2


def test_the_worker_refuses_a_fifo_instead_of_reading_it_as_empty(tmp_path):
    root = _folder(tmp_path)
    os.mkfifo(root / "pipe")
    with pytest.raises(InputError) as caught:
        read_bytes(root, "pipe")
    assert caught.value.error_class == ErrorClass.INPUT_INVALID
    assert "not a regular file" in caught.value.message


def test_a_linked_sub_folder_is_reported_skipped_and_a_link_out_stays_refused(project, tmp_path):
    root = _folder(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not part of the corpus", encoding="utf-8")
    os.symlink(root / "letters", root / "mirror")
    os.symlink(outside, root / "elsewhere")
    os.symlink(outside / "secret.txt", root / "secret.txt")

    campaign, report = _create(project, input_folder=root)
    assert set(_units(campaign)) == {"a.txt", "letters/b.txt", "secret.txt"}
    assert report.skipped_count == 2
    assert report.skipped[0] == (
        "elsewhere/ skipped: a symbolic link to "
        f"{os.path.realpath(outside)}, outside the corpus folder; "
        "files outside it are never imported"
    )
    assert report.skipped[1].startswith(
        "mirror/ skipped: a symbolic link to the folder letters/ of this corpus"
    )
    assert report.as_dict()["skipped"] == report.skipped
    secret = Unit.objects.get(campaign=campaign, uid="secret.txt")
    assert secret.state == UnitState.FAILED
    assert "leaves the corpus folder" in secret.error_message


def test_the_import_command_prints_the_folders_it_did_not_read(tmp_path, db):
    root = _folder(tmp_path)
    os.symlink(root / "letters", root / "mirror")
    out = _call(
        "create", "linked", "--processor", "text-embedding", "--input", str(root), "--project", "a"
    )
    assert "1 sub-folder not read (no unit made from them):" in out
    assert "  mirror/ skipped: a symbolic link to the folder letters/" in out
    report = json.loads(_call("import", "linked", "--json"))
    assert report["skipped_count"] == 1


def test_the_setup_preview_lists_a_linked_folder(client, owner, tmp_path, settings, allow_folder):
    settings.CORPUS_ROOTS = [str(tmp_path)]
    root = _folder(tmp_path)
    allow_folder(root)
    os.symlink(root / "letters", root / "mirror")
    client.force_login(owner)
    response = client.post(
        reverse("campaign_new"),
        {
            "name": "linked",
            "project": "acme",
            "processor": "text-embedding",
            "folder": str(root),
            "action": "preview",
        },
    )
    html = response.content.decode()
    assert "Folders not read" in html, html[:3000]
    assert "mirror/ skipped" in html


def test_a_create_whose_clean_up_fails_says_how_to_continue(project, tmp_path, monkeypatch):
    from django.db import DatabaseError

    def broken(campaign):
        raise DatabaseError("database is locked")

    monkeypatch.setattr(setup, "_discard", broken)
    root = _folder(tmp_path)
    manifest = root / "m.csv"
    manifest.write_bytes("id,path\ncafé,a.txt\n".encode("latin-1"))
    with pytest.raises(importing.ManifestError) as caught:
        _create(project, manifest=manifest)
    message = str(caught.value)
    assert "not UTF-8" in message
    assert "add its units with `campaign import hostile`" in message


def test_the_setup_page_refuses_a_bad_manifest_and_takes_the_corrected_one(
    client, owner, tmp_path, settings, allow_folder
):
    from unittest import mock

    from django.core.files.uploadedfile import SimpleUploadedFile

    from campaigns.runs import start
    from campaigns.specs.builtin import TEXT_EMBEDDING

    settings.CORPUS_ROOTS = [str(tmp_path)]
    root = _folder(tmp_path)
    allow_folder(root)
    form = {"project": "acme", "name": "web-made", "processor": "text-embedding"}
    form.update({f"param_{k}": v for k, v in TEXT_EMBEDDING.clean({}).items()})
    form.update({"folder": str(root), "action": "create"})
    client.force_login(owner)
    latin1 = "id,path\ncafé,a.txt\n".encode("latin-1")
    refused = client.post(
        reverse("campaign_new"), {**form, "manifest": SimpleUploadedFile("m.csv", latin1)}
    )
    assert refused.status_code == 400
    assert "not UTF-8" in refused.content.decode()
    assert not Campaign.objects.filter(name="web-made").exists()

    fixed = b"\xef\xbb\xbf" + "id,path\ncafé,a.txt\n".encode()
    with mock.patch.object(start.celery_app, "send_task"):
        created = client.post(
            reverse("campaign_new"), {**form, "manifest": SimpleUploadedFile("m.csv", fixed)}
        )
    assert created.status_code == 302
    assert list(Unit.objects.values_list("uid", flat=True)) == ["café"]
