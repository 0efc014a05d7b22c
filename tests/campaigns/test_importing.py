from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from campaigns.intake.importing import ManifestError
from campaigns.models import ErrorClass, Unit, UnitState
from campaigns.runs import setup, start
from campaigns.storage.vector_shards import load_shard, split_member
from tests.conftest import DEMO_BAD, DEMO_GOOD


def _create(project, **kwargs):
    return setup.campaign_create(name="imp", processor="text-embedding", project=project, **kwargs)


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
    report = setup.campaign_import(campaign=campaign)
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
    from gpuworker.runner.batch import run_batch

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
        mock.patch("campaigns.runs.start.celery_app.send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
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
    assert units[long_path].state == UnitState.SUCCEEDED
    # the shard names each row by its id exactly, however awkward; file names stay short
    for uid in ("ünïcödé 文字", long_path):
        shard, row = split_member(units[uid].output_path)
        assert load_shard(output_root / shard).ids[row] == uid
        assert len(Path(shard).name) < 120
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
    report = setup.campaign_import(campaign=campaign)
    assert report.changed == 2
    done_before = Unit.objects.get(campaign=campaign, uid="news/rail-strike.txt")
    assert (done_before.state, done_before.error_class) == ("failed", "input_changed")
    never_run = Unit.objects.get(campaign=campaign, uid="news/solar-farm.txt")
    assert never_run.state == "pending"
    data = (corpus / "news" / "solar-farm.txt").read_bytes()
    assert never_run.sha256 == hashlib.sha256(data).hexdigest()


# --- trusted manifests and imports at scale (docs/importing.md) ---------------


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _jsonl(path: Path, records) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def _small_chunks(monkeypatch, rows: int = 3) -> None:
    """Every backend imports `rows` rows per chunk: chunk boundaries in a small test."""
    from campaigns.intake import importing

    monkeypatch.setattr(importing, "CHUNK_ROWS", {})
    monkeypatch.setattr(importing, "CHUNK_ROWS_DEFAULT", rows)


def test_a_trusted_manifest_records_size_and_sha256_without_opening_the_files(
    project, tmp_path, monkeypatch
):
    # given: files that do not exist, and hashing that would fail the test
    from campaigns.intake import rows

    monkeypatch.setattr(rows, "file_sha256", lambda path: pytest.fail(f"hashed {path}"))
    sha = _sha("one")
    manifest = _jsonl(
        tmp_path / "manifest.jsonl",
        [
            {"id": "a", "path": "nowhere/a.txt", "size": 3, "sha256": sha.upper(), "lang": "en"},
            {"id": "b", "path": "nowhere/b.txt", "size": 0, "sha256": sha},
        ],
    )

    # when
    campaign, report = _create(project, manifest=manifest)

    # then
    assert (report.created, report.failed) == (2, 0)
    a = Unit.objects.get(campaign=campaign, uid="a")
    assert (a.state, a.size, a.sha256, a.mtime_ns) == (UnitState.PENDING, 3, sha, None)
    assert a.metadata == {"lang": "en"}  # size and sha256 are columns, not metadata
    assert Unit.objects.get(campaign=campaign, uid="b").size == 0


def test_a_trusted_csv_manifest_reads_size_as_text(project, tmp_path):
    manifest = tmp_path / "manifest.csv"
    manifest.write_text(f"id,path,size,sha256\nx,x.txt, 42 ,{_sha('x')}\n", encoding="utf-8")
    campaign, report = _create(project, manifest=manifest)
    assert report.created == 1
    unit = Unit.objects.get(campaign=campaign, uid="x")
    assert (unit.state, unit.size, unit.sha256) == (UnitState.PENDING, 42, _sha("x"))


def test_a_bad_size_or_sha256_fails_that_unit_with_a_reason_and_the_rest_goes_on(project, tmp_path):
    sha = _sha("ok")
    manifest = _jsonl(
        tmp_path / "manifest.jsonl",
        [
            {"id": "ok", "path": "ok.txt", "size": 2, "sha256": sha},
            {"id": "negative", "path": "n.txt", "size": -1, "sha256": sha},
            {"id": "words", "path": "w.txt", "size": "two", "sha256": sha},
            {"id": "fraction", "path": "f.txt", "size": 2.5, "sha256": sha},
            {"id": "short", "path": "s.txt", "size": 2, "sha256": sha[:40]},
            {"id": "not-hex", "path": "h.txt", "size": 2, "sha256": "z" * 64},
            {"id": "alone", "path": "a.txt", "sha256": sha},
        ],
    )
    campaign, report = _create(project, manifest=manifest)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert units["ok"].state == UnitState.PENDING
    assert report.failed == 6
    reasons = {
        uid: u.error_message
        for uid, u in units.items()
        if u.state == UnitState.FAILED and u.error_class == ErrorClass.INPUT_INVALID
    }
    assert reasons == {
        "negative": "line 2: size must be a whole number of bytes, 0 or more, not -1",
        "words": "line 3: size must be a whole number of bytes, 0 or more, not 'two'",
        "fraction": "line 4: size must be a whole number of bytes, 0 or more, not 2.5",
        "short": f"line 5: sha256 must be 64 hexadecimal characters, not '{sha[:40]}'",
        "not-hex": f"line 6: sha256 must be 64 hexadecimal characters, not '{'z' * 64}'",
        "alone": "line 7: size and sha256 go together; size is missing",
    }
    assert all(u.sha256 == "" and u.size is None for uid, u in units.items() if uid != "ok")


def test_a_trusted_row_still_may_not_leave_the_corpus_folder(project, corpus, tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret\n")
    manifest = _jsonl(
        corpus / "manifest.jsonl",
        [
            {"id": "up", "path": "../outside.txt", "size": 7, "sha256": _sha("secret\n")},
            {"id": "abs", "path": str(outside), "size": 7, "sha256": _sha("secret\n")},
            {"id": "in", "path": "a/../short/question.txt", "size": 1, "sha256": _sha("q")},
        ],
    )
    campaign, report = _create(project, manifest=manifest)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    for uid in ("up", "abs"):
        assert units[uid].error_class == ErrorClass.INPUT_INVALID
        assert "leaves the corpus folder" in units[uid].error_message
    assert units["in"].state == UnitState.PENDING  # normalised, still inside
    assert report.failed == 2


def test_overlong_ids_and_nul_characters_fail_their_row_only(project, tmp_path):
    sha = _sha("x")
    manifest = _jsonl(
        tmp_path / "manifest.jsonl",
        [
            {"id": "i" * 1001, "path": "long.txt", "size": 1, "sha256": sha},
            {"id": "nul\u0000id", "path": "nul.txt", "size": 1, "sha256": sha},
            {"id": "nul-path", "path": "a\u0000.txt", "size": 1, "sha256": sha},
            {"id": "nul-meta", "path": "m.txt", "size": 1, "sha256": sha, "note": "a\u0000"},
            {"id": "fine", "path": "fine.txt", "size": 1, "sha256": sha},
        ],
    )
    campaign, report = _create(project, manifest=manifest)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert set(units) == {"manifest-line-1", "manifest-line-2", "nul-path", "nul-meta", "fine"}
    assert "longer than 1000 characters" in units["manifest-line-1"].error_message
    assert "NUL" in units["nul-path"].error_message
    assert units["nul-meta"].error_message == "line 4: a metadata value holds a NUL character"
    assert units["fine"].state == UnitState.PENDING
    assert report.failed == 4


def test_duplicate_ids_are_counted_and_the_first_kept_within_and_across_chunks(
    project, tmp_path, monkeypatch
):
    # given: chunks of 3 rows; "a" again in its own chunk and in the next one
    _small_chunks(monkeypatch, rows=3)
    manifest = _jsonl(
        tmp_path / "manifest.jsonl",
        [
            {"id": "a", "path": "first.txt", "size": 1, "sha256": _sha("1")},
            {"id": "b", "path": "b.txt", "size": 1, "sha256": _sha("b")},
            {"id": "a", "path": "second.txt", "size": 1, "sha256": _sha("2")},
            {"id": "c", "path": "c.txt", "size": 1, "sha256": _sha("c")},
            {"id": "a", "path": "third.txt", "size": 1, "sha256": _sha("3")},
            {"id": "c", "path": "c-again.txt", "size": 1, "sha256": _sha("c")},
            {"id": "d", "path": "d.txt", "size": 1, "sha256": _sha("d")},
        ],
    )

    # when
    campaign, report = _create(project, manifest=manifest)

    # then
    assert (report.created, report.duplicates, report.existing, report.changed) == (4, 3, 0, 0)
    a = Unit.objects.get(campaign=campaign, uid="a")
    assert (a.source_path, a.sha256) == ("first.txt", _sha("1"))
    # Unit ids follow the manifest: the "original" batch order is the import order.
    assert list(
        Unit.objects.filter(campaign=campaign).order_by("pk").values_list("uid", flat=True)
    ) == [
        "a",
        "b",
        "c",
        "d",
    ]
    assert report.problems == [
        "a: duplicate id in this import (second.txt); kept the first",
        "a: duplicate id in this import (third.txt); kept the first",
        "c: duplicate id in this import (c-again.txt); kept the first",
    ]


def test_reimporting_a_trusted_manifest_creates_nothing(project, tmp_path, monkeypatch):
    _small_chunks(monkeypatch, rows=2)
    manifest = _jsonl(
        tmp_path / "manifest.jsonl",
        [{"id": f"u{i}", "path": f"{i}.txt", "size": i, "sha256": _sha(str(i))} for i in range(5)],
    )
    campaign, _ = _create(project, manifest=manifest)
    report = setup.campaign_import(campaign=campaign, manifest=manifest)
    assert (report.created, report.existing, report.duplicates, report.changed) == (0, 5, 0, 0)
    assert report.problems == []
    assert Unit.objects.filter(campaign=campaign).count() == 5


def test_a_changed_sha256_on_reimport_is_recorded_or_fails_the_unit(project, tmp_path):
    # given: three units, one pending, one done, one a worker holds
    rows = {uid: {"id": uid, "path": f"{uid}.txt", "size": 1, "sha256": _sha(uid)} for uid in "pdq"}
    campaign, _ = _create(project, manifest=_jsonl(tmp_path / "m1.jsonl", rows.values()))
    Unit.objects.filter(campaign=campaign, uid="d").update(state=UnitState.SUCCEEDED)
    Unit.objects.filter(campaign=campaign, uid="q").update(state=UnitState.QUEUED)

    # when: every input has new bytes
    for uid, row in rows.items():
        row.update(size=2, sha256=_sha(uid + "new"))
    report = setup.campaign_import(
        campaign=campaign, manifest=_jsonl(tmp_path / "m2.jsonl", rows.values())
    )

    # then
    assert (report.changed, report.existing, report.created) == (3, 3, 0)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert (units["p"].state, units["p"].sha256, units["p"].size) == ("pending", _sha("pnew"), 2)
    assert (units["d"].state, units["d"].error_class) == ("failed", "input_changed")
    assert units["d"].error_message == (
        f"input changed since import: sha256 {_sha('d')[:12]}… is now {_sha('dnew')[:12]}… "
        "(resume --retry-failed processes the new content)"
    )
    assert units["d"].sha256 == _sha("d")  # the bytes its result was made from
    assert (units["q"].state, units["q"].sha256) == ("queued", _sha("q"))  # the worker decides
    assert "p: input changed before processing; recorded anew" in report.problems
    assert f"d: {units['d'].error_message}" in report.problems


def test_a_lying_sha256_fails_the_unit_input_changed_when_the_worker_reads_it(
    project, corpus, output_root, run_here
):
    # given: a trusted manifest, right about one file and wrong about the other
    true_data = (corpus / "short" / "question.txt").read_bytes()
    manifest = _jsonl(
        corpus / "manifest.jsonl",
        [
            {
                "id": "honest",
                "path": "short/question.txt",
                "size": len(true_data),
                "sha256": hashlib.sha256(true_data).hexdigest(),
            },
            {"id": "liar", "path": "news/harbour-reopens.txt", "size": 5, "sha256": _sha("x")},
        ],
    )
    campaign, report = _create(project, manifest=manifest, checkpoint_after=0)
    assert report.created == 2 and report.failed == 0  # nothing read at import

    # when
    run_here(campaign)

    # then
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert units["honest"].state == UnitState.SUCCEEDED
    liar = units["liar"]
    assert (liar.state, liar.error_class) == (UnitState.FAILED, ErrorClass.INPUT_CHANGED)
    assert "sha256 differs" in liar.error_message
    assert liar.output_path == ""


def test_a_large_trusted_manifest_imports_with_exact_counts_and_capped_problems(project, tmp_path):
    # given: 200,000 rows, every 100th with a broken sha256
    from campaigns.intake.importing import PROBLEMS_KEPT

    rows, bad = 200_000, 2_000
    manifest = tmp_path / "manifest.jsonl"
    sha = "ab" * 32
    with manifest.open("w") as fh:
        for i in range(rows):
            digest = "nothex" if i % 100 == 0 else sha
            fh.write(f'{{"id":"doc-{i}","path":"d/{i}.txt","size":{i},"sha256":"{digest}"}}\n')

    # when
    campaign, report = _create(project, manifest=manifest)

    # then
    assert (report.created, report.failed, report.duplicates) == (rows, bad, 0)
    assert len(report.problems) == PROBLEMS_KEPT + 1
    assert report.problems[-1].startswith(f"… and {bad - PROBLEMS_KEPT} more")
    assert report.problem_count == bad
    failed = Unit.objects.filter(campaign=campaign, state=UnitState.FAILED)
    assert failed.count() == bad  # every failure findable, with its reason
    assert failed.filter(error_message__contains="sha256 must be 64 hexadecimal").count() == bad


def test_progress_hears_every_row(project, tmp_path):
    from campaigns.intake.importing import import_manifest

    manifest = _jsonl(
        tmp_path / "manifest.jsonl",
        [{"id": f"u{i}", "path": f"{i}.txt", "size": 1, "sha256": _sha("u")} for i in range(12)],
    )
    campaign, _ = _create(project, manifest=_jsonl(tmp_path / "empty.jsonl", []))
    heard = []
    report = import_manifest(campaign, manifest, progress=heard.append)
    assert report.created == 12
    assert sum(heard) == 12


def test_holdout_is_chosen_by_the_id_as_before(project, tmp_path):
    from campaigns.review.holdout import is_holdout

    manifest = _jsonl(
        tmp_path / "manifest.jsonl",
        [{"id": f"u{i}", "path": f"{i}.txt", "size": 1, "sha256": _sha("u")} for i in range(200)],
    )
    campaign, _ = _create(project, manifest=manifest, holdout_share=0.2)
    flags = dict(Unit.objects.filter(campaign=campaign).values_list("uid", "holdout"))
    assert flags == {uid: is_holdout(uid, 0.2) for uid in flags}
    assert 0 < sum(flags.values()) < 200


def test_the_import_command_reports_as_json(project, tmp_path):
    from io import StringIO

    from django.core.management import call_command

    sha = _sha("u")
    campaign, _ = _create(
        project,
        manifest=_jsonl(
            tmp_path / "m1.jsonl", [{"id": "a", "path": "a", "size": 1, "sha256": sha}]
        ),
    )
    manifest = _jsonl(
        tmp_path / "m2.jsonl",
        [
            {"id": "a", "path": "a", "size": 1, "sha256": sha},
            {"id": "b", "path": "b", "size": 1, "sha256": sha},
            {"id": "c", "path": "c", "size": -1, "sha256": sha},
        ],
    )
    out, err = StringIO(), StringIO()
    call_command(
        "campaign",
        "import",
        campaign.name,
        "--manifest",
        str(manifest),
        "--json",
        stdout=out,
        stderr=err,
    )
    data = json.loads(out.getvalue())
    assert {k: data[k] for k in ("created", "existing", "failed", "duplicates")} == {
        "created": 2,
        "existing": 1,
        "failed": 1,
        "duplicates": 0,
    }
    assert data["problems"] == [
        "c: line 3: size must be a whole number of bytes, 0 or more, not -1"
    ]
    assert err.getvalue() == ""  # no progress bar with --json


def test_an_id_another_import_adds_meanwhile_is_counted_once(project, tmp_path, monkeypatch):
    # given: a campaign with "x"; between looking ids up and inserting, another
    # import adds "b"
    from campaigns.db.import_staging import Staging

    def row(uid):
        return {"id": uid, "path": f"{uid}.txt", "size": 1, "sha256": _sha(uid)}

    campaign, _ = _create(project, manifest=_jsonl(tmp_path / "m1.jsonl", [row("x")]))
    match = Staging._match

    def racing(self, cursor):
        found = match(self, cursor)
        Unit.objects.get_or_create(
            campaign=self.campaign, uid="b", defaults={"source_path": "theirs.txt"}
        )
        return found

    monkeypatch.setattr(Staging, "_match", racing)

    # when
    report = setup.campaign_import(
        campaign=campaign, manifest=_jsonl(tmp_path / "m2.jsonl", [row(u) for u in "xabc"])
    )

    # then: theirs stays, the rest is imported, nothing counted twice
    assert (report.created, report.existing, report.duplicates) == (2, 2, 0)
    units = dict(Unit.objects.filter(campaign=campaign).values_list("uid", "source_path"))
    assert units == {"x": "x.txt", "a": "a.txt", "b": "theirs.txt", "c": "c.txt"}


# --- running what a large import made ----------------------------------------


def test_run_claims_units_in_groups_and_a_unit_taken_meanwhile_shrinks_its_batch(
    project, tmp_path, monkeypatch
):
    # given: 2,500 pending units (three claim groups of batches of 16), and a
    # unit of the second group that another run takes while this one plans
    from unittest import mock

    from campaigns.models import Batch
    from campaigns.runs import start

    manifest = _jsonl(
        tmp_path / "manifest.jsonl",
        [
            {"id": f"u{i:04d}", "path": f"{i}.txt", "size": 1, "sha256": _sha("u")}
            for i in range(2500)
        ],
    )
    campaign, _ = _create(
        project, manifest=manifest, checkpoint_after=0, params={"batch_policy": "original"}
    )
    taken = Unit.objects.get(campaign=campaign, uid="u1500")
    plan = start.plan_batches

    def planning(pending, params, **kwargs):
        for number, ids in enumerate(plan(pending, params, **kwargs)):
            if number == 1:
                Unit.objects.filter(pk=taken.pk).update(state=UnitState.QUEUED)
            yield ids

    monkeypatch.setattr(start, "plan_batches", planning)

    # when
    with mock.patch.object(start.celery_app, "send_task"):
        enqueued = start.campaign_run(campaign=campaign)

    # then
    batches = list(Batch.objects.filter(campaign=campaign).order_by("pk"))
    assert enqueued == len(batches) == 157  # ceil(2500 / 16)
    units = Unit.objects.filter(campaign=campaign).exclude(pk=taken.pk)
    assert not units.exclude(state=UnitState.QUEUED).exists()
    assert Unit.objects.get(pk=taken.pk).batch_id is None  # still the other run's
    sizes = {b.pk: b.size for b in batches}
    assert sum(sizes.values()) == 2499
    assert sizes[batches[1500 // 16].pk] == 15
    # batches in import order: the first batch holds the first 16 units
    first = Unit.objects.filter(batch=batches[0]).order_by("pk").values_list("uid", flat=True)
    assert list(first) == [f"u{i:04d}" for i in range(16)]
