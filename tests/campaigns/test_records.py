"""A corpus as records: rows of JSONL, CSV, Parquet and Arrow files as units
(campaigns/intake/records.py, docs/importing.md "Records")."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from django.core.management import call_command

from campaigns.intake.inputs import WHOLE, InputError, ReadLimits, read_bytes
from campaigns.intake.records import RecordColumns
from campaigns.models import Campaign, ErrorClass, Unit, UnitState
from campaigns.runs import control, setup
from tests.campaigns.test_verify_special_inputs import deadline  # noqa: F401 — a fixture

pytestmark = pytest.mark.django_db

ROWS = [
    {"id": "a", "text": "The harbour reopened on Monday.", "lang": "en"},
    {"id": "b", "text": "Le port a rouvert lundi.", "lang": "fr"},
    {"id": "c", "text": "港は月曜日に再開した。", "lang": "ja"},
]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def create(project, records: Path, name="recs", **columns) -> tuple[Campaign, object]:
    columns = {"text": "text", "id": "id", **columns}
    return setup.campaign_create(
        name=name,
        processor="text-embedding",
        project=project,
        records=records,
        columns=RecordColumns(**columns),
    )


def units(campaign) -> dict[str, Unit]:
    return {u.uid: u for u in Unit.objects.filter(campaign=campaign).order_by("pk")}


def texts(campaign) -> dict[str, str]:
    root = Path(campaign.input_root)
    return {
        u.uid: read_bytes(root, u.source_path).decode()
        for u in Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).order_by("pk")
    }


def write_jsonl(path: Path, rows, *, bom=False) -> Path:
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows).encode()
    if bom:
        data = b"\xef\xbb\xbf" + data
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "wb") as fh:
        fh.write(data)
    return path


def write_parquet(path: Path, rows, row_group_size=2) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def save_to_disk(folder: Path, rows, batch_rows=2, files=2) -> Path:
    """The layout `datasets.Dataset.save_to_disk` writes: Arrow IPC streams
    `data-0000N-of-0000M.arrow`, beside `dataset_info.json` and `state.json`."""
    folder.mkdir(parents=True)
    table = pa.Table.from_pylist(rows)
    per = -(-len(rows) // files)
    names = []
    for n in range(files):
        name = f"data-{n:05d}-of-{files:05d}.arrow"
        part = table.slice(n * per, per)
        with (
            pa.OSFile(str(folder / name), "wb") as sink,
            pa.ipc.new_stream(sink, part.schema) as writer,
        ):
            for batch in part.to_batches(max_chunksize=batch_rows):
                writer.write_batch(batch)
        names.append({"filename": name})
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    (folder / "state.json").write_text(json.dumps({"_data_files": names, "_split": None}))
    return folder


def test_jsonl_rows_become_units_with_their_text_checksum_and_category(project, tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", ROWS, bom=True)
    campaign, report = create(project, path, category="lang")
    assert report.created == 3 and report.failed == 0
    made = units(campaign)
    assert list(made) == ["a", "b", "c"]
    assert {uid: u.category for uid, u in made.items()} == {"a": "en", "b": "fr", "c": "ja"}
    for row in ROWS:
        unit = made[row["id"]]
        assert unit.sha256 == sha(row["text"])
        assert unit.size == len(row["text"].encode())
        assert unit.source_path.startswith("corpus.jsonl#")
    assert texts(campaign) == {r["id"]: r["text"] for r in ROWS}


def test_gzipped_jsonl_reads_its_rows_in_any_order(project, tmp_path):
    rows = [{"id": f"r{i}", "text": f"row number {i}"} for i in range(50)]
    campaign, report = create(project, write_jsonl(tmp_path / "corpus.jsonl.gz", rows))
    assert report.created == 50
    root = Path(campaign.input_root)
    paths = dict(Unit.objects.filter(campaign=campaign).values_list("uid", "source_path"))
    for i in [40, 3, 49, 0, 41, 17]:  # behind and ahead of each cursor
        assert read_bytes(root, paths[f"r{i}"]).decode() == f"row number {i}"


def test_csv_in_a_sniffed_dialect_with_a_bom_and_a_field_over_lines(project, tmp_path):
    path = tmp_path / "corpus.csv"
    path.write_bytes(
        b"\xef\xbb\xbfid;text;lang\n"
        b'a;"first; with a semicolon";en\n'
        b'b;"two\nlines";fr\n'
        b"c;;de\n"
        b"d;too;many;fields\n"
        b"e;last one;en\n"
    )
    campaign, report = create(project, path, category="lang")
    assert report.created == 5 and report.failed == 2
    assert texts(campaign) == {"a": "first; with a semicolon", "b": "two\nlines", "e": "last one"}
    made = units(campaign)
    assert made["c"].error_class == ErrorClass.INPUT_INVALID
    assert "empty text" in made["c"].error_message
    assert made["corpus.csv:6"].error_class == ErrorClass.INPUT_INVALID
    assert "4 fields where the header has 3" in made["corpus.csv:6"].error_message


def test_bad_rows_fail_with_their_reason_and_the_rest_imports(project, tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text(
        json.dumps({"id": "ok", "text": "fine"})
        + "\n{not json\n"
        + json.dumps({"id": "ok", "text": "again"})
        + "\n"
        + json.dumps({"id": "none", "text": None})
        + "\n"
        + json.dumps({"id": "blank", "text": "   "})
        + "\n"
        + json.dumps({"id": "number", "text": 12})
        + "\n"
        + json.dumps({"text": "no id"})
        + "\n"
        + json.dumps({"id": "nan", "text": "x", "n": float("nan")})
        + "\n"
        + json.dumps({"id": "last", "text": "still imported"})
        + "\n"
    )
    campaign, report = create(project, path)
    made = units(campaign)
    assert report.duplicates == 1
    failed = {uid: (u.error_class, u.error_message) for uid, u in made.items() if u.error_class}
    assert set(failed) == {
        "corpus.jsonl:2",
        "none",
        "blank",
        "number",
        "corpus.jsonl:7",
        "corpus.jsonl:8",
    }
    assert all(cls == ErrorClass.INPUT_INVALID for cls, _ in failed.values())
    assert "not JSON" in failed["corpus.jsonl:2"][1]
    assert "no text" in failed["none"][1]
    assert "whitespace only" in failed["blank"][1]
    assert "int, not text" in failed["number"][1]
    assert "no id in column 'id'" in failed["corpus.jsonl:7"][1]
    assert "NaN is not a JSON value" in failed["corpus.jsonl:8"][1]
    assert texts(campaign) == {"ok": "fine", "last": "still imported"}


def test_without_an_id_column_a_unit_is_file_and_line(project, tmp_path):
    path = write_jsonl(tmp_path / "corpus.jsonl", ROWS)
    campaign, _ = create(project, path, id=None)
    assert list(units(campaign)) == ["corpus.jsonl:1", "corpus.jsonl:2", "corpus.jsonl:3"]


def test_parquet_rows_with_their_row_group_and_index(project, tmp_path):
    rows = [
        *ROWS,
        {"id": "d", "text": None, "lang": "xx"},
        {"id": "5", "text": "five", "lang": "en"},
    ]
    campaign, report = create(project, write_parquet(tmp_path / "c.parquet", rows))
    assert report.created == 5 and report.failed == 1
    made = units(campaign)
    assert made["c"].source_path == "c.parquet#2@g1:0:text"
    assert made["5"].source_path == "c.parquet#4@g2:0:text"
    assert "no text" in made["d"].error_message
    assert texts(campaign) == {**{r["id"]: r["text"] for r in ROWS}, "5": "five"}


AWKWARD = [
    {"id": "plain", "text": "An ordinary row.", "lang": "en"},
    {"id": "  padded  ", "text": "  (a bracket) after spaces", "lang": None},
    {"id": "cjk", "text": "港は月曜日に再開した。", "lang": "ja"},
    {"id": "accent", "text": "\u00e9t\u00e9 \u2014 ao\u00fbt", "lang": "fr"},
    {"id": "bom", "text": "\ufeffafter a byte order mark", "lang": "en"},
    {"id": "empty", "text": "", "lang": "en"},
    {"id": "blank", "text": " \t\n ", "lang": "en"},
    {"id": "invisible", "text": "\u200b\u200d\x01", "lang": "en"},
    {"id": "nul", "text": "text\x00with a NUL", "lang": "en"},
    {"id": "nul-late", "text": "x" * 9000 + "\x00", "lang": "en"},
    {"id": "none", "text": None, "lang": "en"},
    {"id": None, "text": "no id", "lang": "en"},
    {"id": "   ", "text": "a blank id", "lang": "en"},
    {"id": "x" * 1001, "text": "an id too long", "lang": "en"},
    {"id": "nul\x00id", "text": "an id with a NUL", "lang": "en"},
    {"id": "long-category", "text": "a long category", "lang": "c" * 201},
    {"id": "plain", "text": "the same id again", "lang": "en"},
    {"id": "last", "text": "~tilde first, still imported", "lang": "en"},
]


def _made(campaign) -> list[tuple]:
    """What a user sees of each unit, the file's own name and row numbers left out."""
    import re

    where = re.compile(r"\bc\.(?:jsonl|parquet):\d+")
    return [
        (
            where.sub("ROW", u.uid),
            u.state,
            u.error_class,
            where.sub("ROW", u.error_message),
            u.size,
            u.sha256,
            u.category,
        )
        for u in Unit.objects.filter(campaign=campaign).order_by("pk")
    ]


def test_parquet_and_jsonl_of_the_same_rows_make_the_same_units(project, tmp_path):
    """Rows of Parquet (read a column at a time) and of JSONL (a line at a
    time): the same ids, checksums, categories and refusals, row for row."""
    for folder in ("j", "p", "n"):
        (tmp_path / folder).mkdir()
    from_jsonl, report_jsonl = create(
        project, write_jsonl(tmp_path / "j" / "c.jsonl", AWKWARD), name="j", category="lang"
    )
    parquet = write_parquet(tmp_path / "p" / "c.parquet", AWKWARD, row_group_size=5)
    from_parquet, report_parquet = create(project, parquet, name="p", category="lang")
    made = _made(from_parquet)
    assert made == _made(from_jsonl)
    assert report_parquet.as_dict()["failed"] == report_jsonl.as_dict()["failed"] == 10
    assert report_parquet.duplicates == report_jsonl.duplicates == 1
    states = {uid: state for uid, state, *_ in made}
    pending = {"plain", "padded", "cjk", "accent", "bom", "nul-late", "last"}
    assert {uid for uid, state in states.items() if state == UnitState.PENDING} == pending
    # Integer ids, as a Parquet id column often holds.
    numbered = write_parquet(
        tmp_path / "n" / "c.parquet", [{"id": 7, "text": "seven"}, {"id": 8, "text": " "}]
    )
    campaign, _ = create(project, numbered, name="n")
    assert [(u.uid, u.state) for u in Unit.objects.filter(campaign=campaign).order_by("pk")] == [
        ("7", UnitState.PENDING),
        ("8", UnitState.FAILED),
    ]


def test_a_datasets_save_to_disk_folder(project, tmp_path):
    rows = [{"id": f"r{i}", "text": f"text {i}", "label": f"l{i % 2}"} for i in range(7)]
    campaign, report = create(project, save_to_disk(tmp_path / "ds", rows), category="label")
    assert report.created == 7
    made = units(campaign)
    assert list(made) == [f"r{i}" for i in range(7)]
    assert made["r5"].source_path == "data-00001-of-00002.arrow#1@b0:1:text"
    assert made["r5"].category == "l1"
    assert texts(campaign) == {f"r{i}": f"text {i}" for i in range(7)}


def test_a_missing_column_refuses_the_create_and_leaves_nothing(project, tmp_path):
    path = write_parquet(tmp_path / "c.parquet", ROWS)
    with pytest.raises(Exception, match="no column 'body'"):
        create(project, path, text="body")
    assert not Campaign.objects.filter(name="recs").exists()


def test_bounded_reads_and_the_digest_of_the_whole_text(project, tmp_path):
    long = "word " * 1000
    campaign, _ = create(project, write_jsonl(tmp_path / "c.jsonl", [{"id": "x", "text": long}]))
    unit = Unit.objects.get(campaign=campaign)
    root = Path(campaign.input_root)
    cut = read_bytes(root, unit.source_path, limits=ReadLimits(keep=100, digest=True))
    assert len(cut) == 100 and cut.size == len(long) and cut.sha256 == unit.sha256
    with pytest.raises(InputError, match="over max_input_bytes"):
        read_bytes(root, unit.source_path, limits=ReadLimits(max_bytes=10))


def test_reimport_adds_new_rows_marks_changed_and_reports_removed(project, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", ROWS + [{"id": "d", "text": "to be removed"}])
    campaign, _ = create(project, path)
    Unit.objects.filter(campaign=campaign, uid="a").update(state=UnitState.SUCCEEDED)
    # a: done, changed; b: pending, moved (a longer row before it); c: pending,
    # changed; d: gone; e: new.
    write_jsonl(
        path,
        [
            {"id": "e", "text": "a new row, first in the file"},
            {"id": "a", "text": "The harbour reopened on Tuesday."},
            ROWS[1],
            {"id": "c", "text": "changed before it ran"},
        ],
    )
    report = setup.campaign_import(campaign=campaign)
    assert (report.created, report.existing, report.changed, report.removed) == (1, 3, 2, 1)
    made = units(campaign)
    assert made["a"].state == UnitState.FAILED
    assert made["a"].error_class == ErrorClass.INPUT_CHANGED
    assert made["d"].state == UnitState.FAILED
    assert made["d"].error_class == ErrorClass.INPUT_MISSING
    assert any(line.startswith("d: its row is no longer") for line in report.problems)
    assert texts(campaign) == {
        "b": ROWS[1]["text"],
        "c": "changed before it ran",
        "e": "a new row, first in the file",
    }
    assert made["c"].sha256 == sha("changed before it ran")
    # As for a file: a done unit's changed row runs again after resume --retry-failed.
    control.campaign_resume(campaign=campaign, retry_failed=True)
    a = Unit.objects.get(campaign=campaign, uid="a")
    assert a.sha256 == sha("The harbour reopened on Tuesday.")
    assert a.state != UnitState.FAILED
    assert Unit.objects.get(campaign=campaign, uid="d").state == UnitState.FAILED


def test_a_row_moved_without_a_reimport_fails_input_changed(project, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", ROWS)
    campaign, _ = create(project, path)
    unit = Unit.objects.get(campaign=campaign, uid="b")
    write_jsonl(path, ROWS[:1])
    with pytest.raises(InputError) as raised:
        read_bytes(Path(campaign.input_root), unit.source_path, limits=WHOLE)
    assert raised.value.error_class == ErrorClass.INPUT_CHANGED


def test_the_command_creates_a_record_campaign(project, tmp_path, capsys):
    path = write_parquet(tmp_path / "c.parquet", ROWS)
    call_command(
        "campaign",
        "create",
        "cli-recs",
        "--processor",
        "text-embedding",
        "--records",
        str(path),
        "--text-column",
        "text",
        "--id-column",
        "id",
        "--category-column",
        "lang",
        "--project",
        project.name,
    )
    assert "3 units, 0 failed" in capsys.readouterr().out
    campaign = Campaign.objects.get(name="cli-recs")
    assert campaign.records["columns"] == {"text": "text", "id": "id", "category": "lang"}
    assert sorted(units(campaign)) == ["a", "b", "c"]


def test_a_large_parquet_imports_a_row_group_at_a_time(project, tmp_path):
    """The reader holds a record batch of a row group, never the file: the
    Arrow memory it allocates peaks far below the file's decoded text."""
    path = tmp_path / "large.parquet"
    text = "lorem ipsum dolor sit amet " * 40  # ~1 kB a row
    rows, groups = 40_000, 10
    with pq.ParquetWriter(path, pa.schema([("id", pa.string()), ("text", pa.string())])) as w:
        for g in range(groups):
            ids = [f"r{g}-{i}" for i in range(rows // groups)]
            w.write_table(pa.table({"id": ids, "text": [f"{i} {text}" for i in ids]}))
    decoded = rows * len(text)  # ~43 MB of text
    pool = pa.default_memory_pool()
    peak = 0
    from campaigns.intake import records as records_module

    real = records_module._batch_rows

    def watched(*args):
        nonlocal peak
        peak = max(peak, pool.bytes_allocated())
        yield from real(*args)

    records_module._batch_rows = watched
    try:
        _, report = create(project, path)
    finally:
        records_module._batch_rows = real
    assert report.created == rows and report.failed == 0
    assert 0 < peak < decoded / 5, (peak, decoded)


def test_the_unit_page_preview_shows_the_row_text(project, tmp_path):
    from campaigns.review.previews import input_preview

    campaign, _ = create(project, write_parquet(tmp_path / "c.parquet", ROWS))
    unit = Unit.objects.get(campaign=campaign, uid="c")
    preview = input_preview(unit=unit, campaign=campaign, params={})
    assert (preview.kind, preview.text) == ("text", ROWS[2]["text"])


@pytest.mark.usefixtures("deadline")  # a wait that comes back fails, never hangs the run
def test_a_fifo_in_the_records_file_s_place_is_refused_not_waited_on(project, tmp_path):
    import os

    from campaigns.verify.reconcile import Verdict, campaign_verify

    path = write_jsonl(tmp_path / "d.jsonl", ROWS)
    campaign, _ = create(project, path)
    unit = Unit.objects.get(campaign=campaign, uid="b")
    path.unlink()
    os.mkfifo(path)  # nobody ever writes to it: a blocking open would wait for ever

    with pytest.raises(InputError) as raised:
        read_bytes(Path(campaign.input_root), unit.source_path, limits=WHOLE)
    assert raised.value.error_class == ErrorClass.INPUT_INVALID
    assert "FIFO" in raised.value.message
    for deep in (False, True):
        report = campaign_verify(campaign=campaign, deep=deep)
        assert report.counts[Verdict.INPUT_INVALID] == len(ROWS)


def test_a_link_out_of_the_corpus_among_record_files_refuses_the_create_readably(project, tmp_path):
    from django.core.management.base import CommandError

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    write_jsonl(corpus / "a.jsonl", ROWS)
    elsewhere = write_jsonl(tmp_path / "secret.jsonl", [{"id": "s", "text": "not yours"}])
    (corpus / "b.jsonl").symlink_to(elsewhere)

    # the command says why, in a line, and leaves nothing behind
    with pytest.raises(CommandError, match=r"b\.jsonl: .*leaves the corpus folder"):
        call_command(
            "campaign",
            "create",
            "linked",
            "--processor",
            "text-embedding",
            "--records",
            str(corpus),
            "--text-column",
            "text",
            "--project",
            project.name,
        )
    assert not Campaign.objects.filter(name="linked").exists()
    assert not Unit.objects.filter(uid="s").exists()
