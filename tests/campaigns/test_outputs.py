from __future__ import annotations

import hashlib
import shutil

import numpy as np
import pytest

from campaigns.outputs import InvalidOutput, validate_embedding_file, vector_to_npy, write_atomic


def test_atomic_write_leaves_the_file_and_no_temp_file(tmp_path):
    target = tmp_path / "deep" / "out.bin"
    written = write_atomic(target, b"payload")
    assert target.read_bytes() == b"payload"
    assert written.size == 7
    assert written.sha256 == hashlib.sha256(b"payload").hexdigest()
    assert [p.name for p in target.parent.iterdir()] == ["out.bin"]


def test_a_write_that_fails_midway_keeps_the_old_file_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / "shard" / "out.bin"
    write_atomic(target, b"first")

    def chunks():
        yield b"half of the second"
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        write_atomic(target, chunks())
    assert target.read_bytes() == b"first"
    assert [p.name for p in target.parent.iterdir()] == ["out.bin"]
    assert oct(target.stat().st_mode & 0o777) == "0o600"  # like mkstemp's files


def test_a_folder_removed_after_a_write_is_made_again(tmp_path):
    target = tmp_path / "shard" / "out.bin"
    write_atomic(target, b"first")
    shutil.rmtree(target.parent)
    write_atomic(target, b"again")
    assert target.read_bytes() == b"again"


def test_a_unit_vector_passes_the_check(tmp_path):
    vector = np.ones(384, dtype=np.float32) / np.sqrt(384)
    path = tmp_path / "v.npy"
    write_atomic(path, vector_to_npy(vector))
    assert validate_embedding_file(path, dimension=384, normalized=True).shape == (384,)


@pytest.mark.parametrize(
    ("vector", "message"),
    [
        (np.ones(383, dtype=np.float32) / np.sqrt(383), "shape"),
        (np.full(384, np.nan, dtype=np.float32), "NaN"),
        (np.ones(384, dtype=np.float32), "norm"),
    ],
)
def test_bad_vectors_fail_the_check_with_a_reason(tmp_path, vector, message):
    path = tmp_path / "v.npy"
    write_atomic(path, vector_to_npy(vector))
    with pytest.raises(InvalidOutput, match=message):
        validate_embedding_file(path, dimension=384, normalized=True)


def test_a_truncated_file_fails_the_check(tmp_path):
    path = tmp_path / "v.npy"
    data = vector_to_npy(np.ones(384, dtype=np.float32) / np.sqrt(384))
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidOutput):
        validate_embedding_file(path, dimension=384, normalized=True)
