"""A reviewed output is not made again under the parameters that made it, and a
decision on an output the unit has since replaced moves nothing."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
from django.utils import timezone

from campaigns.models import (
    Attempt,
    Batch,
    Campaign,
    ErrorClass,
    ReviewItem,
    Unit,
    UnitState,
)
from campaigns.review import queue as review
from campaigns.runs import control, setup, start
from campaigns.specs import processors as processor_specs
from gpuworker.runner.batch import run_batch
from tests.vectors import output_file

pytestmark = pytest.mark.django_db
UID = "news/solar-farm.txt"


@pytest.fixture
def stats(settings, project, corpus, output_root, run_here) -> Campaign:
    """The demo texts through the text-stats plugin (no model), without a checkpoint."""
    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.text_stats.SPEC"]
    processor_specs._registry.cache_clear()
    campaign, _ = setup.campaign_create(
        name="stats",
        processor="text-stats",
        project=project,
        input_folder=corpus,
        checkpoint_after=0,
        holdout_share=0,
    )
    run_here(campaign)
    yield campaign
    processor_specs._registry.cache_clear()


def _unit(campaign: Campaign) -> Unit:
    return Unit.objects.get(campaign=campaign, uid=UID)


def _new_version(campaign: Campaign):
    version = setup.version_create(
        campaign=campaign, params={**campaign.current_version.params, "lowercase": "yes"}
    )
    campaign.refresh_from_db()
    return version


def _resume_and_run(campaign: Campaign, django_capture_on_commit_callbacks) -> int:
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        _report, retried, _enqueued = control.campaign_resume(campaign=campaign, retry_failed=True)
    queued = Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED)
    for pk in queued.order_by("pk").values_list("pk", flat=True):
        run_batch(pk)
    return retried


def test_a_requeued_unit_waits_for_a_new_version_then_runs_under_it(
    stats, owner, run_here, output_root
):
    # given: a reviewer requeues one output of v1
    first = stats.current_version
    item = review.unit_flag(unit=_unit(stats), user=owner, note="looks off")
    review.review_decide(item=item, decision="requeued", user=owner)
    unit = _unit(stats)
    old_output = output_file(output_root, unit.output_path)
    assert unit.state == UnitState.PENDING and old_output.is_file()

    # when: the campaign runs again under the same parameters
    run_here(stats)

    # then: nothing ran, and the reviewed output was not adopted as a new result
    unit.refresh_from_db()
    assert unit.state == UnitState.PENDING
    assert unit.attempts.count() == 1
    assert start.campaign_run(campaign=stats) == 0

    # when: a new parameter version runs
    second = _new_version(stats)
    run_here(stats)

    # then: the unit ran under it, into its own folder; v1's output is still there
    unit.refresh_from_db()
    assert unit.state == UnitState.SUCCEEDED
    latest = unit.attempts.order_by("-pk").first()
    assert latest.version == second and unit.attempts.count() == 2
    assert unit.output_path.startswith(f"stats/{second.label}/")
    assert old_output.is_file() and f"/{first.label}/" in str(old_output)


def test_the_worker_neither_runs_nor_adopts_a_requeued_unit_under_the_same_version(stats, owner):
    """Whatever path puts it in a batch of v1, the worker gives it back."""
    unit = _unit(stats)
    item = review.unit_flag(unit=unit, user=owner, note="looks off")
    review.review_decide(item=item, decision="requeued", user=owner)
    batch = Batch.objects.create(campaign=stats, version=stats.current_version, size=1)
    Unit.objects.filter(pk=unit.pk).update(state=UnitState.QUEUED, batch=batch)

    assert run_batch(batch.pk) == "done"

    unit.refresh_from_db()
    assert (unit.state, unit.batch_id) == (UnitState.PENDING, None)
    assert unit.attempts.count() == 1  # the reviewed output was not recorded again


def test_a_rejected_unit_is_not_retried_under_the_version_that_made_it(
    stats, owner, django_capture_on_commit_callbacks
):
    item = review.unit_flag(unit=_unit(stats), user=owner, note="looks off")
    review.review_decide(item=item, decision="rejected", user=owner, note="wrong text")

    _resume_and_run(stats, django_capture_on_commit_callbacks)

    unit = _unit(stats)
    assert (unit.state, unit.error_class) == (UnitState.FAILED, ErrorClass.REJECTED_BY_REVIEW)
    assert unit.attempts.count() == 1

    # a new version: resume --retry-failed runs it under that one
    second = _new_version(stats)
    _resume_and_run(stats, django_capture_on_commit_callbacks)
    unit.refresh_from_db()
    assert (unit.state, unit.error_class) == (UnitState.SUCCEEDED, "")
    assert unit.attempts.order_by("-pk").first().version == second


def test_after_a_rerun_a_decision_on_the_old_requeued_item_moves_nothing(stats, owner, run_here):
    # given: requeued under v1, then run under v2 and flagged again
    old = review.unit_flag(unit=_unit(stats), user=owner, note="v1 looks off")
    review.review_decide(item=old, decision="requeued", user=owner)
    _new_version(stats)
    run_here(stats)
    new = review.unit_flag(unit=_unit(stats), user=owner, note="and v2?")
    assert new.version == stats.current_version

    # when: the new item is accepted
    review.review_decide(item=new, decision="accepted", user=owner)

    # then: the unit counts again, the old requeue notwithstanding
    assert _unit(stats).state == UnitState.SUCCEEDED

    # and second thoughts about v1's output are recorded without moving the unit
    review.review_decide(item=old, decision="open", user=owner)
    review.review_decide(item=old, decision="requeued", user=owner)
    assert _unit(stats).state == UnitState.SUCCEEDED
    assert list(old.decisions.values_list("to_state", flat=True)) == [
        "open",
        "requeued",
        "open",
        "requeued",
    ]


def test_a_rule_flag_on_a_later_output_is_not_held_back_by_an_old_requeue(stats, owner):
    """The same version, run again (as before requeues waited for a new version):
    only the items about the latest output decide the unit's state."""
    unit = _unit(stats)
    old = review.unit_flag(unit=unit, user=owner, note="first output")
    review.review_decide(item=old, decision="requeued", user=owner)
    first = unit.attempts.get()
    rerun = Attempt.objects.create(
        unit=unit,
        version=stats.current_version,
        outcome=Attempt.Outcome.SUCCEEDED,
        output_path=first.output_path,
        started_at=timezone.now(),
        finished_at=timezone.now() + timedelta(seconds=1),
        duration_ms=1000,
    )
    Unit.objects.filter(pk=unit.pk).update(state=UnitState.NEEDS_REVIEW)
    flag = ReviewItem.objects.create(
        campaign=stats,
        unit=unit,
        attempt=rerun,
        version=stats.current_version,
        reason="truncated",
    )

    review.review_decide(item=flag, decision="accepted", user=owner)

    assert _unit(stats).state == UnitState.SUCCEEDED


def test_a_holdout_unit_back_to_pending_for_a_new_version_stays_pending_whatever_its_old_items_say(
    stats, owner
):
    unit = _unit(stats)
    first = stats.current_version
    item = review.unit_flag(unit=unit, user=owner, note="held out, and odd")
    Unit.objects.filter(pk=unit.pk).update(holdout=True)
    _new_version(stats)
    unit.refresh_from_db()
    assert (unit.state, unit.output_path) == (UnitState.PENDING, "")

    review.review_decide(item=item, decision="accepted", user=owner)

    assert _unit(stats).state == UnitState.PENDING  # it runs under v2 for the holdout report
    assert Path(item.attempt.output_path).parts[1] == first.label  # what the item judged
