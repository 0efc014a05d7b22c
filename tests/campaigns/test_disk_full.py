"""A full output disk: units fail output_write_error, no partial file counts, and
resume completes once space is freed."""

from __future__ import annotations

import os
import subprocess
from unittest import mock

import pytest

from campaigns import selectors
from campaigns.models import UnitState
from campaigns.runs import control, start
from campaigns.storage.outputs import is_temp_file
from campaigns.verify.reconcile import campaign_verify
from tests.conftest import DEMO_BAD, DEMO_GOOD


@pytest.fixture
def small_disk(tmp_path, settings):
    """A 48 KiB tmpfs as OUTPUT_ROOT (needs root to mount; skipped without it)."""
    mount = tmp_path / "small-disk"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(mount)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {done.stderr.strip()}")
    settings.OUTPUT_ROOT = mount
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_fails_units_cleanly_and_resume_completes_after_space_is_freed(
    make_campaign, small_disk, run_here, django_capture_on_commit_callbacks
):
    campaign = make_campaign("full-disk", batch_size=8)
    run_here(campaign)

    counts = selectors.campaign_counts(campaign=campaign)
    write_errors = counts.by_error.get("output_write_error", 0)
    assert write_errors > 0 and counts.succeeded > 0
    assert counts.succeeded + write_errors == DEMO_GOOD
    failed = campaign.units.filter(error_class="output_write_error").first()
    assert "No space left on device" in failed.error_message
    # no partial file anywhere, and every counted output is whole
    leftovers = [p for p in small_disk.rglob("*") if p.is_file() and is_temp_file(p.name)]
    assert leftovers == []
    assert campaign_verify(campaign=campaign).counts.get("output_invalid", 0) == 0
    # the campaign says so (here beside its checkpoint), not "done"
    state = selectors.campaign_run_state(campaign_id=campaign.pk, counts=counts)
    assert f"{write_errors} units failed to write their output" in state.detail
    assert "Resume redoes them" in state.detail

    # when space is freed, resume does only what is missing
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_disk)], check=True)
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        _report, retried, _enqueued = control.campaign_resume(campaign=campaign)
    assert retried == write_errors
    run_here(campaign)  # runs the batches resume queued
    counts = selectors.campaign_counts(campaign=campaign)
    assert (counts.succeeded, counts.failed) == (DEMO_GOOD, DEMO_BAD)
    assert campaign.units.filter(state=UnitState.SUCCEEDED).count() == DEMO_GOOD
    assert os.path.ismount(small_disk)
