"""The shard format on its own: what a user's numpy reads, and what readers refuse."""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest

from campaigns.storage.outputs import InvalidOutput, check_vector_rows, vector_to_npy
from campaigns.storage.paths import safe_name, shard_relpath
from campaigns.storage.vector_shards import (
    DeepRowCheck,
    ShardChecker,
    VectorReader,
    load_shard,
    member_path,
    row_sha256,
    shard_bytes,
    split_member,
)


def _unit_vectors(n: int, dim: int = 8) -> np.ndarray:
    vectors = np.random.default_rng(n).standard_normal((n, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_a_shard_is_a_plain_npz_numpy_reads_with_its_ids(tmp_path):
    vectors = _unit_vectors(3)
    path = tmp_path / "b1-x.npz"
    path.write_bytes(shard_bytes(["a.txt", "ünï/文字.txt", "c"], vectors))
    with np.load(path) as plain:  # a user's numpy, no helper, no pickle
        assert plain["ids"].tolist() == ["a.txt", "ünï/文字.txt", "c"]
        assert np.array_equal(plain["vectors"], vectors)
    assert load_shard(path, dimension=8).ids.tolist().index("c") == 2


def test_member_paths_name_a_row_and_per_unit_names_never_look_like_one():
    rel = str(
        shard_relpath(campaign="c", version_label="v1", batch_id=1234, token="abcdef0123456789")
    )
    assert rel == "c/v1/shards/0001/b1234-abcdef012345.npz"
    assert split_member(member_path(rel, 7)) == (rel, 7)
    assert split_member("c/v1/ab/name-123.npy") == ("c/v1/ab/name-123.npy", None)
    assert "#" not in safe_name("odd#7")  # a unit id with '#' still gets a plain file name


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "not a readable vector shard"),
        (b"PK\x03\x04 cut short", "not a readable vector shard"),
        ("vectors only", "expected arrays 'vectors' and 'ids'"),
        ("ids too few", "do not name its 3 rows"),
        ("float64", "float32"),
    ],
)
def test_a_damaged_or_foreign_shard_is_refused_with_its_reason(tmp_path, content, message):
    path = tmp_path / "shard.npz"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        buf = io.BytesIO()
        vectors = _unit_vectors(3)
        arrays = {
            "vectors only": {"vectors": vectors},
            "ids too few": {"vectors": vectors, "ids": np.array(["a", "b"])},
            "float64": {"vectors": vectors.astype(np.float64), "ids": np.array(["a", "b", "c"])},
        }[content]
        np.savez(buf, **arrays)
        path.write_bytes(buf.getvalue())
    with pytest.raises(InvalidOutput, match=message):
        load_shard(path)


def test_row_checks_name_each_bad_row_and_pass_the_rest():
    vectors = _unit_vectors(4)
    vectors[1, 0] = np.nan
    vectors[3] *= 2
    problems = check_vector_rows(vectors, dimension=8, normalized=True)
    assert problems[0] is None and problems[2] is None
    assert problems[1].reason == "non_finite"
    assert "norm 2.0" in str(problems[3])
    assert check_vector_rows(vectors * 2, dimension=8, normalized=False)[0] is None
    wrong = check_vector_rows(vectors, dimension=16, normalized=False)
    assert all(p is not None and "expected (n, 16)" in str(p) for p in wrong)


def test_the_reader_reads_shard_rows_and_older_per_unit_files_alike(tmp_path):
    vectors = _unit_vectors(2)
    (tmp_path / "c/v1/shards/0000").mkdir(parents=True)
    (tmp_path / "c/v1/shards/0000/b1-t.npz").write_bytes(shard_bytes(["a", "b"], vectors))
    (tmp_path / "c/v1/ab").mkdir(parents=True)
    (tmp_path / "c/v1/ab/old-1.npy").write_bytes(vector_to_npy(vectors[0]))
    reader = VectorReader(tmp_path)
    assert np.array_equal(reader.vector("c/v1/shards/0000/b1-t.npz#1"), vectors[1])
    assert np.array_equal(reader.vector("c/v1/ab/old-1.npy"), vectors[0])
    with pytest.raises(InvalidOutput, match="row 2 is past"):
        reader.vector("c/v1/shards/0000/b1-t.npz#2")
    with pytest.raises(FileNotFoundError):
        reader.vector("c/v1/shards/0000/b9-t.npz#0")


def test_the_checker_reads_a_shard_once_and_checks_the_row_is_this_units(tmp_path, monkeypatch):
    vectors = _unit_vectors(3)
    (tmp_path / "s.npz").write_bytes(shard_bytes(["a", "b", "c"], vectors))
    loads = []
    real = load_shard
    monkeypatch.setattr(
        "campaigns.storage.vector_shards.load_shard", lambda p, **k: loads.append(p) or real(p, **k)
    )
    checker = ShardChecker(tmp_path)
    for row, uid in enumerate("abc"):
        checker.check("s.npz", row, uid, expected_size=32)
    assert len(loads) == 1
    with pytest.raises(InvalidOutput, match="names another unit"):
        checker.check("s.npz", 1, "a", expected_size=32)
    with pytest.raises(InvalidOutput, match="recorded 99"):
        checker.check("s.npz", 0, "a", expected_size=99)
    with pytest.raises(FileNotFoundError):
        checker.check("gone.npz", 0, "a", expected_size=None)
    assert row_sha256(vectors[0]) != row_sha256(vectors[1])


def test_a_zip_with_other_members_is_not_a_shard(tmp_path):
    path = tmp_path / "other.npz"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes.txt", "hello")
    with pytest.raises(InvalidOutput):
        load_shard(path)


def test_a_deep_check_compares_each_rows_checksum_and_runs_the_row_check_once(tmp_path):
    vectors = _unit_vectors(3)
    vectors[2, 0] = np.nan
    (tmp_path / "s.npz").write_bytes(shard_bytes(["a", "b", "c"], vectors))
    checked = []

    def row_check(rows):
        checked.append(len(rows))
        return check_vector_rows(rows, dimension=8, normalized=True)

    checker = ShardChecker(tmp_path)
    checker.check("s.npz", 0, "a", expected_size=None)  # quick first: no digests kept
    deep = DeepRowCheck(sha256=row_sha256(vectors[0]), row_check=row_check)
    checker.check("s.npz", 0, "a", expected_size=32, deep=deep)
    with pytest.raises(InvalidOutput, match="checksum differs"):
        checker.check("s.npz", 1, "b", expected_size=32, deep=deep)
    with pytest.raises(InvalidOutput, match="NaN"):
        checker.check("s.npz", 2, "c", expected_size=32, deep=DeepRowCheck("", row_check))
    assert checked == [3]  # the shard's rows checked in one call, once
