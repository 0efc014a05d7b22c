"""Record campaigns through the worker's own path: each row read at its
recorded place, checked against its import checksum, embedded under the
version's read limits, its vector as the text's own (campaigns/intake/records.py)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from campaigns.intake.records import RecordColumns
from campaigns.models import ErrorClass, Unit, UnitState
from campaigns.runs import control, setup
from campaigns.specs.builtin import TEXT_EMBEDDING
from campaigns.specs.limits import TEXT_BYTES_PER_TOKEN
from campaigns.verify.reconcile import campaign_verify
from gpuworker.processors import get_processor
from gpuworker.runner import read as runner_read
from tests.vectors import unit_vector

pytestmark = pytest.mark.django_db

DONE = (UnitState.SUCCEEDED, UnitState.NEEDS_REVIEW)
TEXTS = {
    f"doc-{i}": text
    for i, text in enumerate(
        [
            "The harbour reopened on Monday after three weeks of repairs.",
            "Le port a rouvert lundi après trois semaines de travaux.",
            "港は月曜日に再開した。",
            "def fib(n):\n    a, b = 0, 1\n    return a",
            "the harbour reopened " * 400,  # longer than max_tokens: read in part
            "Hello",
        ]
    )
}
ROWS = [{"id": uid, "text": text, "kind": "good"} for uid, text in TEXTS.items()]
BAD = [{"id": "empty", "text": "", "kind": "bad"}, {"id": "null", "text": None, "kind": "bad"}]


def jsonl(path: Path) -> Path:
    lines = [json.dumps(r, ensure_ascii=False) for r in ROWS[:3] + BAD + ROWS[3:]]
    path.write_text("\n".join(lines[:4]) + "\n{broken\n" + "\n".join(lines[4:]) + "\n")
    return path


def parquet(path: Path) -> Path:
    table = pa.Table.from_pylist(ROWS[:3] + BAD + ROWS[3:])
    pq.write_table(table, path, row_group_size=3)
    return path


@pytest.mark.parametrize("write", [jsonl, parquet], ids=["jsonl", "parquet"])
def test_a_record_campaign_runs_to_valid_vectors_of_its_rows(
    write, project, tmp_path, output_root, run_here, monkeypatch
):
    seen: list[bytes] = []
    real = runner_read.read_records

    def spy(*args, **kwargs):
        # A batch's rows are read together (record_reads.read_records).
        read = real(*args, **kwargs)
        seen.extend(data for data in read if isinstance(data, bytes))
        return read

    monkeypatch.setattr(runner_read, "read_records", spy)
    campaign, report = setup.campaign_create(
        name="recs",
        processor="text-embedding",
        project=project,
        records=write(tmp_path / f"corpus.{write.__name__}"),
        columns=RecordColumns(text="text", id="id", category="kind"),
        params={"max_tokens": 32, "batch_size": 4},
    )
    run_here(campaign)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert {uid for uid, u in units.items() if u.state in DONE} == set(TEXTS)
    failed = {uid: u.error_class for uid, u in units.items() if u.state == UnitState.FAILED}
    assert set(failed) >= {"empty", "null"}
    assert set(failed.values()) == {ErrorClass.INPUT_INVALID}
    # The long row was read only as far as the model uses it.
    assert max(len(data) for data in seen) <= 32 * TEXT_BYTES_PER_TOKEN
    processor = get_processor("text-embedding", TEXT_EMBEDDING.clean({"max_tokens": 32}))
    expected = processor.embed(list(TEXTS.values())).vectors
    for (uid, _), vector in zip(TEXTS.items(), expected, strict=True):
        ours = unit_vector(output_root, units[uid].output_path)
        assert float(ours @ vector) >= 0.9999, uid
        assert np.isclose(np.linalg.norm(ours), 1.0, atol=1e-4)
    assert units["doc-4"].attempts.latest("pk").metrics["truncated"] is True
    # verify finds every row where it was, deep or not.
    for deep in (False, True):
        verified = campaign_verify(campaign=campaign, deep=deep)
        assert not any(
            verified.counts.get(k) for k in ("input_missing", "input_changed", "output_missing")
        ), verified.counts


def test_a_row_changed_after_import_fails_input_changed_and_runs_after_reimport(
    project, tmp_path, output_root, run_here
):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS[:3]))
    campaign, _ = setup.campaign_create(
        name="recs",
        processor="text-embedding",
        project=project,
        records=path,
        columns=RecordColumns(text="text", id="id"),
    )
    # The same length, another text: the row is where it was, its bytes are not.
    changed = dict(ROWS[0], text=ROWS[0]["text"].upper())
    path.write_text("".join(json.dumps(r) + "\n" for r in (changed, ROWS[1], ROWS[2])))
    run_here(campaign)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    assert units["doc-0"].error_class == ErrorClass.INPUT_CHANGED
    assert units["doc-1"].state in DONE and units["doc-2"].state in DONE
    report = setup.campaign_import(campaign=campaign)
    assert report.changed == 1
    control.campaign_resume(campaign=campaign, retry_failed=True)
    run_here(campaign)
    assert Unit.objects.get(campaign=campaign, uid="doc-0").state in DONE


def test_rows_shifted_by_a_rewrite_never_lend_a_unit_another_row_s_text(
    project, tmp_path, output_root, run_here
):
    """A row inserted at the top moves every row: the worker fails the units
    with the remedy, a retry without the import leaves them failed (the row at
    an old place is another id's), and after the import each unit embeds its
    own row."""
    path = tmp_path / "c.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS[:4]), path, row_group_size=2)
    campaign, _ = setup.campaign_create(
        name="recs",
        processor="text-embedding",
        project=project,
        records=path,
        columns=RecordColumns(text="text", id="id"),
    )
    new = {"id": "new", "text": "A row added at the top.", "kind": "good"}
    pq.write_table(pa.Table.from_pylist([new, *ROWS[:4]]), path, row_group_size=2)
    run_here(campaign)
    failed = Unit.objects.get(campaign=campaign, uid="doc-1")
    assert failed.error_class == ErrorClass.INPUT_CHANGED
    assert "`campaign import recs`" in failed.error_message
    assert "then `resume --retry-failed`" in failed.error_message

    control.campaign_resume(campaign=campaign, retry_failed=True)
    units = {u.uid: u for u in Unit.objects.filter(campaign=campaign)}
    for uid in ("doc-0", "doc-1", "doc-2", "doc-3"):
        assert units[uid].state == UnitState.FAILED, uid
        assert units[uid].sha256 == unit_sha(TEXTS[uid]), uid
        assert "`campaign import recs`" in units[uid].error_message

    setup.campaign_import(campaign=campaign)
    control.campaign_resume(campaign=campaign, retry_failed=True)
    run_here(campaign)
    processor = get_processor("text-embedding", TEXT_EMBEDDING.clean({}))
    for unit in Unit.objects.filter(campaign=campaign):
        assert unit.state in DONE, (unit.uid, unit.error_message)
        text = new["text"] if unit.uid == "new" else TEXTS[unit.uid]
        assert unit.sha256 == unit_sha(text)
        expected = processor.embed([text]).vectors[0]
        assert float(unit_vector(output_root, unit.output_path) @ expected) >= 0.9999


def unit_sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()
