"""SIGKILL the worker mid-batch, three times; then nothing is lost or duplicated:
a folder of files, and a corpus as records (a Parquet file, a JSONL file) with
bad rows."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from campaigns import selectors
from campaigns.intake.records import RecordColumns
from campaigns.models import Attempt, Batch, Unit, UnitState
from campaigns.runs import setup, start
from campaigns.specs.builtin import TEXT_EMBEDDING
from campaigns.verify.reconcile import campaign_verify
from tests.vectors import unit_vector
from tests.worker import finish_and_resume, kill_mid_batch

pytestmark = pytest.mark.integration

TOPICS = ["harbour", "railway", "library", "harvest", "solar", "backup", "tides", "vaccines"]
GOOD = 96


def _text(i: int) -> str:
    # Long texts (all truncated at 256 tokens), so every batch takes a while.
    topic = TOPICS[i % len(TOPICS)]
    return " ".join(f"{topic} report {i} paragraph {j} with figures {i * j}." for j in range(60))


def _corpus(root: Path, n: int) -> None:
    for i in range(n):
        (root / f"doc-{i:03d}.txt").write_text(_text(i) + "\n")
    (root / "empty.txt").write_bytes(b"")


def _rows(bad: list[tuple[int, object]]) -> list[object]:
    """The good rows doc-000…, with the bad ones slotted in at their places,
    and a repeat of an id (its first row is the unit, the repeat is reported)."""
    rows: list[object] = [{"id": f"doc-{i:03d}", "text": _text(i)} for i in range(GOOD)]
    rows.insert(50, {"id": "doc-007", "text": "a second row with the id doc-007"})
    for place, row in sorted(bad, key=lambda b: b[0], reverse=True):
        rows.insert(place, row)
    return rows


def _parquet(folder: Path) -> tuple[Path, dict[str, str]]:
    rows = _rows([(5, {"id": "empty", "text": ""}), (40, {"id": "null", "text": None})])
    rows.insert(70, {"id": None, "text": "a row without its id"})
    path = folder / "corpus.parquet"
    # Small row groups: a batch's rows come from several of them.
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=10)
    no_id = f"corpus.parquet:{rows.index({'id': None, 'text': 'a row without its id'})}"
    return path, {"empty": "empty text", "null": "no text in column 'text'", no_id: "no id"}


def _jsonl(folder: Path) -> tuple[Path, dict[str, str]]:
    rows = _rows(
        [
            (5, {"id": "empty", "text": ""}),
            (40, "{this is not json"),
            (60, {"id": "number", "text": 42}),
        ]
    )
    lines = [row if isinstance(row, str) else json.dumps(row) for row in rows]
    path = folder / "corpus.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    not_json = f"corpus.jsonl:{lines.index('{this is not json') + 1}"
    return path, {"empty": "empty text", not_json: "is not JSON", "number": "holds int, not text"}


def _create(kind: str, project, tmp_path: Path):
    """The campaign over this kind of corpus, and its bad units' reasons."""
    corpus = tmp_path / "long-corpus"
    corpus.mkdir()
    common = {"name": "killed", "processor": "text-embedding", "project": project}
    if kind == "folder":
        _corpus(corpus, GOOD)
        campaign, _ = setup.campaign_create(
            input_folder=corpus, params={"batch_size": 16}, **common
        )
        return campaign, {"empty.txt": "empty file"}
    path, bad = {"parquet": _parquet, "jsonl": _jsonl}[kind](corpus)
    campaign, report = setup.campaign_create(
        records=path,
        columns=RecordColumns(text="text", id="id"),
        params={"batch_size": 16},
        **common,
    )
    assert report.duplicates == 1
    return campaign, bad


@pytest.mark.parametrize("kind", ["folder", "parquet", "jsonl"])
def test_three_kills_then_resume_leave_exactly_one_valid_output_per_unit(
    start_worker, project, tmp_path, output_root, settings, kind
):
    # given: 96 long texts and bad inputs (a file, or rows), batches of 16, a 2 s lease
    settings.BATCH_LEASE_SECONDS = 2
    campaign, bad = _create(kind, project, tmp_path)
    good = [f"doc-{i:03d}" + (".txt" if kind == "folder" else "") for i in range(GOOD)]
    start.campaign_run(campaign=campaign)

    # when: a worker is SIGKILLed while it holds a batch, three times
    kill_mid_batch(start_worker, campaign, 3, settle=0.2)

    # then: a new worker (with the periodic sweeper) finishes, resume finds nothing more
    finish_and_resume(start_worker, campaign)

    counts = selectors.campaign_counts(campaign=campaign)
    assert (counts.succeeded, counts.failed, counts.pending) == (GOOD, len(bad), 0)
    # every bad input failed with its reason, every good one succeeded, none twice
    failed = Unit.objects.filter(campaign=campaign, state=UnitState.FAILED)
    reasons = dict(failed.values_list("uid", "error_message"))
    assert set(reasons) == set(bad)
    for uid, said in bad.items():
        assert said in reasons[uid], (uid, reasons[uid])
    succeeded = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)
    assert sorted(succeeded.values_list("uid", flat=True)) == good
    assert Batch.objects.filter(campaign=campaign, deliveries__gte=2).count() >= 1
    assert Batch.objects.filter(campaign=campaign).exclude(state=Batch.State.DONE).count() == 0

    # exactly one valid output per unit, no partial file, no duplicate result rows
    assert not [p for p in Path(output_root).rglob("*") if p.name.endswith(".tmp")]
    for unit in Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED):
        vector = unit_vector(output_root, unit.output_path)
        assert hashlib.sha256(vector.tobytes()).hexdigest() == unit.output_sha256
        assert Attempt.objects.filter(unit=unit, outcome="succeeded").count() == 1, unit.uid
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["total"] == GOOD + len(bad)
    assert report["valid"] == GOOD and report["input_invalid"] == len(bad)
    assert report["output_missing"] == report["output_incomplete"] == 0
    assert report["orphan_outputs"] == report["input_changed"] == report["input_missing"] == 0
    # and each row's vector is its own text's (doc-007 its first row's), none swapped
    from gpuworker.processors import get_processor

    processor = get_processor("text-embedding", TEXT_EMBEDDING.clean({}))
    expected = processor.embed([_text(i) for i in range(GOOD)]).vectors
    for uid, vector in zip(good, expected, strict=True):
        unit = succeeded.get(uid=uid)
        ours = unit_vector(output_root, unit.output_path)
        assert float(ours @ vector) >= 0.9999 and np.isclose(np.linalg.norm(ours), 1, atol=1e-4)
