"""The profile of a training: weights, gradients, optimizer states, activations apart."""

from __future__ import annotations

import json
from unittest import mock

import pytest
from django.urls import reverse

from campaigns.models import Profile
from campaigns.profiles.services import profile_create
from campaigns.runs import setup
from gpuworker import training_profile
from gpuworker.profiler import profile_run

MiB = 1024 * 1024


@pytest.fixture
def long_pairs(tmp_path):
    root = tmp_path / "pairs"
    root.mkdir()
    for i in range(24):
        words = " ".join(f"word{i}x{j}" for j in range(8 if i % 4 else 150))
        pair = {"anchor": f"question {i}: {words}", "positive": f"answer {i}: {words}"}
        (root / f"p{i:02d}.json").write_text(json.dumps(pair))
    return root


def test_a_training_profile_counts_each_part_of_memory_and_plans_the_epochs(
    project, long_pairs, output_root, catalog, client, owner
):
    campaign, _ = setup.campaign_create(
        name="adapt",
        processor="text-adaptation",
        project=project,
        input_folder=long_pairs,
        params={"epochs": 3, "max_tokens": 128},
        holdout_share=0.1,
    )
    profile = profile_create(campaign=campaign, max_batch_size=4, sample_size=24)
    saved_before_each: list[int] = []
    real_measure_step = training_profile.measure_step

    def measure_step(*args, **kwargs):
        # the steps already measured are on the report before the next begins
        saved_before_each.append(len(Profile.objects.get(pk=profile.pk).steps))
        return real_measure_step(*args, **kwargs)

    with mock.patch.object(training_profile, "measure_step", measure_step):
        assert profile_run(profile.pk) == "done", profile.error
    profile.refresh_from_db()
    assert saved_before_each[:3] == [0, 1, 2]  # the sweep's three; then the leak check

    steps = profile.steps
    assert [s["batch_size"] for s in steps] == [1, 2, 4]
    weights = steps[0]["weights"]
    assert 80 * MiB < weights < 100 * MiB  # all-MiniLM-L6-v2 in float32: 22.7 M weights
    for step in steps:
        # every weight trains but the pooler head (mean pooling never uses it): one
        # gradient each, and AdamW keeps two states per weight with a gradient
        assert weights - 1 * MiB < step["gradients"] < weights
        assert step["optimizer"] == pytest.approx(2 * step["gradients"], rel=0.001)
        assert step["fits"] and step["peak_reserved"] <= step["limit"]
    # activations grow with the batch (the heaviest examples are measured first)
    assert steps[-1]["activations"] > steps[0]["activations"]
    assert profile.chosen_batch_size == 4
    assert profile.leak["leak"] is False, profile.leak

    # the estimate covers epochs × the corpus, and ends in a rental plan
    estimate = profile.estimate
    assert estimate.units == campaign.units.filter(holdout=False).count()
    assert estimate.hours_measured_device > 0
    assert "3 epoch(s)" in estimate.reasoning[0]
    assert estimate.duration_days in (3, 7, 30) and estimate.gpu_name

    # and the report page shows the parts, size by size
    client.force_login(owner)
    page = client.get(reverse("campaign_profile", args=["adapt"])).content.decode()
    assert 'id="training-memory"' in page
    assert page.count('<tr data-batch="') == len(steps)
    assert 'id="memory-chart"' in page
