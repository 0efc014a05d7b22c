"""A person sets up a campaign in the browser: parameters swap with the processor,
the preview shows what will fail, Create starts the work."""

from __future__ import annotations

import json
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


def test_a_record_campaign_is_set_up_from_a_jsonl_file(
    page, live_server, owner, tmp_path, settings, transactional_db, allow_folder
):
    # given: a folder of acme's holding a JSONL file, one row of it without text
    tables = tmp_path / "corpora" / "tables"
    tables.mkdir(parents=True)
    rows = [
        {"doc": "harbour-1", "body": "The harbour reopened on Monday.", "desk": "ports"},
        {"doc": "rail-2", "body": "Trains run again on the coast line.", "desk": "rail"},
        {"doc": "blank-3", "body": "", "desk": "rail"},
    ]
    (tables / "articles.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    settings.CORPUS_ROOTS = [tables.parent]
    allow_folder(tables)
    page.goto(f"{live_server.url}/campaigns/new/")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url("**/campaigns/new/")

    # an image processor takes no records: the choice is withdrawn with the parameters
    page.select_option("select[name=processor]", "image-transform")
    page.wait_for_selector("#records-refused")
    assert page.locator("input[name=source][value=records]").is_disabled()
    page.select_option("select[name=processor]", "text-embedding")
    page.wait_for_selector("input[name=param_max_tokens]")
    assert page.locator("input[name=source][value=records]").is_enabled()

    # the records' fields show once a records file is chosen; the manifest's go
    assert not page.locator("input[name=text_column]").is_visible()
    page.check("input[name=source][value=records]")
    assert page.locator("input[name=text_column]").is_visible()
    assert not page.locator("input[name=manifest]").is_visible()
    page.select_option("select[name=project]", "acme")
    page.fill("input[name=name]", "articles")
    page.select_option("select[name=folder]", str(tables))
    page.fill("input[name=records]", "articles.jsonl")
    page.fill("input[name=id_column]", "doc")
    page.fill("input[name=text_column]", "text")

    # a misnamed column is said on its field, and nothing is made
    page.click("button[value=preview]")
    assert "no column 'text'" in page.locator("#records").inner_text()
    assert not Campaign.objects.exists()
    page.fill("input[name=text_column]", "body")
    page.fill("input[name=category_column]", "desk")
    page.click("button[value=preview]")
    assert "empty text" in page.locator("table.failing").inner_text()
    assert "harbour-1" in page.locator("table.first").inner_text()

    # create: the campaign page lists the rows as units
    with mock.patch.object(start.celery_app, "send_task"):
        page.click("button[value=create]")
        page.wait_for_url("**/campaigns/articles/")
    campaign = Campaign.objects.get(name="articles")
    assert campaign.records["columns"] == {"id": "doc", "text": "body", "category": "desk"}
    main = page.locator("main").inner_text()
    assert "Created articles: 3 units (1 failed at import)" in main
    assert "harbour-1" in main and "rail-2" in main and "blank-3" in main
    assert int(page.locator('#counts [data-count="queued"]').inner_text()) == 2
