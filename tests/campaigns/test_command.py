from __future__ import annotations

import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from campaigns.models import Campaign, Unit, UnitState
from campaigns.review import queue as review
from tests.conftest import waiting_at_checkpoint


def _call(*args) -> str:
    out = StringIO()
    call_command("campaign", *args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.django_db
def test_create_then_status_as_json(corpus):
    out = _call(
        "create",
        "docs",
        "--processor",
        "text-embedding",
        "--input",
        str(corpus),
        "--project",
        "acme",
        "--param",
        "batch_size=8",
    )
    assert "created campaign docs" in out
    campaign = Campaign.objects.get(name="docs")
    assert campaign.project.name == "acme"
    assert campaign.current_version.params["batch_size"] == 8
    Unit.objects.filter(campaign=campaign, uid="bad/empty.txt").update(
        state=UnitState.FAILED, error_class="input_invalid"
    )
    status = json.loads(_call("status", "docs", "--json"))
    assert status == {
        "campaign": "docs",
        "total": 39,
        "pending": 38,
        "queued": 0,
        "running": 0,
        "succeeded": 0,
        "failed": 1,
        "needs_review": 0,
        "by_error": {"input_invalid": 1},
        "planning": False,
        "state": {
            "key": "idle",
            "label": "Idle",
            "detail": "38 units to do",
            "checkpoint_id": None,
        },
        # Not weighed before its first run: no cost yet, no rate, no estimate.
        "watch": {
            "running": False,
            "left": {"units": 38, "cost": None, "cost_exact": True, "cost_unit": "tokens"},
            "rate": None,
            "eta": None,
            "rental": None,
            "stall": None,
            "versions": [
                {
                    "version": campaign.current_version.label,
                    "current": True,
                    "left": {"units": 38, "cost": None},
                    "rate": None,
                    "eta": None,
                }
            ],
        },
    }


def test_status_says_how_many_review_items_are_open(make_campaign, owner):
    campaign = make_campaign("texts")
    assert "review" not in _call("status", "texts")
    units = Unit.objects.filter(campaign=campaign).order_by("pk")[:2]
    items = [review.unit_flag(unit=unit, user=owner, note="looks wrong") for unit in units]
    assert "2 open review items" in _call("status", "texts")
    review.review_decide(item=items[0], decision="accepted", user=owner)
    assert "1 open review item\n" in _call("status", "texts")


@pytest.mark.django_db
def test_list_as_json(corpus):
    _call("create", "a", "--processor", "text-embedding", "--input", str(corpus))
    rows = json.loads(_call("list", "--json"))
    assert [(r["campaign"], r["total"], r["processor"]) for r in rows] == [
        ("a", 39, "text-embedding")
    ]


@pytest.mark.django_db
def test_unknown_parameter_is_a_clear_error(corpus):
    with pytest.raises(CommandError, match="unknown parameter.*colour"):
        _call(
            "create",
            "x",
            "--processor",
            "text-embedding",
            "--input",
            str(corpus),
            "--param",
            "colour=blue",
        )


@pytest.mark.django_db
def test_missing_campaign_is_a_clear_error():
    with pytest.raises(CommandError, match="no campaign named 'nope'"):
        _call("status", "nope")


@pytest.mark.django_db
def test_run_wait_gives_up_with_a_hint_when_no_worker_runs(corpus, settings, tmp_path):
    _call("create", "lonely", "--processor", "text-embedding", "--input", str(corpus))
    with pytest.raises(CommandError, match="is a worker running"):
        _call("run", "lonely", "--wait", "--timeout", "1")


@pytest.mark.django_db
def test_verify_json_has_one_verdict_per_unit(corpus):
    _call("create", "v", "--processor", "text-embedding", "--input", str(corpus))
    (corpus / "news" / "rail-strike.txt").unlink()
    report = json.loads(_call("verify", "v", "--json"))
    assert report["total"] == 39
    assert report["input_missing"] == 1 and report["pending"] == 38
    assert {
        "valid",
        "output_missing",
        "output_incomplete",
        "input_changed",
        "orphan_outputs",
        "stale_temp_files_removed",
    } <= set(report)
    table = _call("verify", "v")
    assert "input_missing" in table and "rail-strike.txt" in table


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("where", "reason"),
    [
        ("file", "is a file, not a folder"),
        ("file/dossier", "Not a directory"),
        ("/proc/briefgpu-nowhere/dossier", "cannot create the folder"),
    ],
)
def test_export_to_a_file_or_an_impossible_path_says_which_and_why(corpus, tmp_path, where, reason):
    _call("create", "e", "--processor", "text-embedding", "--input", str(corpus))
    (tmp_path / "file").write_text("not a folder\n")
    target = tmp_path / where  # an absolute `where` stays itself
    with pytest.raises(CommandError) as info:
        _call("export", "e", "--to", str(target))
    message = str(info.value)
    assert message.startswith("cannot export to ")
    assert str(target) in message and reason in message
    assert (tmp_path / "file").read_text() == "not a folder\n"


@pytest.mark.django_db
def test_export_that_cannot_write_one_of_its_files_names_it(corpus, tmp_path):
    _call("create", "e", "--processor", "text-embedding", "--input", str(corpus))
    (tmp_path / "dossier" / "results.csv").mkdir(parents=True)  # root or not, not writable
    with pytest.raises(CommandError) as info:
        _call("export", "e", "--to", str(tmp_path / "dossier"))
    assert str(info.value) == (
        f"cannot export to {tmp_path / 'dossier'}: cannot write "
        f"{tmp_path / 'dossier' / 'results.csv'} (Is a directory)"
    )
    assert not [p for p in (tmp_path / "dossier").iterdir() if p.name.startswith(".")]


@pytest.mark.django_db
def test_export_writes_the_dossier_files(corpus, tmp_path):
    _call("create", "e", "--processor", "text-embedding", "--input", str(corpus))
    out = _call("export", "e", "--to", str(tmp_path / "dossier"))
    names = sorted(p.name for p in (tmp_path / "dossier").iterdir())
    assert names == [
        "batches.csv",
        "errors.csv",
        "manifest.csv",
        "results.csv",
        "review_decisions.csv",
        "review_effort.json",
        "versions.json",
    ]
    assert "wrote" in out
    versions = json.loads((tmp_path / "dossier" / "versions.json").read_text())
    software = versions["versions"][0]["software"]
    assert {"python", "torch", "transformers", "git_commit", "briefgpu-portal"} <= set(software)
    results = (tmp_path / "dossier" / "results.csv").read_text().splitlines()
    assert results[0] == "id,source_path,output_path,state,error_class,output_size,output_sha256"
    assert len(results) == 40


@pytest.mark.django_db
def test_checkpoint_pass_from_the_command_line_records_the_reviewer_and_runs_on(
    make_campaign, owner, django_capture_on_commit_callbacks
):
    # given
    from unittest import mock

    from campaigns.runs import start

    campaign = make_campaign("texts")
    checkpoint = waiting_at_checkpoint(campaign)
    pending = Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count()

    # when
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        out = _call(
            "checkpoint", "texts", "pass", "--note", "spot check fine", "--as", owner.username
        )

    # then
    checkpoint.refresh_from_db()
    assert checkpoint.state == checkpoint.State.PASSED
    assert (checkpoint.decided_by, checkpoint.reason) == (owner, "spot check fine")
    assert "checkpoint passed: enqueued" in out and send.called
    assert Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).count() == pending


@pytest.mark.django_db
def test_checkpoint_fail_needs_a_reason_and_none_waiting_is_a_clear_error(make_campaign):
    campaign = make_campaign("texts")
    with pytest.raises(CommandError, match="no checkpoint of texts's current version waits"):
        _call("checkpoint", "texts", "pass")
    checkpoint = waiting_at_checkpoint(campaign)

    with pytest.raises(CommandError, match="failing a checkpoint needs a reason"):
        _call("checkpoint", "texts", "fail")
    out = _call("checkpoint", "texts", "fail", "--note", "labels swapped")

    checkpoint.refresh_from_db()
    assert checkpoint.state == checkpoint.State.FAILED and checkpoint.reason == "labels swapped"
    assert "checkpoint failed" in out
    assert not Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).exists()


@pytest.mark.django_db
def test_run_wait_at_the_checkpoint_says_what_the_pending_units_wait_for(make_campaign):
    # given: the first group ran and one of its units waits for review
    campaign = make_campaign("texts")
    waiting_at_checkpoint(campaign)
    Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).filter(
        pk=Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).values("pk")[:1]
    ).update(state=UnitState.NEEDS_REVIEW)
    pending = Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count()

    # when: nothing is queued, so --wait returns at once
    out = _call("run", "texts", "--wait", "--timeout", "5")

    # then
    assert "enqueued 0 batches" in out
    assert "1 need review" in out
    assert (
        f"stopped: {pending} pending units wait for the checkpoint of v1 "
        "(campaign checkpoint texts pass|fail)"
    ) in out
