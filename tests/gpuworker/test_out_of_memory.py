"""A memory error explained: a processor that raises a real torch.OutOfMemoryError
with the CUDA allocator's message (tests/plugins/tight_memory.py) runs through
the batch runner; the failed unit's page, the campaign page and batches.csv
say what happened and what to try, in order."""

from __future__ import annotations

import csv
import io

import pytest
from django.urls import reverse

from campaigns import selectors
from campaigns.models import Attempt, Batch, Profile, Unit
from campaigns.runs import setup
from campaigns.specs import processors as processor_specs
from gpuworker import processors

pytestmark = pytest.mark.django_db

LONG = "long/report.txt"
# The order a unit failing alone at batch 1 reads its advice in, with two
# worker processes sharing the device and no profile yet.
ALONE_ADVICE = [
    "profile-batch",
    "max-tokens",
    "half-precision",
    "expandable-segments",
    "fewer-processes",
    "larger-card",
]


@pytest.fixture
def tight(settings, tmp_path, project, output_root, fresh_device):
    """Seven short notes and one long report, one batch of eight, on a device
    that holds two texts at a time and no text of more than 100 words."""
    settings.BRIEFGPU_PROCESSORS = ["tests.plugins.tight_memory.SPEC"]
    settings.WORKERS_PER_DEVICE = 2
    processor_specs._registry.cache_clear()
    processors._load.cache_clear()
    root = tmp_path / "tight"
    (root / "long").mkdir(parents=True)
    (root / LONG).write_text(" ".join(f"w{i}" for i in range(300)) + "\n")
    for i in range(7):
        (root / f"note-{i}.txt").write_text(f"note {i}: the cache was warm\n")

    def make(**params):
        campaign, _ = setup.campaign_create(
            name="tight",
            processor="tight-memory",
            project=project,
            input_folder=root,
            params=params or None,
            holdout_share=0,
        )
        return campaign

    yield make
    processor_specs._registry.cache_clear()
    processors._load.cache_clear()


def _advice_order(html: str) -> list[str]:
    keys = []
    for part in html.split('data-advice="')[1:]:
        keys.append(part.split('"', 1)[0])
    return keys


def test_a_unit_too_big_alone_keeps_torchs_message_the_figures_and_the_sizes_tried(
    tight, run_here, client, owner
):
    # given
    campaign = tight()

    # when
    run_here(campaign)

    # then: the batch halved 8 → 4 → 2 and the long report failed alone at batch 1
    batch = Batch.objects.get(campaign=campaign)
    assert batch.state == Batch.State.DONE
    assert batch.metrics["oom_splits"] == [8, 4, 4, 2]
    assert batch.metrics["oom_alone"] == 1
    long_unit = Unit.objects.get(campaign=campaign, uid=LONG)
    assert long_unit.error_class == "out_of_memory"
    assert "even alone at batch 1 (batch sizes tried: 8 → 4 → 2 → 1)" in long_unit.error_message
    assert "75.30 GiB is allocated by PyTorch" in long_unit.error_message
    oom = Attempt.objects.get(unit=long_unit).metrics["oom"]
    gib = 1 << 30
    assert oom["tried"] == [8, 4, 2, 1] and oom["alone"] is True
    assert oom["allocated"] == int(75.30 * gib)
    assert oom["reserved"] == int(75.30 * gib) + int(1.10 * gib)
    assert oom["free"] == int(1.20 * gib)
    assert oom["total"] == int(79.15 * gib)
    assert oom["error"].startswith("CUDA out of memory. Tried to allocate 3.00 GiB.")
    assert set(Unit.objects.exclude(uid=LONG).values_list("state", flat=True)) == {"succeeded"}

    # and the unit's page says so, with the advice in order, a larger card last
    client.force_login(owner)
    page = client.get(reverse("unit_detail", args=[campaign.name, long_unit.pk]))
    html = page.content.decode()
    section = html[html.index('id="memory-failure"') :]
    assert "CUDA out of memory. Tried to allocate 3.00 GiB. GPU 0 has a total capacity" in section
    assert "8 → 4 → 2 → 1" in section
    for figure in ("75.30 GiB", "76.40 GiB", "1.20 GiB", "79.15 GiB"):
        assert figure in section
    assert "300 tokens" in section  # the unit's cost, weighed for the page
    assert _advice_order(section) == ALONE_ADVICE
    assert "Lower max_tokens (now 512; this unit has 300 tokens)" in section
    assert "WORKERS_PER_DEVICE=2" in section


def test_with_a_profile_the_advice_starts_with_its_measured_batch(tight, run_here, client, owner):
    campaign = tight()
    run_here(campaign)
    Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.DONE,
        chosen_batch_size=2,
        device="NVIDIA A100 80GB",
    )
    long_unit = Unit.objects.get(campaign=campaign, uid=LONG)
    client.force_login(owner)

    html = client.get(reverse("unit_detail", args=[campaign.name, long_unit.pk])).content.decode()

    first = html[html.index('data-advice="profile-batch"') :]
    assert "Use the profile&#x27;s measured batch: batch_size 2" in first.split("</li>")[0]
    assert _advice_order(html)[0] == "profile-batch"


def test_the_campaign_page_shows_the_splits_and_explains_the_out_of_memory_class(
    tight, run_here, client, owner
):
    campaign = tight()
    run_here(campaign)
    client.force_login(owner)

    html = client.get(reverse("campaign_detail", args=[campaign.name])).content.decode()

    # the batches table has the batch's splits
    batches = html[html.index('class="grid recent-batches"') :]
    assert "<th>Splits</th>" in batches
    assert '<td class="splits">8 → 4 → 2 → 1 (1 failed alone)</td>' in batches
    assert "1 of the last 1 batches were split." in html
    # the failures summary explains the class, larger card last
    summary = html[html.index('id="memory-failures"') :]
    assert "did not fit even alone at batch 1 (batch sizes tried: 8 → 4 → 2 → 1)" in summary
    assert "Allocated by PyTorch 75.30 GiB; Reserved by PyTorch 76.40 GiB" in summary
    assert _advice_order(summary) == ALONE_ADVICE


def test_batches_csv_has_a_splits_column(tight, run_here, client, owner):
    campaign = tight()
    run_here(campaign)
    client.force_login(owner)

    response = client.get(reverse("campaign_export", args=[campaign.name, "batches.csv"]))

    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [row["splits"] for row in rows] == ["8>4>2>1 (1 failed alone)"]


def test_a_batch_that_split_and_fit_shows_its_splits_and_no_failure(tight, run_here, client, owner):
    # given: a device that holds the long report alone
    campaign = tight(fits_words=1000)

    # when
    run_here(campaign)

    # then: every unit succeeded after the halving, and the page says nothing of cards
    assert set(Unit.objects.filter(campaign=campaign).values_list("state", flat=True)) == {
        "succeeded"
    }
    client.force_login(owner)
    html = client.get(reverse("campaign_detail", args=[campaign.name])).content.decode()
    assert '<td class="splits">8 → 4 → 2</td>' in html
    assert 'id="memory-failures"' not in html
    assert "larger-card" not in html


def test_out_of_memory_outside_the_models_run_gets_no_larger_card_advice(
    tight, run_here, client, owner
):
    # given: the memory runs out while the outputs are taken from the result,
    # on a device that holds the whole batch: no batch size was at fault
    campaign = tight(oom_in="unit_metrics", fits_units=8, fits_words=1000)

    # when
    run_here(campaign)

    # then: the units fail out_of_memory with torch's text and figures, and no chain
    long_unit = Unit.objects.get(campaign=campaign, uid=LONG)
    assert long_unit.error_class == "out_of_memory"
    oom = Attempt.objects.get(unit=long_unit).metrics["oom"]
    assert oom["alone"] is False and oom["tried"] == []
    client.force_login(owner)
    unit_page = client.get(
        reverse("unit_detail", args=[campaign.name, long_unit.pk])
    ).content.decode()
    campaign_page = client.get(reverse("campaign_detail", args=[campaign.name])).content.decode()
    section = unit_page[unit_page.index('id="memory-failure"') :]
    assert "This unit's batch ran out of device memory" in section
    assert "75.30 GiB" in section and "CUDA out of memory. Tried to allocate" in section
    assert "larger-card" not in _advice_order(section)
    assert _advice_order(section)[:2] == ["profile-batch", "max-tokens"]
    summary = campaign_page[campaign_page.index('id="memory-failures"') :]
    assert "larger-card" not in _advice_order(summary)


def test_the_out_of_memory_summary_reads_its_failures_in_one_statement(
    tight, run_here, django_assert_num_queries
):
    campaign = tight()
    run_here(campaign)
    counts = selectors.campaign_counts(campaign=campaign)
    failed = counts.by_error["out_of_memory"]
    # The failed units with their attempts and versions; the latest profile.
    with django_assert_num_queries(2):
        summary = selectors.campaign_memory_failures(campaign=campaign, failed=failed)
    assert (summary.failed, summary.looked_at, summary.alone) == (failed, 1, 1)
    assert summary.failure.tried == [8, 4, 2, 1]
