"""A training on a real worker, killed mid-run: the next worker resumes from the last
whole checkpoint and ends where an uninterrupted run ends, step for step."""

from __future__ import annotations

import pytest

from campaigns.adaptation import services as adaptation
from campaigns.models import ModelCheckpoint, Training
from campaigns.runs import setup
from gpuworker.training_tasks import run_training
from tests.gpuworker.test_adaptation import write_pairs
from tests.worker import wait_until

pytestmark = pytest.mark.integration

PARAMS = {"batch_size": 4, "epochs": 1, "checkpoint_every": 2, "keep_last": 10}


def test_a_killed_training_resumes_from_its_last_checkpoint_with_the_same_steps_and_loss(
    start_worker, project, tmp_path, output_root, settings
):
    settings.TRAINING_HEARTBEAT_SECONDS = 0.5
    beat = {"TRAINING_HEARTBEAT_SECONDS": "0.5"}
    pairs = tmp_path / "pairs"
    write_pairs(pairs, 28)
    campaign, _ = setup.campaign_create(
        name="adapt",
        processor="text-adaptation",
        project=project,
        input_folder=pairs,
        params=PARAMS,
        holdout_share=0.2,
    )

    # when: a worker trains it and is SIGKILLed after its first checkpoint
    worker = start_worker(env_extra=beat)
    training = adaptation.training_start(campaign=campaign)
    wait_until(lambda: training.checkpoints.exists(), timeout=240, worker=worker)
    worker.kill()
    training.refresh_from_db()
    assert training.state == Training.State.RUNNING  # as the dead worker left it
    killed_at = training.checkpoints.order_by("-step").first().step
    assert killed_at < training.total_steps

    # then: a new worker (with the sweeper) notices the silence and finishes it
    survivor = start_worker(beat=True, env_extra=beat)
    wait_until(
        lambda: Training.objects.get(pk=training.pk).state == Training.State.DONE,
        timeout=300,
        worker=survivor,
    )
    training.refresh_from_db()
    assert training.runs == 2 and training.step == training.total_steps
    steps = list(training.checkpoints.values_list("step", flat=True))
    assert steps == list(range(2, training.total_steps + 1, 2))
    assert "resum" not in training.error

    # and it ends where the same training never interrupted ends (run here, with
    # no worker left whose sweeper could take it over)
    survivor.stop()
    reference, _ = setup.campaign_create(
        name="adapt-ref",
        processor="text-adaptation",
        project=project,
        input_folder=pairs,
        params=PARAMS,
        holdout_share=0.2,
    )
    uninterrupted = Training.objects.create(campaign=reference, version=reference.current_version)
    assert run_training(uninterrupted.pk) == Training.State.DONE
    uninterrupted.refresh_from_db()
    theirs = {c.step: c for c in uninterrupted.checkpoints.all()}
    for checkpoint in training.checkpoints.filter(step__gt=killed_at):
        twin: ModelCheckpoint = theirs[checkpoint.step]
        assert checkpoint.train_loss == pytest.approx(twin.train_loss, rel=1e-4)
        assert checkpoint.heldout_loss == pytest.approx(twin.heldout_loss, rel=1e-4)
    assert training.data_sha256 == uninterrupted.data_sha256
