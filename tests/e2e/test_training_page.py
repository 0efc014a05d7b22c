"""The training page in Chromium: progress that moves by itself, curves, and a
checkpoint put to use in another campaign."""

from __future__ import annotations

import pytest

from campaigns.models import Training
from tests.campaigns.test_training_views import pairs, trained  # noqa: F401 (fixtures)

pytestmark = pytest.mark.e2e


def test_progress_moves_without_reload_and_a_checkpoint_becomes_a_version(
    page,
    live_server,
    trained,  # noqa: F811 (the imported fixture)
    make_campaign,
    owner,
):
    campaign, training = trained
    make_campaign("texts")
    # a training still running: the page polls it
    Training.objects.filter(pk=training.pk).update(state=Training.State.RUNNING, step=4)

    page.goto(f"{live_server.url}/campaigns/{campaign.name}/training/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/training/")
    assert "step 4 of 6" in page.locator("#training").inner_text()
    page.evaluate("window.__notReloaded = true")

    # the worker moves on, then finishes: the page follows by itself
    Training.objects.filter(pk=training.pk).update(step=6, state=Training.State.DONE)
    page.wait_for_function(
        "() => document.querySelector('#training').dataset.state === 'done'", timeout=10_000
    )
    assert "step 6 of 6" in page.locator("#training").inner_text()
    assert page.evaluate("window.__notReloaded") is True

    # the curves: training and held-out loss, the base model's line to beat
    assert page.locator("#loss-chart polyline").count() == 2
    assert "base model held-out loss" in page.locator("#loss-chart").inner_text()

    # use the last checkpoint in the embedding campaign
    row = page.locator("#checkpoint-6")
    row.locator("select[name=target]").select_option("texts")
    row.locator("button", has_text="Use this checkpoint").click()
    page.wait_for_url("**/campaigns/texts/")
    lineage = page.locator("#lineage").inner_text()
    assert "adapt, step 6" in lineage and "Model from a fine-tuning checkpoint" in lineage
