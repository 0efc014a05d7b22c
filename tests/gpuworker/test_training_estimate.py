"""A training's estimate counts its checkpoint writes and held-out evaluations,
timed by an earlier training of the campaign when there is one, else assumed
from the model's size and the held-out set's, and says which."""

from __future__ import annotations

import json

import pytest

from campaigns.models import ModelCheckpoint, Profile, Training, Unit, UnitState
from campaigns.runs import setup
from gpuworker import training_profile

MiB = 1024 * 1024
WEIGHTS = 90 * MiB
STEP_S = 0.8  # a micro-batch of 4 at the chosen size
# The disk rate assumed when no training timed a checkpoint (campaigns/adaptation/estimate.py).
ASSUMED_WRITE_BYTES_PER_S = 100 * 1000 * 1000


@pytest.fixture
def adapt(project, tmp_path, catalog):
    root = tmp_path / "pairs"
    root.mkdir()
    for i in range(40):
        pair = {"anchor": f"question {i}", "positive": f"answer {i}"}
        (root / f"p{i:02d}.json").write_text(json.dumps(pair))
    campaign, _ = setup.campaign_create(
        name="adapt",
        processor="text-adaptation",
        project=project,
        input_folder=root,
        params={"epochs": 2, "batch_size": 4, "checkpoint_every": 3},
        holdout_share=0.2,
    )
    return campaign


def _profiled(campaign) -> Profile:
    """A training profile as the worker leaves it: batch 4 chosen."""
    step = {
        "phase": "train",
        "batch_size": 4,
        "weights": WEIGHTS,
        "gradients": WEIGHTS,
        "optimizer": 2 * WEIGHTS,
        "activations": 50 * MiB,
        "peak_allocated": 500 * MiB,
        "peak_reserved": 520 * MiB,
        "step_s": STEP_S,
        "items_per_s": 5.0,
        "oom": False,
        "fits": True,
    }
    return Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        state=Profile.State.DONE,
        margin=0.2,
        memory_budget=8192 * MiB,
        max_batch_size=4,
        device="CPU (2 threads)",
        runtime={"torch": "2.13.0+cpu"},
        steps=[step],
        chosen_batch_size=4,
        chosen_peak_reserved=520 * MiB,
    )


def _split(campaign) -> tuple[int, int]:
    units = Unit.objects.filter(campaign=campaign).exclude(state=UnitState.FAILED)
    return units.filter(holdout=False).count(), units.filter(holdout=True).count()


def test_the_estimate_adds_assumed_checkpoint_writes_and_evaluations_and_says_so(adapt):
    examples, heldout = _split(adapt)
    steps = 2 * -(-examples // 4)  # two epochs of micro-batches of 4
    checkpoints = -(-steps // 3)  # every 3 steps and the last

    estimate = training_profile.estimate_build(_profiled(adapt))

    # then: the steps, plus each checkpoint's write (weights and optimizer states at the
    # assumed disk rate) and each evaluation (each checkpoint's and the base model's)
    write_s = 3 * WEIGHTS / ASSUMED_WRITE_BYTES_PER_S
    eval_s = heldout * STEP_S / 4 / 3
    expected = steps * STEP_S + checkpoints * write_s + (checkpoints + 1) * eval_s
    assert estimate.hours_measured_device * 3600 == pytest.approx(expected, rel=1e-6)
    reasons = " ".join(estimate.reasoning)
    assert "checkpoint writes and held-out evaluations included" in estimate.reasoning[0]
    assert "no training of this campaign has timed a checkpoint yet" in reasons
    assert f"written, synced and checksummed at {ASSUMED_WRITE_BYTES_PER_S // 10**6} MB/s" in (
        reasons
    )
    assert f"{checkpoints} checkpoint write(s)" in reasons
    assert f"{checkpoints + 1} held-out evaluation(s) of {heldout} examples" in reasons


def test_the_estimate_takes_the_campaign_s_own_timings_when_a_training_recorded_them(adapt):
    # given: an earlier training of the campaign timed its checkpoints
    examples, heldout = _split(adapt)
    training = Training.objects.create(campaign=adapt, version=adapt.current_version)
    ModelCheckpoint.objects.create(
        training=training,
        step=3,
        path="adapt/checkpoints/v1/step-00000003",
        weights_sha256="0" * 64,
        train_loss=1.0,
        linkage={"timings": {"heldout_eval_s": 2.0, "heldout": 4, "write_s": 7.5}},
    )
    steps = 2 * -(-examples // 4)
    checkpoints = -(-steps // 3)

    estimate = training_profile.estimate_build(_profiled(adapt))

    expected = steps * STEP_S + checkpoints * 7.5 + (checkpoints + 1) * heldout * 0.5
    assert estimate.hours_measured_device * 3600 == pytest.approx(expected, rel=1e-6)
    reasons = " ".join(estimate.reasoning)
    assert f"a checkpoint write as timed by training {training.pk} of this campaign" in reasons
    assert f"evaluation as timed by training {training.pk} (500.0 ms)" in reasons
    assert "no training of this campaign has timed" not in reasons
