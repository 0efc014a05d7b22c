"""A person sets up a campaign in the browser: parameters swap with the processor,
the preview shows what will fail, Create starts the work."""

from __future__ import annotations

from unittest import mock

import pytest

from campaigns.models import Campaign, UnitState
from campaigns.runs import start

pytestmark = pytest.mark.e2e


def test_set_up_preview_and_start_a_campaign(
    page, live_server, owner, corpus, settings, transactional_db, allow_folder
):
    settings.CORPUS_ROOTS = [corpus.parent]
    allow_folder(corpus)
    page.goto(f"{live_server.url}/campaigns/new/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/campaigns/new/")

    # the parameters follow the processor, without a reload
    page.evaluate("window.__notReloaded = true")
    page.select_option("select[name=processor]", "image-transform")
    page.wait_for_selector("select[name=param_operation]")
    assert page.locator("input[name=param_max_tokens]").count() == 0
    page.select_option("select[name=processor]", "text-embedding")
    page.wait_for_selector("input[name=param_max_tokens]")
    assert page.evaluate("window.__notReloaded") is True

    page.select_option("select[name=project]", "acme")
    page.fill("input[name=name]", "from-the-browser")
    page.select_option("select[name=folder]", str(corpus))
    page.select_option("select[name=param_batch_policy]", "token_budget")

    # preview: what will fail, before anything exists
    page.click("button[value=preview]")
    failing = page.locator("table.failing").inner_text()
    assert "bad/empty.txt" in failing and "empty file" in failing
    assert not Campaign.objects.exists()

    # create and start: the campaign page shows the queued work
    with mock.patch.object(start.celery_app, "send_task") as send:
        page.click("button[value=create]")
        page.wait_for_url("**/campaigns/from-the-browser/")
    campaign = Campaign.objects.get(name="from-the-browser")
    assert campaign.current_version.params["batch_policy"] == "token_budget"
    assert send.call_count >= 1
    queued = campaign.units.filter(state=UnitState.QUEUED).count()
    assert int(page.locator('#counts [data-count="queued"]').inner_text()) == queued == 39
    assert "Created from-the-browser: 39 units" in page.locator("main").inner_text()


def test_the_checkpoint_size_and_holdout_share_are_set_in_the_browser(
    page, live_server, owner, tmp_path, settings, transactional_db, allow_folder
):
    # given: a corpus in three folders, the first holding six copies of one file
    corpus = tmp_path / "corpora" / "mail"
    for folder in ("archive", "letters", "notes"):
        (corpus / folder).mkdir(parents=True)
    for i in range(6):
        (corpus / "archive" / f"copy-{i}.txt").write_text("The same scanned page.")
        (corpus / "letters" / f"letter-{i}.txt").write_text(f"Dear reader {i}, " + "yes " * i)
        (corpus / "notes" / f"note-{i}.txt").write_text(f"Note {i}: " + "remember " * i)
    settings.CORPUS_ROOTS = [corpus.parent]
    allow_folder(corpus)
    page.goto(f"{live_server.url}/campaigns/new/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/campaigns/new/")
    page.select_option("select[name=project]", "acme")
    page.fill("input[name=name]", "mail")
    page.select_option("select[name=folder]", str(corpus))

    # the browser refuses a share of 100 % before anything is sent
    assert page.input_value("input[name=holdout_share]") == "5"
    page.fill("input[name=holdout_share]", "100")
    page.click("button[value=create]")
    assert page.locator("input[name=holdout_share]:invalid").count() == 1
    assert not Campaign.objects.exists()

    # when: a checkpoint after 4 units, no holdout
    page.fill("input[name=checkpoint_after]", "4")
    page.fill("input[name=holdout_share]", "0")
    with mock.patch.object(start.celery_app, "send_task"):
        page.click("button[value=create]")
        page.wait_for_url("**/campaigns/mail/")

    # then: the campaign has them, and its first group spans the folders
    campaign = Campaign.objects.get(name="mail")
    assert (campaign.checkpoint_after, campaign.holdout_share) == (4, 0)
    queued = campaign.units.filter(state=UnitState.QUEUED)
    assert queued.count() == 4
    assert set(queued.values_list("category", flat=True)) == {"archive", "letters", "notes"}
    assert queued.filter(category="archive").count() == 1
    # and the page names the identical inputs found at import
    main = page.locator("main").inner_text()
    assert "6 units are identical inputs (the same sha256) in 1 group" in main
    assert "archive/copy-0.txt = archive/copy-1.txt = archive/copy-2.txt" in main
