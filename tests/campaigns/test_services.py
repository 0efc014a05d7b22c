from __future__ import annotations

import threading
from unittest import mock

import pytest
from django.core.exceptions import ValidationError
from django.db import connections, transaction

from campaigns.models import Batch, Campaign, Unit, UnitState
from campaigns.runs import control, costs, setup, start
from campaigns.specs.processors import ProcessorSpec
from tests.conftest import DEMO_BAD, DEMO_GOOD


def test_first_version_records_params_software_and_a_fingerprint(make_campaign):
    campaign = make_campaign()
    version = campaign.current_version
    assert version.number == 1
    assert version.params["max_tokens"] == 256
    assert version.params["pooling"] == "mean"
    assert version.params["normalization"] == "l2"
    assert {"python", "torch", "transformers", "git_commit"} <= set(version.software)
    assert len(version.fingerprint) == 64
    assert version.label.startswith("v1-")


def test_a_campaign_made_with_no_parameters_takes_the_fast_batching_and_records_it(
    make_campaign, django_capture_on_commit_callbacks
):
    # The default is the fast path (bench/RESULTS.md, "The defaults are the
    # fast path"), written into the version: a later default leaves it be.
    campaign = make_campaign()
    params = campaign.current_version.params
    assert (params["batch_policy"], params["token_budget"]) == ("token_budget", 4096)
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
    assert set(Batch.objects.filter(campaign=campaign).values_list("policy", flat=True)) == {
        "token_budget"
    }


def test_a_version_made_under_the_former_default_keeps_planning_by_it(
    make_campaign, django_capture_on_commit_callbacks
):
    # Length-grouped batches of 16 were the default before: such a version
    # holds both, and its runs and its next versions keep them.
    campaign = make_campaign(batch_policy="length_grouped", batch_size=16)
    setup.version_create(
        campaign=campaign, params={**campaign.current_version.params, "pooling": "cls"}
    )
    campaign.refresh_from_db()
    assert campaign.current_version.params["batch_policy"] == "length_grouped"
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
    batches = Batch.objects.filter(campaign=campaign)
    assert set(batches.values_list("policy", flat=True)) == {"length_grouped"}
    assert sorted(batches.values_list("size", flat=True)) == [7, 16, 16]


def test_same_parameters_reuse_the_version_and_a_change_makes_a_new_one(make_campaign):
    campaign = make_campaign()
    same = setup.version_create(campaign=campaign, params={})
    changed = setup.version_create(campaign=campaign, params={"batch_size": 8})
    assert same.pk == campaign.versions.get(number=1).pk
    assert changed.number == 2
    assert changed.fingerprint != same.fingerprint


def test_a_version_cannot_be_edited(make_campaign):
    version = make_campaign().current_version
    version.params = {**version.params, "max_tokens": 512}
    with pytest.raises(ValueError, match="immutable"):
        version.save()


def test_unknown_parameters_are_refused_before_anything_is_created(project, corpus):
    with pytest.raises(ValidationError, match="unknown parameter.*polling"):
        setup.campaign_create(
            name="x",
            processor="text-embedding",
            project=project,
            input_folder=corpus,
            params={"polling": "mean"},
        )
    assert not project.campaigns.exists()


def test_run_groups_pending_units_into_batches_and_enqueues_after_commit(
    make_campaign, django_capture_on_commit_callbacks
):
    campaign = make_campaign(batch_policy="length_grouped", batch_size=10)
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        count = start.campaign_run(campaign=campaign)
    total = DEMO_GOOD + DEMO_BAD
    assert count == 4  # 39 pending units in batches of 10
    assert Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).count() == total
    assert Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count() == 0
    sizes = sorted(Batch.objects.filter(campaign=campaign).values_list("size", flat=True))
    assert sizes == [9, 10, 10, 10]
    sent_ids = sorted(call.kwargs["args"][0] for call in send.call_args_list)
    assert sent_ids == sorted(Batch.objects.values_list("pk", flat=True))


def test_planning_weighs_each_text_in_tokens_and_an_unreadable_one_least(
    make_campaign, corpus, django_capture_on_commit_callbacks, monkeypatch
):
    from campaigns.specs.builtin import text_token_cost

    monkeypatch.setattr(costs, "COST_CHUNK", 7)  # 39 units: six queries, none skipped
    campaign = make_campaign(batch_policy="token_budget", token_budget=1024)
    params = campaign.current_version.params
    gone = corpus / "news" / "rail-strike.txt"
    gone.unlink()  # after import: the worker will classify it missing
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
    weights = dict(Unit.objects.filter(campaign=campaign).values_list("source_path", "cost"))
    assert weights.pop("news/rail-strike.txt") == 1
    assert weights == {path: text_token_cost(corpus / path, params) for path in weights}
    assert len(set(weights.values())) > 5  # texts of many lengths, each its own count


def test_a_version_with_another_token_cap_weighs_the_texts_again_and_a_flag_change_does_not(
    make_campaign, corpus, django_capture_on_commit_callbacks
):
    from campaigns.specs.builtin import text_token_cost

    def run_and_costs(campaign) -> dict[str, int]:
        with (
            mock.patch.object(start.celery_app, "send_task"),
            django_capture_on_commit_callbacks(execute=True),
        ):
            start.campaign_run(campaign=campaign)
        control.campaign_pause(campaign=campaign)  # back to pending, as a user's Pause
        return dict(Unit.objects.filter(campaign=campaign).values_list("source_path", "cost"))

    campaign = make_campaign(batch_policy="token_budget", max_tokens=32)
    capped = run_and_costs(campaign)
    assert max(capped.values()) == 32
    longer = setup.version_create(
        campaign=campaign, params={"batch_policy": "token_budget", "max_tokens": 256}
    )
    # Planned with costs capped at 32, texts of up to 256 tokens would overfill
    # every batch's token budget eight times over.
    recounted = run_and_costs(campaign)
    assert recounted == {p: text_token_cost(corpus / p, longer.params) for p in recounted}
    assert max(recounted.values()) == 256
    setup.version_create(
        campaign=campaign,
        params={"batch_policy": "token_budget", "max_tokens": 256, "pooling": "cls"},
    )
    with mock.patch.object(ProcessorSpec, "weigh", autospec=True) as weigh:
        assert run_and_costs(campaign) == recounted
    weigh.assert_not_called()  # pooling does not change a text's tokens


def test_before_the_checkpoint_a_run_weighs_only_the_units_it_sends(
    project, corpus, django_capture_on_commit_callbacks
):
    campaign, _ = setup.campaign_create(
        name="first-group",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        checkpoint_after=5,
        params={"batch_policy": "token_budget"},
    )
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
    units = Unit.objects.filter(campaign=campaign)
    sent = set(units.filter(state=UnitState.QUEUED).values_list("pk", flat=True))
    assert 5 <= len(sent) < DEMO_GOOD + DEMO_BAD  # the first group: 5 + the holdout
    assert set(units.filter(cost__isnull=False).values_list("pk", flat=True)) == sent


def token_budget_campaign_past_checkpoint(make_campaign) -> Campaign:
    """A token-budget campaign whose whole run goes at once (no checkpoint first)."""
    campaign = make_campaign(batch_policy="token_budget", token_budget=1024)
    Campaign.objects.filter(pk=campaign.pk).update(checkpoint_after=0)
    campaign.refresh_from_db()
    return campaign


@pytest.mark.django_db(transaction=True)
def test_a_large_run_sends_its_first_batches_before_it_weighs_the_rest(make_campaign, monkeypatch):
    # a first slice of 4 units, then slices of 10
    monkeypatch.setattr(start, "RUN_SLICE_UNITS", 10)
    monkeypatch.setattr(start, "FIRST_SLICE_UNITS", 4)
    campaign = token_budget_campaign_past_checkpoint(make_campaign)
    units = Unit.objects.filter(campaign=campaign)
    weighed_when_sent: list[int] = []

    def send(_name, args):
        weighed_when_sent.append(units.filter(cost__isnull=False).count())

    with mock.patch.object(start.celery_app, "send_task", side_effect=send):
        sent = start.campaign_run(campaign=campaign)
    total = DEMO_GOOD + DEMO_BAD
    assert sent == len(weighed_when_sent) == Batch.objects.filter(campaign=campaign).count()
    assert weighed_when_sent[0] == 4  # out while 35 texts were still to weigh
    assert 14 in weighed_when_sent  # then the next 10
    assert weighed_when_sent[-1] == total
    assert units.filter(state=UnitState.QUEUED).count() == total
    # Grouped by length within a slice: no batch spans two.
    slices_of: dict[int, set[int]] = {}
    for i, batch_id in enumerate(units.order_by("pk").values_list("batch_id", flat=True)):
        slices_of.setdefault(batch_id, set()).add(0 if i < 4 else 1 + (i - 4) // 10)
    assert len(slices_of) == sent
    assert all(len(slices) == 1 for slices in slices_of.values())


@pytest.mark.django_db(transaction=True)
def test_a_web_start_plans_a_small_first_slice_and_leaves_the_rest_to_the_worker(
    make_campaign, monkeypatch
):
    # given: slices of 20 units, a web start's first slice of 6
    monkeypatch.setattr(start, "RUN_SLICE_UNITS", 20)
    monkeypatch.setattr(start, "FIRST_SLICE_UNITS", 6)
    campaign = token_budget_campaign_past_checkpoint(make_campaign)
    units = Unit.objects.filter(campaign=campaign)
    planned: list[tuple] = []

    def send(name, args):
        planned.append((name, args))

    # when: the page's Start
    with (
        mock.patch.object(start.celery_app, "send_task", side_effect=send),
        transaction.atomic(),
    ):
        batches, more = start.campaign_start(campaign=campaign)

    # then: only the first 6 units were weighed and queued in the request,
    # and the rest was handed to the portal worker's planning task
    first_six = set(units.order_by("pk").values_list("pk", flat=True)[:6])
    assert set(units.filter(state=UnitState.QUEUED).values_list("pk", flat=True)) == first_six
    assert set(units.filter(cost__isnull=False).values_list("pk", flat=True)) == first_six
    assert more and batches == Batch.objects.filter(campaign=campaign).count() >= 1
    assert planned[-1][0] == start.PLAN_TASK

    # and: the worker's part plans the rest in slices of 20, none of them
    # sharing a batch with another
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run_rest(campaign=campaign, since=campaign.created_at)
    total = DEMO_GOOD + DEMO_BAD
    assert units.filter(state=UnitState.QUEUED).count() == total
    ids = list(units.order_by("pk").values_list("pk", "batch_id"))
    slice_of = {pk: 0 if i < 6 else 1 + (i - 6) // 20 for i, (pk, _) in enumerate(ids)}
    slices_of_batch: dict[int, set[int]] = {}
    for pk, batch_id in ids:
        slices_of_batch.setdefault(batch_id, set()).add(slice_of[pk])
    assert all(len(slices) == 1 for slices in slices_of_batch.values())


@pytest.mark.django_db(transaction=True)
def test_a_pause_while_a_large_run_is_planned_stops_it_at_the_next_slice(
    make_campaign, monkeypatch
):
    monkeypatch.setattr(start, "RUN_SLICE_UNITS", 10)
    campaign = token_budget_campaign_past_checkpoint(make_campaign)

    paused: list[int] = []

    def send(_name, args):
        # The user pauses once, as the first slice's batches go out.
        if not paused:
            paused.append(control.campaign_pause(campaign=campaign))

    with mock.patch.object(start.celery_app, "send_task", side_effect=send):
        start.campaign_run(campaign=campaign)
    units = Unit.objects.filter(campaign=campaign)
    assert paused == [10]  # the first slice, taken back
    assert not units.filter(state=UnitState.QUEUED).exists()
    assert units.filter(state=UnitState.PENDING).count() == DEMO_GOOD + DEMO_BAD
    assert not Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).exists()


@pytest.mark.django_db(transaction=True)
def test_a_pause_landing_as_a_slice_commits_takes_that_slice_back(make_campaign):
    """The user presses Pause after the slice's last look at the campaign and
    before its commit: the Pause waits for that commit and takes the slice's
    batches back. (Without the slice's lock on the campaign's row, PostgreSQL
    let the Pause through at once, it found none of the slice's batches, and
    the slice was sent after the Pause.)"""
    campaign = make_campaign()
    Campaign.objects.filter(pk=campaign.pk).update(checkpoint_after=0)
    campaign.refresh_from_db()
    real_on_commit = transaction.on_commit
    pauses: list[int] = []
    pausing: list[threading.Thread] = []

    def pause() -> None:
        try:
            pauses.append(control.campaign_pause(campaign=campaign))
        finally:
            connections.close_all()

    def on_commit(func, *args, **kwargs):
        # Registered after the check, before the commit: the Pause lands here.
        if not pausing:
            pausing.append(threading.Thread(target=pause))
            pausing[0].start()
            pausing[0].join(timeout=1.0)  # let an unblocked Pause finish first
        return real_on_commit(func, *args, **kwargs)

    with (
        mock.patch.object(start.celery_app, "send_task"),
        mock.patch.object(start.transaction, "on_commit", side_effect=on_commit),
    ):
        start.campaign_run(campaign=campaign)
    pausing[0].join(timeout=30)
    units = Unit.objects.filter(campaign=campaign)
    assert pauses == [DEMO_GOOD + DEMO_BAD]  # the whole slice, taken back
    assert not Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).exists()
    assert units.filter(state=UnitState.PENDING).count() == DEMO_GOOD + DEMO_BAD


def test_running_again_enqueues_nothing_new(make_campaign, django_capture_on_commit_callbacks):
    campaign = make_campaign()
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
        assert start.campaign_run(campaign=campaign) == 0


def test_campaign_names_must_be_slugs(project, corpus):
    with pytest.raises(ValidationError, match="lowercase"):
        setup.campaign_create(
            name="My Campaign", processor="text-embedding", project=project, input_folder=corpus
        )


def test_a_campaign_can_be_deleted_but_not_a_version_that_made_batches(
    make_campaign, django_capture_on_commit_callbacks
):
    from django.db.models import RestrictedError

    from campaigns.models import Campaign

    campaign = make_campaign()
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        start.campaign_run(campaign=campaign)
    with pytest.raises(RestrictedError):
        campaign.current_version.delete()
    campaign.delete()
    assert not Campaign.objects.exists() and not Unit.objects.exists()
