"""verify opens inputs by the worker's rules: a FIFO, a device or a socket in
an input's place, or a symlink out of the corpus, is input_invalid with the
reason the worker gives, and verify finishes (it never waits on a FIFO or
reads a device to an end that never comes); the rest of the corpus is
verified as usual (docs/method.md, "verify")."""

from __future__ import annotations

import os
import signal
import socket
import stat

import pytest

from campaigns.intake.inputs import InputError, read_bytes
from campaigns.models import UnitState
from campaigns.runs import setup
from campaigns.verify.reconcile import campaign_verify

pytestmark = pytest.mark.django_db


class Hung(BaseException):
    """Not an OSError (TimeoutError is one): no handler of read errors takes it."""


@pytest.fixture
def deadline():
    """A verify that hangs fails its test (SIGALRM interrupts a blocking open
    or an endless read) instead of stopping the suite."""

    def expired(signum, frame):
        raise Hung("verify did not finish: it waits on or reads a special file")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(60)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def texts(tmp_path):
    root = tmp_path / "texts"
    root.mkdir()
    (root / "a.txt").write_text("The harbour reopens on Monday.\n")
    (root / "empty.txt").write_bytes(b"")
    (root / "b.txt").write_text("A completely different sentence about GPUs.\n")
    (tmp_path / "outside.txt").write_text("The harbour reopens on Monday.\n")
    return root


def _campaign(project, texts, name="special"):
    campaign, _ = setup.campaign_create(
        name=name, processor="text-embedding", project=project, input_folder=texts
    )
    return campaign


def _worker_reason(texts, uid) -> str:
    with pytest.raises(InputError) as refused:
        read_bytes(texts, uid)
    assert refused.value.error_class == "input_invalid"
    return refused.value.message


def _replace(path, make) -> None:
    path.unlink()
    make(path)


@pytest.mark.parametrize("deep", [False, True], ids=["quick", "deep"])
@pytest.mark.parametrize("uid", ["empty.txt", "b.txt"], ids=["empty", "non-empty"])
def test_a_fifo_in_place_of_an_input_is_input_invalid_and_verify_finishes(
    project, texts, output_root, deadline, uid, deep
):
    # given: an imported input (the empty one is hashed whenever its mtime
    # moves, as its size cannot differ) replaced by a FIFO no one writes to
    campaign = _campaign(project, texts)
    _replace(texts / uid, os.mkfifo)
    # when
    report = campaign_verify(campaign=campaign, deep=deep).as_dict()
    # then: the worker's verdict and words; the other inputs still checked
    (sample,) = report["samples"]["input_invalid"]
    assert sample == {"id": uid, "reason": _worker_reason(texts, uid)}
    assert "a FIFO (named pipe)" in sample["reason"]
    assert report["input_invalid"] == 1 and report["input_changed"] == 0
    assert report["pending"] == 2 and report["total"] == 3
    unit = campaign.units.get(uid=uid)
    assert (unit.state, unit.error_class) == (UnitState.FAILED, "input_invalid")


@pytest.mark.parametrize("deep", [False, True], ids=["quick", "deep"])
def test_a_symlink_to_dev_zero_in_place_of_an_empty_input_is_input_invalid(
    project, texts, output_root, deadline, deep
):
    campaign = _campaign(project, texts)
    _replace(texts / "empty.txt", lambda path: os.symlink("/dev/zero", path))
    report = campaign_verify(campaign=campaign, deep=deep).as_dict()
    (sample,) = report["samples"]["input_invalid"]
    # /dev/zero is outside the corpus, and a device: refused before it is read
    assert sample == {"id": "empty.txt", "reason": _worker_reason(texts, "empty.txt")}
    assert report["input_invalid"] == 1 and report["pending"] == 2


@pytest.mark.parametrize("deep", [False, True], ids=["quick", "deep"])
def test_a_device_inside_the_corpus_is_input_invalid(project, texts, output_root, deadline, deep):
    # given: a character device like /dev/zero in the corpus itself
    campaign = _campaign(project, texts)
    (texts / "empty.txt").unlink()
    try:
        os.mknod(texts / "empty.txt", stat.S_IFCHR | 0o666, os.makedev(1, 5))
    except PermissionError:
        pytest.skip("making a device needs CAP_MKNOD")
    report = campaign_verify(campaign=campaign, deep=deep).as_dict()
    (sample,) = report["samples"]["input_invalid"]
    assert sample == {"id": "empty.txt", "reason": _worker_reason(texts, "empty.txt")}
    assert sample["reason"] == "input is not a regular file but a character device: empty.txt"
    assert report["pending"] == 2


@pytest.mark.parametrize("deep", [False, True], ids=["quick", "deep"])
def test_a_symlink_out_of_the_corpus_is_input_invalid_as_at_import_and_in_the_worker(
    project, texts, output_root, deadline, deep
):
    # given: a.txt becomes a link to a file outside the corpus with the very
    # same bytes (verify used to call it valid), b.txt one to a different file
    # (verify used to call it changed)
    campaign = _campaign(project, texts)
    outside = texts.parent / "outside.txt"
    _replace(texts / "a.txt", lambda path: os.symlink(outside, path))
    _replace(texts / "b.txt", lambda path: os.symlink(outside, path))
    # when
    report = campaign_verify(campaign=campaign, deep=deep).as_dict()
    # then
    samples = {s["id"]: s["reason"] for s in report["samples"]["input_invalid"]}
    assert samples == {uid: _worker_reason(texts, uid) for uid in ("a.txt", "b.txt")}
    assert all("leaves the corpus folder" in reason for reason in samples.values())
    assert report["input_invalid"] == 2 and report["input_changed"] == 0
    assert report["pending"] == 1  # empty.txt, still checked


def test_a_symlink_inside_the_corpus_is_still_an_input(project, texts, output_root, deadline):
    campaign = _campaign(project, texts)
    (texts / "copy.txt").write_text("A completely different sentence about GPUs.\n")
    os.utime(texts / "copy.txt", ns=(0, campaign.units.get(uid="b.txt").mtime_ns))
    _replace(texts / "b.txt", lambda path: os.symlink("copy.txt", path))
    report = campaign_verify(campaign=campaign, deep=True).as_dict()
    assert report["pending"] == 3 and report["input_invalid"] == 0


def test_a_socket_in_place_of_an_input_is_input_invalid(project, texts, output_root, deadline):
    campaign = _campaign(project, texts)
    (texts / "b.txt").unlink()
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(texts / "b.txt"))
    try:
        report = campaign_verify(campaign=campaign).as_dict()
        worker = _worker_reason(texts, "b.txt")
    finally:
        server.close()
    (sample,) = report["samples"]["input_invalid"]
    assert sample == {"id": "b.txt", "reason": worker}
    assert sample["reason"] == "input is not a regular file but a socket: b.txt"
