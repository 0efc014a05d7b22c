"""verify's verdict on inputs that are there but cannot be read: the same
class the import and the worker give them."""

from __future__ import annotations

import os
import shutil
import socket

import pytest

from campaigns.models import Unit, UnitState
from campaigns.runs import setup
from campaigns.verify.reconcile import campaign_verify

pytestmark = pytest.mark.django_db

AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


@pytest.fixture
def texts(tmp_path):
    root = tmp_path / "texts"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("The harbour reopens on Monday.\n")
    (root / "sub" / "b.txt").write_text("A completely different sentence about GPUs.\n")
    return root


def test_an_input_the_worker_refused_is_filed_where_the_worker_filed_it_at_verify_too(
    project, texts, output_root, run_here
):
    # given: a trusted manifest row (not opened at import) naming a socket,
    # which no process, root included, can open as a file: the worker files
    # it as the import would, not a regular file
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(texts / "socket.txt"))
    try:
        manifest = texts / "manifest.csv"
        manifest.write_text(f"path,size,sha256\na.txt,,\nsocket.txt,10,{'0' * 64}\n")
        campaign, _ = setup.campaign_create(
            name="unreadable", processor="text-embedding", project=project, manifest=manifest
        )
        run_here(campaign)
        unit = campaign.units.get(uid="socket.txt")
        assert (unit.state, unit.error_class) == (UnitState.FAILED, "input_invalid")
        assert unit.error_message == "input is not a regular file but a socket: socket.txt"
        # when
        report = campaign_verify(campaign=campaign).as_dict()
    finally:
        server.close()
    # then: verify files it where the worker did
    assert report["input_invalid"] == 1 and report["input_unreadable"] == 0
    (sample,) = report["samples"]["input_invalid"]
    assert sample == {"id": "socket.txt", "reason": unit.error_message}


def test_an_input_the_worker_could_not_read_stays_input_unreadable_at_verify(
    project, texts, output_root
):
    # given: a unit the worker failed on an I/O error
    campaign, _ = setup.campaign_create(
        name="io-error", processor="text-embedding", project=project, input_folder=texts
    )
    reason = "cannot read input: Input/output error"
    Unit.objects.filter(campaign=campaign, uid="a.txt").update(
        state=UnitState.FAILED, error_class="input_unreadable", error_message=reason
    )
    report = campaign_verify(campaign=campaign).as_dict()
    assert report["input_unreadable"] == 1 and report["input_invalid"] == 0
    assert report["samples"]["input_unreadable"] == [{"id": "a.txt", "reason": reason}]


@pytest.mark.skipif(AS_ROOT, reason="root reads and lists whatever the permissions say")
def test_an_input_in_a_folder_that_can_no_longer_be_entered_is_input_unreadable(
    project, texts, output_root
):
    campaign, _ = setup.campaign_create(
        name="locked", processor="text-embedding", project=project, input_folder=texts
    )
    (texts / "sub").chmod(0)
    try:
        report = campaign_verify(campaign=campaign).as_dict()
        deep = campaign_verify(campaign=campaign, deep=True).as_dict()
    finally:
        (texts / "sub").chmod(0o755)
    assert report["input_unreadable"] == 1 and report["input_invalid"] == 0
    assert report["samples"]["input_unreadable"][0]["id"] == "sub/b.txt"
    unit = campaign.units.get(uid="sub/b.txt")
    assert (unit.state, unit.error_class) == (UnitState.FAILED, "input_unreadable")
    assert deep["input_unreadable"] == 1


@pytest.mark.skipif(AS_ROOT, reason="root reads whatever the permissions say")
def test_a_deep_verify_of_an_input_no_one_may_read_says_input_unreadable(
    project, texts, output_root
):
    campaign, _ = setup.campaign_create(
        name="chmodded", processor="text-embedding", project=project, input_folder=texts
    )
    (texts / "a.txt").chmod(0)
    try:
        report = campaign_verify(campaign=campaign, deep=True).as_dict()
    finally:
        (texts / "a.txt").chmod(0o644)
    assert report["input_unreadable"] == 1
    assert "Permission denied" in report["samples"]["input_unreadable"][0]["reason"]


def test_an_input_replaced_by_a_folder_is_refused_as_at_import_not_called_changed(
    project, texts, output_root
):
    campaign, _ = setup.campaign_create(
        name="folded", processor="text-embedding", project=project, input_folder=texts
    )
    Unit.objects.filter(campaign=campaign, uid="a.txt").update(state=UnitState.SUCCEEDED)
    (texts / "a.txt").unlink()
    (texts / "a.txt").mkdir()
    try:
        report = campaign_verify(campaign=campaign).as_dict()
    finally:
        shutil.rmtree(texts / "a.txt")
    assert report["input_invalid"] == 1 and report["input_changed"] == 0
    (sample,) = report["samples"]["input_invalid"]
    assert sample == {"id": "a.txt", "reason": "input is a folder, not a file: a.txt"}
    unit = campaign.units.get(uid="a.txt")
    assert (unit.state, unit.error_class) == (UnitState.FAILED, "input_invalid")
