"""The pages of a real run in Chromium, where it used to crash, mislead or send
the user to the shell: a plugin's campaign page and an adaptation's "Create
and start" open; a memory error explains itself; Run says why nothing was
queued at a checkpoint; Resume retries the failed units of a class ticked; a
profile's estimate says what it assumed."""

from __future__ import annotations

import json
import re
from unittest import mock

import pytest
from django.urls import reverse

from campaigns.models import Batch, Campaign, Training, Unit, UnitState
from campaigns.runs import setup, start
from campaigns.specs import processors as processor_specs
from tests.campaigns.test_profile_caveats import (  # noqa: F401 (fixtures)
    CAP_REACHED,
    CUDA_L4,
    _capped,
    _rerun_on_l4,
    campaign,
    done,
)
from tests.conftest import waiting_at_checkpoint
from tests.gpuworker.conftest import fresh_device  # noqa: F401 (fixture)
from tests.gpuworker.test_out_of_memory import ALONE_ADVICE, LONG, tight  # noqa: F401 (fixture)

pytestmark = pytest.mark.e2e


def _sign_in(page, url: str) -> None:
    page.goto(url)
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("button[type=submit]")
    page.wait_for_url(url)


def _cells(row) -> list[str]:
    return [text.strip() for text in row.locator("td").all_inner_texts()]


# --- problem 2: pages that crashed -------------------------------------------------------


@pytest.fixture
def text_stats(settings):
    """The documented plugin example, registered as its guide says."""
    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.text_stats.SPEC"]
    processor_specs._registry.cache_clear()
    yield
    processor_specs._registry.cache_clear()


def test_the_plugin_examples_campaign_page_shows_its_batches_without_a_padding_figure(
    page, live_server, owner, project, corpus, output_root, run_here, text_stats, transactional_db
):
    # given: the example plugin's campaign ran; its batches count the words
    # they read (real tokens) and pad nothing
    stats, _ = setup.campaign_create(
        name="stats", processor="text-stats", project=project, input_folder=corpus
    )
    run_here(stats)
    batches = Batch.objects.filter(campaign=stats, state=Batch.State.DONE)
    assert batches.exists() and not batches.filter(padded_tokens__isnull=False).exists()
    words = sum(batches.values_list("real_tokens", flat=True))
    items = sum(batches.values_list("size", flat=True))

    # when
    _sign_in(page, f"{live_server.url}/campaigns/stats/")

    # then: the batches section, its policy row and every batch, with no padding figure
    assert page.locator("h1").inner_text().startswith("stats")
    policy = page.locator('#batches table.policies tr[data-policy="original"]')
    parameters, name, count, shown_items, real, padded, padding = _cells(policy)[:7]
    assert (name, count, shown_items) == ("original", str(batches.count()), f"{items:,}")
    assert (real, padded, padding) == (f"{words:,}", "—", "—")
    rows = page.locator("#batches table.recent-batches tbody tr")
    assert rows.count() == batches.count()
    first = _cells(rows.first)
    assert first[4] != "—" and int(first[4].replace(",", "")) > 0  # real tokens
    assert (first[5], first[6]) == ("—", "—")  # padded, padding
    assert "Nothing to run" not in page.locator("main").inner_text()


def test_create_and_start_of_an_adaptation_campaign_lands_on_its_queued_training(
    page, live_server, owner, tmp_path, settings, transactional_db, allow_folder
):
    # given: a folder of example pairs in an allowed root
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for i in range(8):
        (pairs / f"p{i}.json").write_text(json.dumps({"anchor": f"q {i}", "positive": f"a {i}"}))
    settings.CORPUS_ROOTS = [tmp_path]
    allow_folder(pairs)
    _sign_in(page, f"{live_server.url}/campaigns/new/")
    page.select_option("select[name=project]", "acme")
    page.fill("input[name=name]", "web-tuned")
    page.select_option("select[name=processor]", "text-adaptation")
    page.wait_for_selector("input[name=param_base_model]")
    page.select_option("select[name=folder]", str(pairs))

    # when: Create and start
    with mock.patch.object(start.celery_app, "send_task") as send:
        page.click("button[value=create]")
        page.wait_for_url("**/campaigns/web-tuned/training/")

    # then: the training page, its training queued for a worker
    tuned = Campaign.objects.get(name="web-tuned")
    assert Training.objects.get(campaign=tuned).state == Training.State.QUEUED
    assert send.call_count == 1
    assert page.locator("#training").get_attribute("data-state") == "queued"
    assert page.locator("#training-state").inner_text().startswith("Queued")
    assert Unit.objects.filter(campaign=tuned).count() == 8
    assert page.locator("h1").inner_text() == "Training"


# --- problem 3: a memory error explained -------------------------------------------------


def test_a_unit_out_of_memory_shows_torchs_message_the_figures_and_what_to_try(
    page,
    live_server,
    owner,
    tight,  # noqa: F811 (the imported fixture)
    run_here,
    transactional_db,
):
    # given: a batch of eight on a device that holds two short texts, and the
    # long report not even alone
    tight_campaign = tight()
    run_here(tight_campaign)
    assert Unit.objects.get(campaign=tight_campaign, uid=LONG).error_class == "out_of_memory"

    # when: the campaign page
    _sign_in(page, f"{live_server.url}/campaigns/tight/")

    # then: the batches table shows the halving, and the failures what to try
    splits = page.locator("#batches table.recent-batches td.splits")
    assert splits.all_inner_texts() == ["8 → 4 → 2 → 1 (1 failed alone)"]
    assert page.locator("#split-batches").inner_text() == "1 of the last 1 batches were split."
    summary = page.locator("#memory-failures")
    assert "did not fit even alone at batch 1 (batch sizes tried: 8 → 4 → 2 → 1)" in (
        summary.inner_text()
    )
    advice = summary.locator("ol.memory-advice li")
    assert [advice.nth(i).get_attribute("data-advice") for i in range(advice.count())] == (
        ALONE_ADVICE
    )

    # when: from the failure class to the failed unit
    page.click('#counts a[data-error="out_of_memory"]')
    page.locator("#units a", has_text=LONG).click()
    page.wait_for_url(re.compile(r".*/campaigns/tight/units/\d+/$"))

    # then: torch's own message, the figures at the failure, the advice in order
    failure = page.locator("#memory-failure")
    assert "does not fit in device memory even alone, at batch 1" in failure.inner_text()
    assert failure.locator("strong.chain").inner_text() == "8 → 4 → 2 → 1"
    message = failure.locator("pre.error-text").inner_text()
    assert message.startswith("CUDA out of memory. Tried to allocate 3.00 GiB.")
    assert "75.30 GiB is allocated by PyTorch" in message
    figures = {
        label: failure.locator(f'dd[data-figure="{label}"]').inner_text()
        for label in (
            "Allocated by PyTorch",
            "Reserved by PyTorch",
            "Free on the device",
            "Device total",
        )
    }
    assert figures == {
        "Allocated by PyTorch": "75.30 GiB",
        "Reserved by PyTorch": "76.40 GiB",
        "Free on the device": "1.20 GiB",
        "Device total": "79.15 GiB",
    }
    assert failure.locator('dd[data-figure="cost"]').inner_text() == "300 tokens"
    steps = failure.locator("ol.memory-advice li")
    assert [steps.nth(i).get_attribute("data-advice") for i in range(steps.count())] == (
        ALONE_ADVICE
    )
    assert (
        steps.nth(1).inner_text().startswith("Lower max_tokens (now 512; this unit has 300 tokens)")
    )
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in steps.nth(3).inner_text()
    assert "WORKERS_PER_DEVICE=2" in steps.nth(4).inner_text()


# --- problem 6: Run at a waiting checkpoint ----------------------------------------------


def test_run_while_the_checkpoint_waits_says_which_checkpoint_holds_the_pending_units(
    page,
    live_server,
    owner,
    campaign,  # noqa: F811 (the imported fixture)
    transactional_db,
):
    # given: the first group done and its checkpoint waiting for the spot check
    checkpoint = waiting_at_checkpoint(campaign)
    version = checkpoint.version.number
    pending = Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count()
    assert pending > 0
    _sign_in(page, f"{live_server.url}/campaigns/texts/")
    assert page.locator("#run-state").inner_text() == (
        f"Waiting at checkpoint {checkpoint.pk} (v{version})"
    )

    # when: Run remaining units
    with mock.patch.object(start.celery_app, "send_task") as send:
        page.click("button:text('Run remaining units')")
        page.locator("p.message", has_text="Nothing to run").wait_for()

    # then: nothing sent, and the flash names the checkpoint and the units it holds
    assert send.call_count == 0
    flash = page.locator("p.message", has_text="Nothing to run").inner_text()
    assert f"{pending} pending units wait for the checkpoint of v{version}" in flash
    assert "no pending units" not in flash
    assert int(page.locator('#counts [data-count="pending"]').inner_text()) == pending


# --- problem 7: Resume retries the failed units of a class --------------------------------


def test_resume_with_a_failure_class_ticked_retries_those_units_only(
    page,
    live_server,
    owner,
    campaign,  # noqa: F811 (the imported fixture)
    transactional_db,
):
    # given: failures of two classes
    units = list(Unit.objects.filter(campaign=campaign, holdout=False).order_by("pk"))
    Unit.objects.filter(pk__in=[u.pk for u in units[:3]]).update(
        state=UnitState.FAILED, error_class="processing_error", error_message="boom"
    )
    Unit.objects.filter(pk__in=[u.pk for u in units[3:5]]).update(
        state=UnitState.FAILED, error_class="out_of_memory", error_message="too big"
    )
    _sign_in(page, f"{live_server.url}/campaigns/texts/")
    resume = page.locator("form#resume")
    assert "processing_error (3)" in resume.inner_text()
    assert "out_of_memory (2)" in resume.inner_text()
    assert page.locator('#counts [data-count="failed"]').inner_text() == "5"

    # when: one class ticked, Resume
    resume.get_by_label("processing_error (3)").check()
    with mock.patch.object(start.celery_app, "send_task") as send:
        resume.locator("button", has_text="Resume").click()
        page.locator("p.message", has_text="Resumed").wait_for()

    # then: those three run again, the out-of-memory ones stay failed
    assert "3 failed units retried" in page.locator("p.message", has_text="Resumed").inner_text()
    assert send.call_count >= 1
    assert page.locator('#counts [data-count="failed"]').inner_text() == "2"
    assert page.locator('#counts a[data-error="processing_error"]').count() == 0
    assert page.locator('#counts a[data-error="out_of_memory"]').inner_text() == "out_of_memory 2"
    assert not Unit.objects.filter(campaign=campaign, error_class="processing_error").exists()
    assert (
        Unit.objects.filter(
            campaign=campaign, state=UnitState.FAILED, error_class="out_of_memory"
        ).count()
        == 2
    )


# --- problem 8: estimates that say what they assumed --------------------------------------


def test_the_profile_page_shows_the_cap_the_extrapolation_and_the_software_compared(
    page,
    live_server,
    owner,
    done,  # noqa: F811 (the imported fixture)
    transactional_db,
):
    # given: a profile on CUDA 12.6, then its sample re-run on CUDA 12.8, whose
    # chosen batch is the largest it tried
    first = done
    type(first).objects.filter(pk=first.pk).update(
        device="NVIDIA L4", runtime={**CUDA_L4, "torch": "2.12.1+cu126", "cuda": "12.6"}
    )
    second = _capped(_rerun_on_l4(first, CUDA_L4))
    report = f"{live_server.url}{reverse('campaign_profile', args=[first.campaign.name])}"

    # when: the profile page
    _sign_in(page, report)

    # then: the chosen batch is the cap, and the page says larger ones may fit
    assert page.locator("#chosen [data-chosen]").inner_text() == "64"
    cap = page.locator("#cap-reached").inner_text()
    assert "Batch 64 is the largest batch this profile tried (largest batch to try: 64)" in cap
    assert CAP_REACHED in cap
    assert any(
        CAP_REACHED in line and "batch 64" in line
        for line in page.locator("#reasoning li").all_inner_texts()
    )

    # when: compared with the earlier profile
    page.locator(f"#earlier-profiles li[data-profile='{first.pk}'] a").click()
    page.wait_for_url(re.compile(rf".*\?compare={first.pk}$"))

    # then: torch, CUDA, driver and device side by side, and a warning that they differ
    compare = page.locator("#profile-compare")
    rows = {
        field: _cells(compare.locator(f'tr[data-field="{field}"]'))
        for field in ("device", "torch", "cuda", "driver")
    }
    assert rows == {
        "device": ["NVIDIA L4", "NVIDIA L4", ""],
        "torch": ["2.13.0+cu128", "2.12.1+cu126", "differs"],
        "cuda": ["12.8", "12.6", "differs"],
        "driver": ["570.86", "570.86", ""],
    }
    assert "torch 2.12.1+cu126 → 2.13.0+cu128; CUDA 12.6 → 12.8" in (
        page.locator("#software-differs").inner_text()
    )

    # when: the full corpus is 2 M documents
    form = page.locator("form#corpus-size")
    form.locator("input[name=corpus]").fill("2M")
    form.locator("select[name=corpus_unit]").select_option("units")
    form.locator("button", has_text="Extrapolate").click()
    page.wait_for_url(re.compile(r".*corpus=2M.*"))

    # then: the estimate again, scaled and said to be an extrapolation; the
    # comparison kept, the size asked kept in the form
    caveat = page.locator("#extrapolation-caveat").inner_text()
    assert caveat.startswith("Extrapolated, not measured: 2,000,000 units = 2,000,000 units")
    units = second.estimate.units
    assumptions = page.locator("#extrapolation-assumptions").inner_text()
    assert "an extrapolation, not a measurement" in assumptions
    assert f"over this campaign's {units:,} units" in assumptions
    assert page.locator("#extrapolated-hours").inner_text().endswith("at batch 64")
    assert page.locator("#extrapolated-projections tbody tr").count() >= 1
    assert page.locator("#extrapolated-plan").inner_text() != ""
    assert page.locator("#software-differs").is_visible()
    assert page.input_value("form#corpus-size input[name=corpus]") == "2M"
