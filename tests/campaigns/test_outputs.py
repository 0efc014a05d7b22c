from __future__ import annotations

import errno
import hashlib
import io
import os
import shutil
import stat
from unittest import mock

import numpy as np
import pytest

from campaigns.storage import outputs
from campaigns.storage.outputs import (
    FileReader,
    InvalidOutput,
    Streamed,
    WrittenFile,
    validate_embedding_file,
    vector_to_npy,
    write_atomic,
    write_atomic_group,
)
from tests.fuzzing import bounded


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


def test_a_folder_removed_after_a_write_is_made_again(tmp_path):
    target = tmp_path / "shard" / "out.bin"
    write_atomic(target, b"first")
    shutil.rmtree(target.parent)
    write_atomic(target, b"again")
    assert target.read_bytes() == b"again"


def test_a_group_write_puts_every_file_in_place_and_one_bad_path_fails_alone(tmp_path):
    (tmp_path / "blocker").write_bytes(b"a file where a folder should be")
    files = [
        (tmp_path / "a" / "one.npy", b"one"),
        (tmp_path / "blocker" / "two.npy", b"two"),  # its folder cannot be made
        (tmp_path / "b" / "three.npy", b"three"),
    ]
    results = write_atomic_group(files)
    assert results[0] == WrittenFile(size=3, sha256=hashlib.sha256(b"one").hexdigest())
    assert isinstance(results[1], OSError)
    assert results[2] == WrittenFile(size=5, sha256=hashlib.sha256(b"three").hexdigest())
    assert (tmp_path / "a" / "one.npy").read_bytes() == b"one"
    assert (tmp_path / "b" / "three.npy").read_bytes() == b"three"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == [
        "blocker",
        "one.npy",
        "three.npy",
    ]


def test_a_streamed_file_is_written_as_it_is_made_with_its_size_and_checksum(tmp_path):
    def write(fh):
        for chunk in (b"made ", b"in ", b"parts"):
            fh.write(chunk)

    def fails(fh):
        fh.write(b"half of it")
        raise OSError(28, "No space left on device")

    results = write_atomic_group(
        [
            (tmp_path / "whole.bin", Streamed(write)),
            (tmp_path / "half.bin", lambda: Streamed(fails)),
        ]
    )
    assert results[0] == WrittenFile(size=13, sha256=hashlib.sha256(b"made in parts").hexdigest())
    assert (tmp_path / "whole.bin").read_bytes() == b"made in parts"
    assert isinstance(results[1], OSError)  # that file only, and no temp file left of it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["whole.bin"]


def test_a_file_reader_asks_no_more_than_the_file_holds(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"0123456789")
    with FileReader(open(path, "rb", buffering=0)) as reader:
        assert reader.read(4) == b"0123"
        # A damaged header declaring 2 GiB: the read allocates what is left.
        bounded(lambda: reader.read(2**31), ())
        assert reader.read(2**31) == b""
    with FileReader(open(path, "rb", buffering=0)) as reader:
        reader.seek(6)
        assert reader.read(2**31) == b"6789"


def test_a_group_write_flushes_once_per_filesystem_before_any_file_appears(tmp_path):
    files = [(tmp_path / f"d{i % 3}" / f"{i}.npy", b"x" * i) for i in range(12)]
    seen_at_flush: list[list[str]] = []

    def syncfs(fd):
        seen_at_flush.append(sorted(p.name for p in tmp_path.rglob("*.npy")))
        return 0

    with mock.patch.object(outputs, "_syncfs", syncfs), mock.patch("os.fsync") as fsync:
        results = write_atomic_group(files)
    # One flush for the whole group, while only temp files existed.
    assert seen_at_flush == [[]]
    assert fsync.call_count == 3  # each folder once, not each file
    assert all(isinstance(r, WrittenFile) for r in results)
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        f"{i}.npy" for i in range(12)
    )


def test_renames_over_many_folders_are_flushed_by_a_second_filesystem_sync(tmp_path):
    folders = outputs.FSYNC_FOLDERS_UP_TO + 3
    files = [(tmp_path / f"d{i}" / "out.npy", b"z" * i) for i in range(folders)]
    seen_at_flush: list[int] = []

    def syncfs(fd):
        seen_at_flush.append(len(list(tmp_path.rglob("*.npy"))))
        return 0

    with mock.patch.object(outputs, "_syncfs", syncfs), mock.patch("os.fsync") as fsync:
        results = write_atomic_group(files)
    # Data first, while no output existed; then once more after every rename.
    assert seen_at_flush == [0, folders]
    assert fsync.call_count == 0
    assert all(isinstance(r, WrittenFile) for r in results)


def test_a_failed_flush_after_the_renames_fails_the_group(tmp_path):
    files = [(tmp_path / f"d{i}" / "out.npy", b"v") for i in range(outputs.FSYNC_FOLDERS_UP_TO + 1)]
    calls = []

    def syncfs(fd):
        calls.append(fd)
        if len(calls) > 1:
            outputs.ctypes.set_errno(errno.EIO)
            return -1
        return 0

    with mock.patch.object(outputs, "_syncfs", syncfs):
        results = write_atomic_group(files)
    # Not known to be on disk: the units fail (output_write_error) and are rerun.
    assert [getattr(r, "errno", None) for r in results] == [errno.EIO] * len(files)


def test_a_failed_flush_leaves_no_output_of_the_group(tmp_path):
    target = tmp_path / "shard" / "out.npy"
    write_atomic(target, b"earlier")

    def syncfs(fd):
        outputs.ctypes.set_errno(errno.EIO)  # the disk failed under the flush
        return -1

    files = [(target, b"new"), (tmp_path / "shard" / "other.npy", b"other")]
    with mock.patch.object(outputs, "_syncfs", syncfs):
        results = write_atomic_group(files)
    assert [r.errno for r in results] == [errno.EIO, errno.EIO]
    assert target.read_bytes() == b"earlier"
    assert [p.name for p in target.parent.iterdir()] == ["out.npy"]


def test_a_time_limit_mid_group_leaves_no_temp_file(tmp_path):
    class TimeLimit(BaseException):  # as Celery's SoftTimeLimitExceeded would arrive
        pass

    def files():
        yield tmp_path / "d" / "0.npy", b"zero"
        yield tmp_path / "d" / "1.npy", b"one"
        raise TimeLimit

    with pytest.raises(TimeLimit):
        write_atomic_group(files())
    assert list((tmp_path / "d").iterdir()) == []


def test_without_syncfs_each_file_is_fsynced_before_it_is_renamed(tmp_path):
    files = [(tmp_path / "d" / f"{i}.npy", b"y") for i in range(4)]
    with mock.patch.object(outputs, "_syncfs", None), mock.patch("os.fsync") as fsync:
        results = write_atomic_group(files)
    assert fsync.call_count == 4 + 1  # each file, then the folder
    assert all(isinstance(r, WrittenFile) for r in results)
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [f"{i}.npy" for i in range(4)]


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


@pytest.mark.parametrize(
    "vector",
    [
        np.arange(384, dtype=np.float32),
        np.arange(768, dtype=np.float64)[::2],  # another dtype, not contiguous
        np.arange(12, dtype=np.float32).reshape(3, 4),
    ],
)
def test_vector_bytes_are_what_numpy_writes_and_reads_back(vector):
    expected = io.BytesIO()
    np.save(expected, np.ascontiguousarray(vector, dtype=np.float32), allow_pickle=False)
    data = vector_to_npy(vector)
    assert data == expected.getvalue()
    np.testing.assert_array_equal(np.load(io.BytesIO(data)), vector.astype(np.float32))


def test_a_truncated_file_fails_the_check(tmp_path):
    path = tmp_path / "v.npy"
    data = vector_to_npy(np.ones(384, dtype=np.float32) / np.sqrt(384))
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(InvalidOutput):
        validate_embedding_file(path, dimension=384, normalized=True)


@pytest.mark.parametrize(
    ("umask", "file_mode", "folder_mode"), [(0o022, 0o644, 0o755), (0o027, 0o640, 0o750)]
)
def test_outputs_and_their_folders_follow_the_umask(tmp_path, umask, file_mode, folder_mode):
    # Another user of the group (campaign verify, a backup) reads the outputs.
    saved = os.umask(umask)
    try:
        write_atomic(tmp_path / "v1" / "a.npy", b"one")
        outputs.write_atomic_group([(tmp_path / "v1" / "shard" / "b.npy", b"two")])
    finally:
        os.umask(saved)
    assert stat.S_IMODE((tmp_path / "v1" / "a.npy").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "v1" / "shard" / "b.npy").stat().st_mode) == file_mode
    assert stat.S_IMODE((tmp_path / "v1").stat().st_mode) == folder_mode
    assert stat.S_IMODE((tmp_path / "v1" / "shard").stat().st_mode) == folder_mode
