"""Fuzzed output validators: a damaged .npy, shard, .npz or image is an InvalidOutput.

Whatever the bytes, verify and the worker's check get InvalidOutput (the file
is there but no result) or, for a file that cannot be opened, OSError; never
numpy's, zipfile's or zlib's own exceptions, never MemoryError, and never an
allocation of the array a damaged header declares (tests/fuzzing.py).
"""

from __future__ import annotations

import io
import zipfile

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from PIL import Image

from campaigns.specs.builtin import check_classification_output, check_image_output
from campaigns.storage.outputs import (
    InvalidOutput,
    check_npy_header,
    load_npy_or_npz,
    validate_embedding_file,
)
from campaigns.storage.vector_shards import ShardChecker, VectorReader, load_shard, shard_bytes
from tests.fuzzing import (
    bounded,
    damaged,
    npy_bytes,
    npy_declaring,
    npy_header_edited,
    zip_of,
)

DIM = 8
VECTOR = npy_bytes(np.full(DIM, 1 / np.sqrt(DIM), dtype=np.float32))
SHARD = shard_bytes(
    ["a.txt", "ünï/文字.txt"], np.full((2, DIM), 1 / np.sqrt(DIM), np.float32), ["ab" * 32] * 2
)


def _classification() -> bytes:
    buf = io.BytesIO()
    np.savez(
        buf,
        top_indices=np.array([3, 1]),
        top_labels=np.array(["cat", "dog"]),
        top_probs=np.array([0.7, 0.2], np.float32),
        margin=np.array(0.5, np.float32),
        features=np.ones(4, np.float32),
    )
    return buf.getvalue()


CLASSIFICATION = _classification()


def _image(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (16, 12), (200, 30, 30)).save(buf, format=fmt)
    return buf.getvalue()


IMAGES = {"png": _image("PNG"), "jpeg": _image("JPEG"), "webp": _image("WEBP")}
IMAGE_PARAMS = {"operation": "resize", "width": 16, "height": 12, "max_pixels": 10**6}


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    """One file each example overwrites (hypothesis runs examples one after another)."""
    return tmp_path_factory.mktemp("fuzz") / "output"


def npy_inputs(good: bytes):
    return st.one_of(
        st.binary(max_size=256), damaged(good), npy_declaring(), npy_header_edited(good)
    )


#: Headers one edit away from the good vector's that numpy's parser once let
#: out as TypeError: a bytes key (a space flipped to 'b') sorts against str
#: keys; a shape of booleans passes numpy's int check and fails reshape.
BYTES_KEY = VECTOR.replace(b"'<f4', 'fortran_order'", b"'<f4',b'fortran_order'")
BOOL_SHAPE = VECTOR.replace(b"(8,)", b"(True,)")
BYTES_SHAPE_KEY = VECTOR.replace(b", 'shape'", b",b'shape'")


def npz_inputs(good: bytes, names: list[str]):
    """Arbitrary bytes, the good archive damaged, or a well-formed zip whose
    members are damaged or declare huge arrays, stored or deflated."""
    member = st.one_of(npy_declaring(), damaged(VECTOR), st.binary(max_size=64))
    members = st.dictionaries(st.sampled_from([*names, "other.npy", "x"]), member, max_size=5)
    rebuilt = st.builds(
        lambda m, c: zip_of(
            {k if "." in k else f"{k}.npy": v for k, v in m.items()}, compression=c
        ),
        members,
        st.sampled_from([zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED]),
    )
    return st.one_of(st.binary(max_size=256), damaged(good), rebuilt)


@given(data=npy_inputs(VECTOR))
@example(data=BYTES_KEY)
@example(data=BOOL_SHAPE)
@example(data=BYTES_SHAPE_KEY)
def test_an_embedding_file_is_valid_or_invalid_output(out, data):
    out.write_bytes(data)
    raised = bounded(
        lambda: validate_embedding_file(out, dimension=DIM, normalized=True), (InvalidOutput,)
    )
    if raised is None:
        assert len(data) >= DIM * 4


@given(data=npy_inputs(VECTOR), recorded=st.none() | st.integers(0, 300))
@example(data=BYTES_KEY, recorded=None)
@example(data=BYTES_SHAPE_KEY, recorded=None)
def test_verifys_header_check_is_valid_or_invalid_output(out, data, recorded):
    out.write_bytes(data)
    bounded(lambda: check_npy_header(out, expected_size=recorded, dimension=DIM), (InvalidOutput,))


@given(data=npz_inputs(SHARD, ["vectors", "ids", "inputs"]))
def test_a_shard_loads_whole_or_is_invalid_output(out, data):
    out.write_bytes(data)
    bounded(lambda: load_shard(out, dimension=DIM), (InvalidOutput,))


@given(data=npz_inputs(SHARD, ["vectors", "ids", "inputs"]), row=st.integers(0, 3))
def test_verifys_shard_row_check_and_the_vector_reader_classify_every_shard(out, data, row):
    out.write_bytes(data)
    checker = ShardChecker(out.parent)
    bounded(lambda: checker.check(out.name, row, "a.txt", expected_size=None), (InvalidOutput,))
    reader = VectorReader(out.parent)
    bounded(lambda: reader.vector(f"{out.name}#{row}"), (InvalidOutput,))
    bounded(lambda: reader.vector(out.name), (InvalidOutput,))


@given(data=npz_inputs(CLASSIFICATION, ["top_indices", "top_labels", "top_probs", "margin"]))
def test_a_classification_output_is_valid_or_invalid_output(out, data):
    out.write_bytes(data)
    bounded(lambda: check_classification_output(out, {"top_k": 2}), (InvalidOutput,))


def _png_declaring_idat(length: int) -> bytes:
    png = IMAGES["png"]
    at = png.index(b"IDAT") - 4
    return png[:at] + length.to_bytes(4, "big") + png[at + 4 :]


image_outputs = st.sampled_from(sorted(IMAGES)).flatmap(
    lambda fmt: st.tuples(st.just(fmt), damaged(IMAGES[fmt]) | st.binary(max_size=256))
)


@given(case=image_outputs)
@example(case=("png", _png_declaring_idat(2**31 - 16)))  # Pillow reads what a chunk declares
def test_an_image_output_is_valid_or_invalid_output(out, case):
    fmt, damaged_image = case
    out.write_bytes(damaged_image)
    params = {**IMAGE_PARAMS, "format": fmt}
    bounded(lambda: check_image_output(out, params), (InvalidOutput,))


@pytest.mark.parametrize(
    "data", [BYTES_KEY, BOOL_SHAPE, BYTES_SHAPE_KEY], ids=["key", "bool", "shape"]
)
def test_a_header_numpy_half_reads_is_invalid_output_with_its_reason(out, data):
    out.write_bytes(data)
    for check in (
        lambda: load_npy_or_npz(out),
        lambda: validate_embedding_file(out, dimension=DIM, normalized=True),
        lambda: check_npy_header(out, expected_size=None, dimension=DIM),
        lambda: VectorReader(out.parent).vector(out.name),
    ):
        with pytest.raises(InvalidOutput) as caught:
            check()
        assert "not a .npy file" in str(caught.value) or "shape" in str(caught.value)


@pytest.mark.parametrize("shape", [(10**9,), (10**12,), (2**70,), (2**40, 2**40), (-1,)], ids=str)
def test_a_header_declaring_a_huge_array_is_refused_without_allocating_it(out, shape):
    header = npy_bytes(np.zeros(1, np.float32)).replace(b"(1,)", repr(shape).encode())
    for data in (header, zip_of({"vectors.npy": header, "ids.npy": npy_bytes(np.array(["a"]))})):
        out.write_bytes(data)
        raised = bounded(lambda: load_npy_or_npz(out), (InvalidOutput,))
        assert isinstance(raised, InvalidOutput), shape
