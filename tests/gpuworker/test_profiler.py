"""The batch-size profiler on CPU against a memory budget, as on a GPU against its memory."""

from __future__ import annotations

import pytest

from campaigns import profiling, selectors, services
from campaigns.models import Batch, Profile
from gpuworker.memory import StepMemory, allocated_now, cpu
from gpuworker.processors import get_processor
from gpuworker.profiler import profile_run

MiB = 1024 * 1024
SHORT, LONG = 120, 6


@pytest.fixture
def skewed_corpus(tmp_path):
    """Many short texts and a few long ones: the long ones set the memory."""
    root = tmp_path / "skewed"
    root.mkdir()
    for i in range(SHORT):
        (root / f"short-{i:03d}.txt").write_text(f"note {i}: the cache was warm and fast.\n")
    for i in range(LONG):
        words = " ".join(f"token{i}x{j}" for j in range(400))
        (root / f"long-{i}.txt").write_text(f"report {i}: {words}\n")
    return root


def _campaign(project, folder, name="skewed", **params):
    campaign, _ = services.campaign_create(
        name=name,
        processor="text-embedding",
        project=project,
        input_folder=folder,
        params={"max_tokens": 256, **params},
    )
    return campaign


def test_profile_fits_the_heaviest_inputs_with_the_margin_and_a_full_run_stays_under(
    project, skewed_corpus, output_root, run_here, catalog
):
    # given: a budget that lets 64 short texts through but not 64 long ones
    campaign = _campaign(project, skewed_corpus)
    processor = get_processor("text-embedding", campaign.current_version.params)
    processor.embed(["warm up"] * 4)
    baseline = allocated_now(cpu())
    margin = 0.2
    budget = int((baseline + 120 * MiB) / (1 - margin))
    profile = profiling.profile_create(
        campaign=campaign, margin=margin, memory_budget=budget, max_batch_size=64, sample_size=24
    )

    # when
    assert profile_run(profile.pk) == "done"
    profile.refresh_from_db()

    # then: the typical texts fit at 64, the long ones only at a smaller size
    count_steps = [s for s in profile.steps if s["phase"] == "count"]
    assert max(s["batch_size"] for s in count_steps if s["fits"]) == 64
    chosen = profile.chosen_batch_size
    assert 1 <= chosen < 64, profile.steps
    heavy_at_chosen = [
        s for s in profile.steps if s["phase"] == "heaviest" and s["batch_size"] == chosen
    ]
    assert all(s["peak_reserved"] <= (1 - margin) * budget for s in heavy_at_chosen)
    # the size above the chosen one, on the heaviest, did not keep the margin
    failed_above = [
        s
        for s in profile.steps
        if s["phase"] == "heaviest" and s["batch_size"] > chosen and not s["fits"]
    ]
    assert failed_above, profile.steps
    # the heaviest it tried are the long texts — all of them but the holdout's
    long_units = campaign.units.filter(uid__startswith="long-", holdout=False)
    assert {t["uid"] for t in profile.heaviest_tried} >= set(
        long_units.values_list("uid", flat=True)
    )
    assert not campaign.units.filter(holdout=True, pk__in=profile.sample).exists()
    assert profile.leak["leak"] is False, profile.leak

    # and a full run at the chosen size never exceeds the budget
    version = services.version_create(
        campaign=campaign, params={**campaign.current_version.params, "batch_size": chosen}
    )
    assert version.params["batch_size"] == chosen
    with StepMemory(cpu()) as memory:
        run_here(campaign)
    assert selectors.campaign_counts(campaign=campaign).succeeded == SHORT + LONG
    assert memory.peak_reserved <= budget, (memory.peak_reserved / MiB, budget / MiB)


def test_estimate_follows_the_corpus_distribution_not_the_sample_mean(
    project, skewed_corpus, output_root, run_here, catalog
):
    campaign = _campaign(project, skewed_corpus, batch_policy="length_grouped")
    profile = profiling.profile_create(campaign=campaign, max_batch_size=32, sample_size=24)
    assert profile_run(profile.pk) == "done"
    profile.refresh_from_db()
    estimate = profile.estimate
    assert estimate.units == SHORT + LONG
    # the sample over-represents long texts: its mean overstates the corpus
    assert estimate.hours_naive > 1.25 * estimate.hours_measured_device

    # the estimate priced the batches a real run at the profiled size makes: the
    # same count and the same padded tokens (how long they take on this machine
    # is a benchmark's question: bench/profile_device.py --run)
    services.version_create(
        campaign=campaign,
        params={**campaign.current_version.params, "batch_size": profile.chosen_batch_size},
    )
    run_here(campaign)
    done = Batch.objects.filter(campaign=campaign, state=Batch.State.DONE)
    model = profiling.fit_throughput(profile.steps)
    priced = sum(model.batch_seconds(b.padded_tokens) for b in done)
    priced += model.per_item * estimate.units
    estimated = estimate.hours_measured_device * 3600
    assert priced == pytest.approx(estimated, rel=0.01)

    # the estimate ends in a rental plan with its reasons, projections labelled
    assert estimate.gpu_name and estimate.quantity and estimate.duration_days in (3, 7, 30)
    assert {p["kind"] for p in estimate.projections} == {"projection"}
    assert any("projection" in line for line in estimate.reasoning)
    assert [p["policy"] for p in profile.policies] == ["original", "length_grouped", "token_budget"]
    original, grouped, _ = profile.policies
    assert grouped["padded"] < original["padded"]


def test_a_profile_is_rerun_on_the_same_sample(project, skewed_corpus, output_root, catalog):
    campaign = _campaign(project, skewed_corpus)
    first = profiling.profile_create(campaign=campaign, max_batch_size=4, sample_size=10)
    again = profiling.profile_rerun(profile=first)
    assert again.sample == first.sample and again.heavy == first.heavy
    assert Profile.objects.filter(campaign=campaign).count() == 2
