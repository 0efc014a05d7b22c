"""Fuzzed lease records: a damaged record vouches for nothing, never a traceback.

A lease record (campaigns/storage/lease_records.py) is what a claim of a batch
wrote; the next claim adopts only what a record vouches for. Whatever bytes lie
in a record's file — cut, flipped, nested past the recursion limit, JSON of the
wrong shape, huge — reading the batch's records gives only what well-formed
records of that very batch name, each field text, with memory bounded
(tests/fuzzing.py); verify's reading of record names never raises either.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from campaigns.storage.lease_records import (
    Vouched,
    batch_of,
    read_records,
    record_bytes,
)
from tests.fuzzing import bounded, damaged

BATCH = 7
GOOD = record_bytes(
    batch_id=BATCH,
    token="t" * 32,
    outputs=[
        ("a.txt", Vouched("c/v1/ab/a-1.npy", "ab" * 32, "cd" * 32)),
        ("ünï/文字.txt", Vouched("c/v1/cd/u-2.npy", "ef" * 32, "01" * 32)),
    ],
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner),
    max_leaves=12,
)
#: Records of the right outline whose parts are of any kind.
shaped = st.builds(
    lambda batch, outputs: json.dumps({"batch": batch, "token": "x", "outputs": outputs}).encode(),
    st.sampled_from([BATCH, True, 7.0, "7", None, -7]) | json_values,
    st.dictionaries(st.text(max_size=6), json_values | st.lists(st.text(max_size=4), max_size=4))
    | json_values,
)
record_files = st.one_of(
    st.binary(max_size=300),
    damaged(GOOD),
    shaped,
    json_values.map(lambda v: json.dumps(v).encode()),
)


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("leases")


def _expected(data: bytes) -> dict | None:
    """What a record vouches for when it is well formed, else None."""
    try:
        record = json.loads(data)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or type(record.get("batch")) is not int:
        return None
    outputs = record.get("outputs")
    if record["batch"] != BATCH or not isinstance(outputs, dict):
        return None
    if not all(
        isinstance(entry, list) and len(entry) == 3 and all(type(v) is str for v in entry)
        for entry in outputs.values()
    ):
        return None
    return {uid: [Vouched(*entry)] for uid, entry in outputs.items()}


@given(data=record_files)
@example(data=GOOD)
@example(data=b"[" * 100_000)  # past the recursion limit: RecursionError, not ValueError
@example(data=b'{"batch": 7, "outputs": ' + b"[" * 100_000 + b"}")
@example(data=b'{"batch": 7, "outputs": {"a.txt": [1, ["x"], {"y": 2}]}}')  # no text
@example(data=b'{"batch": true, "outputs": {"a.txt": ["o", "s", "i"]}}')  # True == 1, not 7
@example(data=b'{"batch": 7, "outputs": {"a.txt": ["o", "s", "i"], "b": "osi"}}')  # half good
def test_a_record_vouches_for_what_it_names_whole_or_for_nothing(folder, data):
    (folder / f"b{BATCH}-record.json").write_bytes(data)
    found: dict = {}

    def read() -> None:
        found.update(read_records(folder, BATCH))

    bounded(read, ())
    assert found == (_expected(data) or {})
    for vouched in found.values():
        for v in vouched:
            assert all(type(f) is str for f in (v.output, v.sha256, v.input_sha256))


def test_a_record_larger_than_any_claim_writes_is_not_read(folder, monkeypatch):
    from campaigns.storage import lease_records

    monkeypatch.setattr(lease_records, "RECORD_MAX_BYTES", len(GOOD) - 1)
    (folder / f"b{BATCH}-record.json").write_bytes(GOOD)
    assert read_records(folder, BATCH) == {}


def test_a_leases_folder_that_is_a_file_vouches_for_nothing(tmp_path):
    leases = tmp_path / ".leases"
    leases.write_text("not a folder")
    assert read_records(leases, BATCH) == {}


@given(name=st.text(max_size=20))
@example(name="b²-x.json")  # a digit int() does not take
@example(name="b٣-x.json")  # a decimal digit of another script
@example(name="b" + "9" * 5000 + "-x.json")  # past int()'s digit limit
def test_verify_reads_any_name_in_a_leases_folder_as_a_batch_or_none(name):
    batch = batch_of(name)
    assert batch is None or (type(batch) is int and name == f"b{batch}-{name.partition('-')[2]}")
