"""A batch's record rows read together (campaigns/intake/record_reads.py
`read_records`): each row as `read_bytes` reads it alone, each record file
opened and checked once, and a row or file that cannot be read failing
alone."""

from __future__ import annotations

import csv
import os
import random
from pathlib import Path

import pytest

from campaigns.intake import inputs
from campaigns.intake.inputs import WHOLE, InputBytes, InputError, ReadLimits, read_bytes
from campaigns.intake.record_reads import read_records
from campaigns.intake.records import parse_locator
from campaigns.models import ErrorClass, Unit
from gpuworker.runner.read import rows_of
from tests.campaigns.test_records import create, save_to_disk, write_jsonl, write_parquet

pytestmark = pytest.mark.django_db

ROWS = [{"id": f"r{i:03d}", "text": f"row {i}: " + "wörds " * (i % 7 + 1)} for i in range(40)]


def write_csv(path: Path, rows) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=["id", "text"])
        writer.writeheader()
        writer.writerows(rows)
    return path


WRITERS = {
    "c.jsonl": write_jsonl,
    "c.jsonl.gz": write_jsonl,
    "c.csv": write_csv,
    "c.parquet": lambda path, rows: write_parquet(path, rows, row_group_size=7),
    "arrow": lambda path, rows: save_to_disk(path, rows, batch_rows=6, files=3),
}


def places(campaign) -> tuple[Path, list[Unit]]:
    return Path(campaign.input_root), list(Unit.objects.filter(campaign=campaign).order_by("pk"))


@pytest.mark.parametrize("name", list(WRITERS))
def test_a_batch_s_rows_read_together_are_the_rows_read_alone(project, tmp_path, name):
    campaign, _ = create(project, WRITERS[name](tmp_path / name, ROWS))
    root, units = places(campaign)
    random.Random(3).shuffle(units)  # a batch's order is not the file's
    limits = ReadLimits(keep=24, digest=True)
    together = read_records(root, [parse_locator(u.source_path) for u in units], limits)
    for unit, data in zip(units, together, strict=True):
        alone = read_bytes(root, unit.source_path, limits=limits)
        assert isinstance(data, InputBytes)
        assert (bytes(data), data.size, data.sha256, data.cut) == (
            bytes(alone),
            alone.size,
            alone.sha256,
            alone.cut,
        )
        assert data.sha256 == unit.sha256 or not data.cut


def test_each_record_file_is_opened_once_for_a_batch(project, tmp_path, monkeypatch):
    campaign, _ = create(project, write_jsonl(tmp_path / "c.jsonl", ROWS))
    root, units = places(campaign)
    opened: list[str] = []
    real_path = inputs._real_path
    monkeypatch.setattr(
        inputs, "_real_path", lambda path, flags=0: opened.append(path) or real_path(path, flags)
    )
    found = rows_of(root, None, [(u.pk, u.source_path) for u in units], WHOLE)
    assert [bytes(found[u.pk]).decode() for u in units] == [r["text"] for r in ROWS]
    files = [p for p in opened if not os.path.isdir(p)]
    assert len(files) == 1, files


def test_a_row_past_a_rewritten_file_s_end_fails_alone(project, tmp_path):
    path = write_jsonl(tmp_path / "c.jsonl", ROWS)
    campaign, _ = create(project, path)
    root, units = places(campaign)
    write_jsonl(path, ROWS[:-1])  # the last row is gone; the others are where they were
    read = read_records(root, [parse_locator(u.source_path) for u in units], WHOLE)
    assert [bytes(d).decode() for d in read[:-1]] == [r["text"] for r in ROWS[:-1]]
    assert isinstance(read[-1], InputError)
    assert read[-1].error_class == ErrorClass.INPUT_CHANGED
    assert "row 40" in read[-1].message


def test_an_unreadable_record_file_fails_its_own_rows_only(project, tmp_path):
    folder = tmp_path / "two"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", ROWS[:5])
    write_jsonl(folder / "b.jsonl", [{**r, "id": "b" + r["id"]} for r in ROWS[5:10]])
    campaign, _ = create(project, folder)
    root, units = places(campaign)
    (folder / "b.jsonl").unlink()
    os.mkfifo(folder / "b.jsonl")  # never waited on: refused as not a file
    read = read_records(root, [parse_locator(u.source_path) for u in units], WHOLE)
    by_file = {u.source_path.split("#")[0]: [] for u in units}
    for unit, data in zip(units, read, strict=True):
        by_file[unit.source_path.split("#")[0]].append(data)
    assert [bytes(d).decode() for d in by_file["a.jsonl"]] == [r["text"] for r in ROWS[:5]]
    assert all(isinstance(d, InputError) for d in by_file["b.jsonl"])
    assert {d.error_class for d in by_file["b.jsonl"]} == {ErrorClass.INPUT_INVALID}
