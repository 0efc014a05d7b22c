"""Fuzzed checkpoint checks: a damaged sidecar is a problem named, never a crash.

campaigns/storage/checkpoint_files.py: `problems` lists why a checkpoint must
not be loaded, `verified` raises CheckpointError, `latest_whole` skips what
fails them. Whatever `checkpoint.json` holds (damaged bytes, JSON of another
shape, file names that leave the folder), they answer in those terms, read
nothing outside the checkpoint's folder, and answer fast, in bounded memory.
Whatever a payload file holds instead of what was written (damaged, cut,
another file's bytes, empty, a folder), it is a named problem; and one whose
sidecar was rewritten to match is still contradicted by its record.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from campaigns.storage import checkpoint_files
from campaigns.storage.checkpoint_files import CheckpointError
from tests.fuzzing import bounded, damaged

_NAMES = st.sampled_from(
    [
        "model.safetensors",
        "optimizer.pt",
        "",
        ".",
        "..",
        "../step-00000001/model.safetensors",
        "../../outside.bin",
        "/etc/hostname",
        "sub/x",
        "nul\x00",
    ]
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 50) | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=5,
)
sidecars = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "step": json_values,
            "weights_sha256": json_values,
            "files": st.dictionaries(_NAMES, st.text(max_size=64) | json_values, max_size=4)
            | json_values,
        },
    ),
)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("checkpoints")
    (base / "outside.bin").write_bytes(b"not a checkpoint's")
    root = base / "run"

    def save(folder: Path) -> None:
        (folder / "model.safetensors").write_bytes(b"weights")
        (folder / "optimizer.pt").write_bytes(b"state")

    checkpoint_files.write(root, 1, save, {"base": "m"})
    checkpoint_files.write(root, 2, save, {"base": "m"})
    return root


def _reset(root: Path) -> tuple[Path, bytes]:
    folder = root / checkpoint_files.folder_name(2)
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(root / checkpoint_files.folder_name(1), folder)
    good = json.loads((folder / checkpoint_files.SIDECAR).read_text())
    good["step"] = 2
    sidecar = json.dumps(good).encode()
    return folder, sidecar


def _check(root: Path, folder: Path) -> None:
    found = checkpoint_files.problems(folder)
    assert isinstance(found, list) and all(isinstance(p, str) for p in found)
    try:
        checkpoint_files.verified(folder)
    except CheckpointError:
        assert found
    else:
        assert not found
    against = checkpoint_files.against_record(folder, weights_sha256="ab" * 32, sidecar_sha256="x")
    assert against and all(isinstance(p, str) for p in against)
    latest = checkpoint_files.latest_whole(root)
    assert latest is not None  # step 1 stays whole whatever step 2 holds
    assert latest[0].name == checkpoint_files.folder_name(2 if not found else 1)


@given(data=st.data())
def test_a_damaged_sidecar_is_a_named_problem(root, data):
    folder, good = _reset(root)
    (folder / checkpoint_files.SIDECAR).write_bytes(
        data.draw(damaged(good) | st.binary(max_size=64))
    )
    bounded(lambda: _check(root, folder), ())


_PAYLOADS = ("model.safetensors", "optimizer.pt")


@given(name=st.sampled_from(_PAYLOADS), data=st.data())
def test_a_damaged_payload_file_is_a_named_problem(root, name, data):
    folder, sidecar = _reset(root)
    (folder / checkpoint_files.SIDECAR).write_bytes(sidecar)
    good = (folder / name).read_bytes()
    payload = data.draw(damaged(good) | st.binary(max_size=64))
    if payload == good:
        return  # edits that undid each other
    (folder / name).write_bytes(payload)
    bounded(lambda: _check(root, folder), ())
    assert f"{folder.name}/{name}: sha256 differs from the one recorded" in (
        checkpoint_files.problems(folder)
    )


@given(name=st.sampled_from(_PAYLOADS), kind=st.sampled_from(["folder", "gone", "link"]))
def test_a_payload_file_that_is_no_file_is_a_named_problem(root, name, kind):
    folder, sidecar = _reset(root)
    (folder / checkpoint_files.SIDECAR).write_bytes(sidecar)
    (folder / name).unlink()
    if kind == "folder":
        (folder / name).mkdir()
    elif kind == "link":  # to nothing
        (folder / name).symlink_to(folder / "nothing-here")
    bounded(lambda: _check(root, folder), ())
    assert f"{folder.name}/{name}: missing" in checkpoint_files.problems(folder)


@given(name=st.sampled_from(_PAYLOADS), data=st.data())
def test_a_damaged_payload_with_a_sidecar_rewritten_to_match_is_contradicted_by_its_record(
    root, name, data
):
    # given: the checksums the row of step 2 records, then a payload file
    # damaged and the sidecar rewritten to list the damaged bytes' checksums
    folder, sidecar = _reset(root)
    (folder / checkpoint_files.SIDECAR).write_bytes(sidecar)
    recorded = {
        "weights_sha256": checkpoint_files.weights_checksum(folder),
        "sidecar_sha256": checkpoint_files.sha256_file(folder / checkpoint_files.SIDECAR),
    }
    good = (folder / name).read_bytes()
    payload = data.draw(damaged(good) | st.binary(max_size=64))
    if payload == good:
        return
    (folder / name).write_bytes(payload)
    rewritten = json.loads(sidecar)
    rewritten["files"][name] = checkpoint_files.sha256_file(folder / name)
    rewritten["weights_sha256"] = checkpoint_files.weights_checksum(folder)
    (folder / checkpoint_files.SIDECAR).write_text(json.dumps(rewritten))
    # then: whole in its own terms, yet not the checkpoint its row records
    assert checkpoint_files.problems(folder) == []
    found: list[str] = []
    bounded(lambda: found.extend(checkpoint_files.against_record(folder, **recorded)), ())
    assert (
        f"{folder.name}/{checkpoint_files.SIDECAR}: sha256 differs from the one recorded" in found
    )
    if name == "model.safetensors":
        assert f"{folder.name}: weights sha256 differs from the one recorded" in found


@given(sidecar=sidecars)
def test_a_sidecar_of_any_shape_is_a_named_problem_and_nothing_outside_is_read(root, sidecar):
    folder, _ = _reset(root)
    (folder / checkpoint_files.SIDECAR).write_text(json.dumps(sidecar))
    bounded(lambda: _check(root, folder), ())
    files = sidecar.get("files") if isinstance(sidecar, dict) else None
    if isinstance(files, dict):
        found = checkpoint_files.problems(folder)
        for name in files:
            if name in ("", ".", "..") or "/" in name or "\x00" in name:
                assert any(f"{name!r}"[:80] in p and "not a file name" in p for p in found)
