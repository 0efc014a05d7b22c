"""Record sources at their edges (campaigns/intake/records.py, record_reads.py,
docs/importing.md "Records"): CSV headers and line ends, file names that look
like a row's place, rows read through the descriptor that was checked, and
the memory a compressed file's reads take."""

from __future__ import annotations

import gzip
import os
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from campaigns.intake import record_reads
from campaigns.intake.inputs import WHOLE, InputError, read_bytes
from campaigns.intake.manifests import LINE_MAX as MANIFEST_LINE_MAX
from campaigns.intake.manifests import ManifestError
from campaigns.intake.records import parse_locator
from campaigns.models import ErrorClass, Unit, UnitState
from campaigns.runs import setup
from tests.campaigns.test_records import ROWS, create, sha, texts, units, write_jsonl

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _forget_decoded_records():
    """What a process keeps of record files (decoded batches and groups, gz
    indexes) dropped after each test: other tests count Arrow's allocations."""
    yield
    record_reads._decoded.clear()
    record_reads._files.clear()
    record_reads._streams.clear()


def write_csv(path: Path, text: str, newline="\n") -> Path:
    path.write_bytes(text.replace("\n", newline).encode())
    return path


# --- 1. A CSV header is read only as far as a manifest line may be ---------------


def test_a_csv_whose_first_line_is_huge_is_refused_in_one_line_without_holding_it(
    project, tmp_path
):
    path = tmp_path / "c.csv"
    path.write_bytes(b"x" * (4 << 20))  # 4 MiB and no line end: no header at all
    tracemalloc.start()
    try:
        with pytest.raises(ManifestError) as raised:
            create(project, path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    message = str(raised.value)
    assert "header" in message and f"{MANIFEST_LINE_MAX:,} bytes" in message
    assert len(message) < 300
    assert peak < 2 << 20
    assert not Unit.objects.exists()


def test_a_worker_reading_a_csv_whose_header_became_huge_fails_the_row_without_holding_it(
    project, tmp_path
):
    path = write_csv(tmp_path / "c.csv", "id,text\na,first text\nb,second text\n")
    campaign, report = create(project, path)
    assert report.created == 2
    unit = Unit.objects.get(campaign=campaign, uid="b")
    path.write_bytes(b"y" * (8 << 20))
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as raised:
            read_bytes(Path(campaign.input_root), unit.source_path, limits=WHOLE)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert raised.value.error_class == ErrorClass.INPUT_CHANGED
    assert "header" in raised.value.message
    assert peak < 2 << 20


def test_rows_of_a_file_found_bad_once_fail_without_piling_up_tracebacks(project, tmp_path):
    # The process keeps what it found of a record file (a header too long);
    # each row's read raises its own exception, never the kept one again
    # (an exception raised again keeps every earlier raise's frames).
    path = write_csv(tmp_path / "c.csv", "id,text\na,first text\nb,second text\n")
    campaign, _ = create(project, path)
    units = list(Unit.objects.filter(campaign=campaign).order_by("pk"))
    path.write_bytes(b"y" * (1 << 20))
    raised = []
    for unit in units * 3:
        with pytest.raises(InputError) as caught:
            read_bytes(Path(campaign.input_root), unit.source_path, limits=WHOLE)
        raised.append(caught.value)
    assert {e.error_class for e in raised} == {ErrorClass.INPUT_CHANGED}
    kept = [v for v in record_reads._files.values() if isinstance(v, Exception)]
    assert kept and all(v.__traceback__ is None for v in kept)


# --- 2. Lines that end in CR alone -------------------------------------------------


@pytest.mark.parametrize("name", ["c.csv", "c.jsonl"])
def test_a_file_with_cr_only_line_ends_is_refused_with_the_remedy(project, tmp_path, name):
    if name.endswith(".csv"):
        path = write_csv(tmp_path / name, "id,text\na,one\nb,two\n", newline="\r")
    else:
        path = write_jsonl(tmp_path / name, ROWS)
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r"))
    with pytest.raises(ManifestError, match="CR alone"):
        create(project, path)
    assert not Unit.objects.exists()


def test_crlf_line_ends_are_read_as_usual(project, tmp_path):
    path = write_csv(tmp_path / "c.csv", "id,text\na,one\nb,two\n", newline="\r\n")
    campaign, report = create(project, path)
    assert report.created == 2 and report.failed == 0
    assert texts(campaign) == {"a": "one", "b": "two"}


# --- 8. File names that hold #, @, + or : ------------------------------------------


ODD_NAMES = ["a#1@0+5:x.jsonl", "we@b+c.csv", "d:1#2.parquet", "x#3@g0:0:t/b+c.arrow"]


def test_record_files_whose_names_hold_locator_characters_read_their_own_rows(project, tmp_path):
    corpus = tmp_path / "corpus"
    for name in ODD_NAMES:
        path = corpus / name
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [{"id": f"{name}/{r['id']}", "text": f"{r['text']} ({name})"} for r in ROWS]
        if name.endswith(".jsonl"):
            write_jsonl(path, rows)
        elif name.endswith(".csv"):
            write_csv(path, "id,text\n" + "".join(f"{r['id']},{r['text']}\n" for r in rows))
        elif name.endswith(".parquet"):
            pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)
        else:
            table = pa.Table.from_pylist(rows)
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                w.write_table(table, max_chunksize=2)
    campaign, report = create(project, corpus)
    assert report.created == 4 * len(ROWS) and report.failed == 0
    for unit in units(campaign).values():
        located = parse_locator(unit.source_path)
        assert located is not None and unit.uid.startswith(located.file + "/")
    assert texts(campaign) == {
        f"{n}/{r['id']}": f"{r['text']} ({n})" for n in ODD_NAMES for r in ROWS
    }


def test_a_plain_file_named_like_a_row_s_place_fails_its_row_instead_of_reading_a_record(
    project, tmp_path
):
    corpus = tmp_path / "texts"
    corpus.mkdir()
    write_jsonl(corpus / "notes.jsonl", ROWS)
    odd = "notes.jsonl#1@0+20:text"
    (corpus / odd).write_text("a plain text file")
    (corpus / "plain.txt").write_text("another text file")
    campaign, report = setup.campaign_create(
        name="files", processor="text-embedding", project=project, input_folder=corpus
    )
    made = units(campaign)
    assert made[odd].state == UnitState.FAILED
    assert "reads as a row of a record file" in made[odd].error_message
    assert any(line.startswith(odd) for line in report.problems)
    assert made["plain.txt"].state == UnitState.PENDING


# --- 6. A row is read through the descriptor that was checked ----------------------


def _rows(marker: str) -> list[dict]:
    return [{"id": r["id"], "text": f"{marker} {r['text']}"} for r in ROWS]


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz", "c.csv", "c.parquet", "c.arrow"])
def test_a_file_swapped_after_its_check_is_not_read_in_place_of_the_checked_one(
    project, tmp_path, monkeypatch, name
):
    def write(path: Path, rows) -> Path:
        if ".jsonl" in name:
            return write_jsonl(path, rows)
        if name.endswith(".csv"):
            return write_csv(path, "id,text\n" + "".join(f"{r['id']},{r['text']}\n" for r in rows))
        table = pa.Table.from_pylist(rows)
        if name.endswith(".parquet"):
            pq.write_table(table, path, row_group_size=2)
        else:
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
                w.write_table(table, max_chunksize=2)
        return path

    path = write(tmp_path / name, _rows("old"))
    campaign, _ = create(project, path)
    other = write(tmp_path / f"other-{name}", _rows("new"))  # the same length, other text
    checked = record_reads.input_fd

    def check_then_swap(root, source, real_root=None):
        fd = checked(root, source, real_root)
        os.replace(other, path)  # the path now names another file
        return fd

    monkeypatch.setattr(record_reads, "input_fd", check_then_swap)
    unit = Unit.objects.get(campaign=campaign, uid="b")
    data = read_bytes(Path(campaign.input_root), unit.source_path, limits=WHOLE)
    assert data.decode() == "old " + ROWS[1]["text"]
    assert data.sha256 == unit.sha256 == sha(data.decode())


def test_gzip_index_reads_any_offset_of_a_multi_member_file(tmp_path):
    from campaigns.intake.gzip_index import GzipIndex

    data = b"".join(f"line {i:06d} ".encode() * 3 + b"\n" for i in range(40_000))
    half = len(data) // 2
    path = tmp_path / "m.gz"
    path.write_bytes(gzip.compress(data[:half]) + gzip.compress(data[half:]))
    index = GzipIndex(os.open(path, os.O_RDONLY), path.stat().st_size)
    try:
        for offset in [0, half - 5, len(data) - 10, 1234, half + 77, 900_000, 17, len(data)]:
            assert index.read(offset, 40) == data[offset : offset + 40]
        assert len(index.points) > 2  # seek points were made on the way
    finally:
        index.close()


# --- 3. A row good at first import that fails on re-import --------------------------


@pytest.mark.parametrize("state", [UnitState.SUCCEEDED, UnitState.PENDING])
def test_a_row_that_turns_bad_on_reimport_is_reported_and_its_unit_fails(project, tmp_path, state):
    path = write_jsonl(tmp_path / "c.jsonl", ROWS)
    campaign, _ = create(project, path)
    Unit.objects.filter(campaign=campaign, uid__in=["a", "b"]).update(state=state)
    lines = path.read_text().splitlines()
    lines[0] = '{"id": "a", "text": ""}'  # emptied
    lines[1] = '{"id": "b", "text": ["not", "text"]}'  # no longer text
    path.write_text("\n".join(lines) + "\n")

    report = setup.campaign_import(campaign=campaign)

    assert report.changed == 2 and report.created == 0
    made = units(campaign)
    for uid, reason in [("a", "empty text"), ("b", "not text")]:
        assert made[uid].state == UnitState.FAILED
        assert made[uid].error_class == ErrorClass.INPUT_INVALID
        assert "changed since import and now fails" in made[uid].error_message
        assert reason in made[uid].error_message
        assert any(
            line.startswith(f"{uid}: ") and "now fails" in line and reason in line
            for line in report.problems
        )
    assert made["c"].state == UnitState.PENDING


# --- 7. Without an id column, rows inserted shift every later row ------------------


def test_without_an_id_column_rows_shifted_by_an_insert_are_changed_not_given_other_output(
    project, tmp_path
):
    path = write_jsonl(tmp_path / "c.jsonl", ROWS)
    campaign, _ = create(project, path, id=None)
    Unit.objects.filter(campaign=campaign).update(state=UnitState.SUCCEEDED)
    before = {u.uid: u.sha256 for u in units(campaign).values()}
    write_jsonl(path, [{"text": "an inserted first row"}, *ROWS])

    # Read without a re-import: the row at each recorded place is another now.
    root = Path(campaign.input_root)
    for unit in units(campaign).values():
        try:
            data = read_bytes(root, unit.source_path, limits=WHOLE)
        except InputError as exc:
            assert exc.error_class == ErrorClass.INPUT_CHANGED
        else:
            assert data.sha256 != unit.sha256  # the worker's check fails it

    report = setup.campaign_import(campaign=campaign)
    made = units(campaign)
    # c.jsonl:1..3 now hold other texts: changed, failed until retried; :4 is new.
    assert report.changed == 3 and report.created == 1
    for uid in before:
        assert made[uid].state == UnitState.FAILED
        assert made[uid].error_class == ErrorClass.INPUT_CHANGED
    assert made["c.jsonl:4"].sha256 == before["c.jsonl:3"]
    assert any("without an id column" in line for line in report.problems)


def test_a_file_gone_before_a_reimport_is_reported_and_its_unit_fails(project, tmp_path):
    corpus = tmp_path / "texts"
    corpus.mkdir()
    (corpus / "a.txt").write_text("some text")
    (corpus / "b.txt").write_text("other text")
    manifest = write_csv(tmp_path / "m.csv", "path\na.txt\nb.txt\n")
    campaign, _ = setup.campaign_create(
        name="files",
        processor="text-embedding",
        project=project,
        manifest=manifest,
        input_root=corpus,
    )
    Unit.objects.filter(campaign=campaign).update(state=UnitState.SUCCEEDED)
    (corpus / "a.txt").unlink()
    report = setup.campaign_import(campaign=campaign, manifest=manifest)
    assert report.changed == 1
    a = Unit.objects.get(campaign=campaign, uid="a.txt")
    assert a.state == UnitState.FAILED and a.error_class == ErrorClass.INPUT_MISSING
    assert "now fails: input file not found" in a.error_message
    assert Unit.objects.get(campaign=campaign, uid="b.txt").state == UnitState.SUCCEEDED


# --- 5. Memory of compressed Arrow files and concurrent Parquet reads --------------


@pytest.mark.parametrize("layout", ["file", "stream"])
def test_a_row_of_a_compressed_arrow_file_decompresses_its_batch_alone(project, tmp_path, layout):
    rows = [{"id": f"r{i}", "text": f"row {i} " + "words " * 40} for i in range(20_000)]
    table = pa.Table.from_pylist(rows)
    path = tmp_path / "c.arrow"
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    new = pa.ipc.new_file if layout == "file" else pa.ipc.new_stream
    with pa.OSFile(str(path), "wb") as sink, new(sink, table.schema, options=options) as writer:
        writer.write_table(table, max_chunksize=500)
    assert path.stat().st_size < table.nbytes / 5  # compressed well
    campaign, report = create(project, path)
    assert report.created == len(rows)
    unit = Unit.objects.get(campaign=campaign, uid="r12345")
    record_reads._files.clear()
    record_reads._decoded.clear()
    before = pa.total_allocated_bytes()
    data = read_bytes(Path(campaign.input_root), unit.source_path, limits=WHOLE)
    held = pa.total_allocated_bytes() - before
    assert data.decode() == rows[12345]["text"]
    assert held < table.nbytes / 10  # its batch, not the whole file decompressed


def test_threads_wanting_one_parquet_row_group_decode_it_once(project, tmp_path, monkeypatch):
    import threading

    rows = [{"id": f"r{i}", "text": f"row {i} " + "words " * 20} for i in range(8_000)]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=4_000)
    campaign, _ = create(project, path)
    paths = dict(Unit.objects.filter(campaign=campaign).values_list("uid", "source_path"))
    decodes = []
    real = pq.ParquetFile.read_row_group

    def counted(self, *args, **kwargs):
        decodes.append(args[0] if args else kwargs.get("i"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", counted)
    record_reads._decoded.clear()
    root = Path(campaign.input_root)
    start = threading.Barrier(8)
    got = {}

    def read(n: int) -> None:
        uid = f"r{n * 450 + 7}"
        start.wait()
        got[uid] = read_bytes(root, paths[uid], limits=WHOLE).decode()

    threads = [threading.Thread(target=read, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got == {uid: rows[int(uid[1:])]["text"] for uid in got} and len(got) == 8
    assert sorted(decodes) == [0]  # one decode of group 0, all eight rows read from it


def test_a_parquet_row_group_of_many_rows_is_read_a_slice_at_a_time(project, tmp_path, monkeypatch):
    # Writers' defaults put up to a million rows in a group: a row of one is
    # read from its slice, never from the whole group's text decoded at once.
    # (Slices of 4,096 rows, as by default: 60,000 rows make a group of many.)
    monkeypatch.setattr(record_reads, "SLICE_ROWS", 4096, raising=False)
    rows = [{"id": f"r{i}", "text": f"row {i} " + "words " * 60} for i in range(60_000)]
    table = pa.Table.from_pylist(rows)
    path = tmp_path / "c.parquet"
    pq.write_table(table, path, row_group_size=len(rows))  # one group
    assert pq.ParquetFile(path).num_row_groups == 1
    campaign, report = create(project, path)
    assert report.created == len(rows)
    paths = dict(Unit.objects.filter(campaign=campaign).values_list("uid", "source_path"))
    root = Path(campaign.input_root)
    text_bytes = table.column("text").nbytes
    record_reads._files.clear()
    record_reads._decoded.clear()
    before = pa.total_allocated_bytes()
    assert read_bytes(root, paths["r45678"], limits=WHOLE).decode() == rows[45678]["text"]
    held = pa.total_allocated_bytes() - before
    assert held < text_bytes / 3  # its slice (and the stream's buffers), not the group
    # Rows in any order, backwards across slices included, read right.
    for n in (59_999, 3, 20_000, 4095, 4096, 45_679, 0):
        assert read_bytes(root, paths[f"r{n}"], limits=WHOLE).decode() == rows[n]["text"]


def test_a_parquet_batch_across_a_large_group_reads_every_row(project, tmp_path):
    rows = [{"id": f"r{i}", "text": f"row {i} {'w' * (i % 97)}"} for i in range(40_000)]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=len(rows))
    campaign, _ = create(project, path)
    units_ = list(Unit.objects.filter(campaign=campaign).order_by("-id")[::997])
    places = [parse_locator(u.source_path) for u in units_]
    got = record_reads.read_records(Path(campaign.input_root), places, WHOLE)
    assert [bytes(g).decode() for g in got] == [rows[int(u.uid[1:])]["text"] for u in units_]


def large_groups(project, tmp_path, groups=2, rows_a_group=20_000):
    rows = [
        {"id": f"r{i}", "text": f"row {i} {'w' * (i % 61)}"} for i in range(groups * rows_a_group)
    ]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=rows_a_group)
    campaign, _ = create(project, path)
    units_ = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    return rows, path, campaign, units_


def test_a_slice_is_cut_by_row_number_whatever_batches_pyarrow_hands_over(
    project, tmp_path, monkeypatch
):
    # pyarrow hands over smaller batches where a batch's text would pass 2 GiB:
    # here every batch comes in uneven pieces, and each row read is still its own.
    rows, _, campaign, units_ = large_groups(project, tmp_path, groups=1, rows_a_group=20_000)
    real = pq.ParquetFile.iter_batches

    def uneven(self, *args, **kwargs):
        for batch in real(self, *args, **kwargs):
            cut = max(1, batch.num_rows // 3 - 17)
            yield batch.slice(0, cut)
            yield batch.slice(cut)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", uneven)
    root = Path(campaign.input_root)
    for n in (0, 4095, 4096, 5000, 12_289, 19_999, 1, 8191, 8192):
        assert (
            read_bytes(root, units_[f"r{n}"].source_path, limits=WHOLE).decode()
            == (rows[n]["text"])
        )


def test_streams_of_two_large_groups_kept_from_one_read_do_not_disturb_each_other(
    project, tmp_path, monkeypatch
):
    import threading

    monkeypatch.setattr(record_reads, "SLICE_ROWS", 4096, raising=False)
    rows, _, campaign, units_ = large_groups(project, tmp_path)
    root = Path(campaign.input_root)

    def read(n: int) -> str:
        place = parse_locator(units_[f"r{n}"].source_path)
        got = record_reads.read_records(root, [place], WHOLE)[0]
        return str(got) if isinstance(got, InputError) else bytes(got).decode()

    # One batch's read makes both groups' streams, from one opened file.
    first = [parse_locator(units_[uid].source_path) for uid in ("r5", "r20005")]
    assert [bytes(r).decode() for r in record_reads.read_records(root, first, WHOLE)] == [
        rows[5]["text"],
        rows[20_005]["text"],
    ]
    # Then each stream goes on in turn, slice after slice.
    for n in range(4100, 20_000, 4096):
        assert [read(n), read(20_000 + n)] == [rows[n]["text"], rows[20_000 + n]["text"]]
    # And from several threads at once, the slices dropped from the cache.
    wrong: list[str] = []

    def reader(offset: int) -> None:
        for step in range(0, 20_000, 1999):
            record_reads._decoded.clear()
            if read(offset + step) != rows[offset + step]["text"]:
                wrong.append(f"r{offset + step}")

    threads = [threading.Thread(target=reader, args=(g * 20_000,)) for g in (0, 1, 0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == []


def test_readers_going_forward_through_two_parts_of_a_group_keep_a_stream_each(
    project, tmp_path, monkeypatch
):
    # Planning's weighing threads each read their share of the file forward: on
    # one stream each turn would start the group over from its first row.
    rows, _, campaign, units_ = large_groups(project, tmp_path, groups=1, rows_a_group=40_000)
    passes = []
    real = pq.ParquetFile.iter_batches

    def counted(self, *args, **kwargs):
        passes.append(kwargs.get("row_groups"))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "iter_batches", counted)
    root = Path(campaign.input_root)
    for n in range(0, 20_000, 2_000):  # two readers' turns, each going forward
        for at in (n, 20_000 + n):
            got = read_bytes(root, units_[f"r{at}"].source_path, limits=WHOLE).decode()
            assert got == rows[at]["text"]
    assert len(passes) <= 2  # a pass each, not one a turn


def test_passes_over_large_groups_are_few_in_a_process_whatever_the_groups(
    project, tmp_path, monkeypatch
):
    # A pass keeps about a slice's text in pyarrow's buffers besides the cache.
    monkeypatch.setattr(record_reads, "SLICE_ROWS", 4096, raising=False)
    rows, _, campaign, units_ = large_groups(project, tmp_path, groups=6, rows_a_group=9_000)
    root = Path(campaign.input_root)
    for turn in range(3):
        for group in range(6):
            n = group * 9_000 + turn * 4_096
            assert (
                read_bytes(root, units_[f"r{n}"].source_path, limits=WHOLE).decode()
                == (rows[n]["text"])
            )
    cursors = [kept for kept in record_reads._files.values() if hasattr(kept, "_streams")]
    assert len(cursors) == 6
    assert sum(len(cursor._streams) for cursor in cursors) <= 2


def test_rows_failed_in_a_batch_keep_no_reader_open(project, tmp_path):
    import gc

    rows, path, campaign, units_ = large_groups(project, tmp_path)
    root = Path(campaign.input_root)
    places = [parse_locator(units_[uid].source_path) for uid in ("r3", "r25000")]
    record_reads.read_records(root, places, WHOLE)  # a pass over each group kept
    with open(path, "r+b") as fh:  # then the file cut short in place
        fh.truncate(path.stat().st_size // 2)
    gc.collect()
    gc.disable()  # what reference counting alone frees
    try:
        opened = len(os.listdir("/proc/self/fd"))
        got = record_reads.read_records(
            root, [parse_locator(units_[f"r{n}"].source_path) for n in (9000, 33000)], WHOLE
        )
        assert all(isinstance(g, InputError) for g in got)
        record_reads._files.clear()
        record_reads._streams.clear()
        record_reads._decoded.clear()
        del got
        assert len(os.listdir("/proc/self/fd")) < opened  # the cursors' descriptors closed
    finally:
        gc.enable()


def test_a_large_group_cut_short_during_a_batch_fails_its_rows_not_the_batch(
    project, tmp_path, monkeypatch
):
    rows, path, campaign, units_ = large_groups(project, tmp_path)
    root = Path(campaign.input_root)
    places = [parse_locator(units_[uid].source_path) for uid in ("r3", "r9000", "r25000")]
    real = record_reads._as_input
    read = []

    def cut_after_the_first(text, located, limits):
        if not read:  # the file cut in place (the same file, its footer gone) mid-batch
            with open(path, "r+b") as fh:
                fh.truncate(path.stat().st_size // 3)
        read.append(located)
        return real(text, located, limits)

    monkeypatch.setattr(record_reads, "_as_input", cut_after_the_first)
    got = record_reads.read_records(root, places, WHOLE)  # returns: nothing raised
    assert bytes(got[0]).decode() == rows[3]["text"]
    # A row whose bytes lie before the cut may still read whole; one past it fails alone.
    assert isinstance(got[1], InputError) or bytes(got[1]).decode() == rows[9000]["text"]
    assert isinstance(got[2], InputError), got[2]
    assert got[2].error_class in (ErrorClass.INPUT_CHANGED, ErrorClass.INPUT_UNREADABLE)


def test_a_parquet_file_rewritten_without_the_text_column_fails_its_rows_alone(project, tmp_path):
    rows = [{"id": f"r{i}", "text": f"row {i}"} for i in range(6)]
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
    campaign, _ = create(project, path)
    places = [parse_locator(u.source_path) for u in Unit.objects.filter(campaign=campaign)]
    renamed = [{"id": r["id"], "body": r["text"]} for r in rows]
    pq.write_table(pa.Table.from_pylist(renamed), path, row_group_size=3)
    got = record_reads.read_records(Path(campaign.input_root), places, WHOLE)
    assert [g.error_class for g in got] == [ErrorClass.INPUT_CHANGED] * 6
    assert "no column 'text'" in str(got[0])


def test_gzip_index_reads_from_many_threads_at_once(tmp_path):
    import random
    import threading

    from campaigns.intake.gzip_index import GzipIndex

    data = b"".join(f"row {i:07d} {'x' * (i % 90)}\n".encode() for i in range(60_000))
    path = tmp_path / "t.gz"
    path.write_bytes(gzip.compress(data))
    index = GzipIndex(os.open(path, os.O_RDONLY), path.stat().st_size)
    wrong = []

    def reader(seed: int) -> None:
        rng = random.Random(seed)
        for _ in range(60):
            offset = rng.randrange(len(data))
            if index.read(offset, 64) != data[offset : offset + 64]:
                wrong.append(offset)

    threads = [threading.Thread(target=reader, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    index.close()
    assert wrong == []


def test_zeros_padding_between_gzip_members_read_as_gzip_reads_them(tmp_path):
    from campaigns.intake.gzip_index import GzipIndex

    first = b"".join(b'{"id":"%d","text":"t"}\n' % i for i in range(10))
    second = b"".join(b'{"id":"x%d","text":"t"}\n' % i for i in range(10))
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(gzip.compress(first) + b"\0" * 8 + gzip.compress(second) + b"\0" * 4)
    with gzip.open(path) as whole:
        assert whole.read() == first + second  # what the import reads
    index = GzipIndex(os.open(path, os.O_RDONLY), path.stat().st_size)
    try:
        assert index.read(len(first), 10) == second[:10]
        assert index.read(len(first) + len(second) - 5, 5) == second[-5:]
    finally:
        index.close()


def test_passes_stay_few_after_rows_carrying_parameters_were_read(project, tmp_path, monkeypatch):
    """What a process keeps grows with the columns its kept passes read, and
    only while they are kept: rows of another campaign read with parameter
    columns earlier leave the bound on text-only passes as it was."""
    from campaigns.intake.records import RecordColumns, record_rows

    (tmp_path / "p.jsonl").write_text('{"id": "1", "q": "hi", "s": "be brief", "n": 3}\n')
    columns = RecordColumns(text="q", id="id", params=(("system_prompt", "s"), ("seed", "n")))
    row = next(iter(record_rows(tmp_path, ["p.jsonl"], columns)))
    assert b'"system_prompt":"be brief"' in read_bytes(tmp_path, row.source_path)
    (tmp_path / "big").mkdir()
    test_passes_over_large_groups_are_few_in_a_process_whatever_the_groups(
        project, tmp_path / "big", monkeypatch
    )
