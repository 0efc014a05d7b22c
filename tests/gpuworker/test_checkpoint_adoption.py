"""A training resumes only from a checkpoint no record contradicts: one whose
sidecar changed since it was recorded is found by verify and never loaded, and
one left by another training is never taken for this one's."""

from __future__ import annotations

import json
from pathlib import Path
from unittest import mock

import pytest
from safetensors.numpy import load_file

from campaigns.adaptation import services as adaptation
from campaigns.models import Campaign, ModelCheckpoint, Training
from campaigns.runs import setup, start
from campaigns.verify.reconcile import campaign_verify
from gpuworker.training import ContrastiveTrainer
from gpuworker.training_tasks import run_training
from tests.gpuworker.test_adaptation import write_pairs

pytestmark = pytest.mark.django_db

PARAMS = {"batch_size": 4, "checkpoint_every": 1, "keep_last": 10, "epochs": 1}


def _campaign(name: str, project, folder: Path) -> Campaign:
    campaign, _ = setup.campaign_create(
        name=name, processor="text-adaptation", project=project, input_folder=folder, params=PARAMS
    )
    return campaign


@pytest.fixture
def train(django_capture_on_commit_callbacks):
    """Start (or resume) the campaign's training and run it here; with `stop_at`,
    the worker is asked to stop once that step is done. Returns the training and
    the checkpoint folders it loaded."""
    train_step = ContrastiveTrainer.train_step
    load = ContrastiveTrainer.load

    def call(campaign: Campaign, stop_at: int | None = None) -> tuple[Training, list[str]]:
        loaded: list[str] = []

        def stepping(self, examples, step):
            loss = train_step(self, examples, step)
            if stop_at is not None and step + 1 == stop_at:
                Training.objects.filter(campaign=campaign).update(state=Training.State.STOPPING)
            return loss

        def loading(self, folder):
            loaded.append(folder.name)
            return load(self, folder)

        with (
            mock.patch.object(start.celery_app, "send_task") as send,
            django_capture_on_commit_callbacks(execute=True),
        ):
            training = adaptation.training_start(campaign=campaign)
        with (
            mock.patch.object(ContrastiveTrainer, "train_step", stepping),
            mock.patch.object(ContrastiveTrainer, "load", loading),
        ):
            for sent in send.call_args_list:
                run_training(*sent.kwargs["args"])
        training.refresh_from_db()
        return training, loaded

    return call


def _weights(output_root: Path, checkpoint: ModelCheckpoint) -> dict:
    return load_file(output_root / checkpoint.path / "model.safetensors")


def _same_weights(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]).max() < 1e-6 for k in a)


def test_a_checkpoint_whose_sidecar_changed_is_found_by_verify_and_never_resumed_from(
    project, tmp_path, output_root, train
):
    pairs = tmp_path / "pairs"
    write_pairs(pairs, 20)
    clean, _ = train(_campaign("clean", project, pairs))
    assert clean.state == Training.State.DONE, clean.error
    campaign = _campaign("changed", project, pairs)
    stopped, _ = train(campaign, stop_at=3)
    assert (stopped.state, stopped.step) == (Training.State.STOPPED, 3)
    # given: one bit of the last checkpoint's sidecar changed — its step, 3, now reads 2
    last = stopped.checkpoints.get(step=3)
    sidecar = output_root / last.path / "checkpoint.json"
    text = sidecar.read_bytes()
    assert b'"step": 3' in text
    sidecar.write_bytes(text.replace(b'"step": 3', b'"step": 2'))

    # when: verify, then resume
    report = campaign_verify(campaign=campaign, deep=True)

    # then: verify finds it damaged, and the training resumes from the step before
    assert [d["step"] for d in report.damaged_checkpoints] == [3]
    last.refresh_from_db()
    assert last.state == ModelCheckpoint.State.DAMAGED
    resumed, loaded = train(campaign)
    assert resumed.state == Training.State.DONE, resumed.error
    assert loaded == ["step-00000002"]
    # step 3 made again, recorded whole, and every step as a clean run's
    last.refresh_from_db()
    assert last.state == ModelCheckpoint.State.KEPT and last.problem == ""
    assert json.loads(sidecar.read_text())["step"] == 3
    for step in (3, resumed.step):
        mine = _weights(output_root, resumed.checkpoints.get(step=step))
        theirs = _weights(output_root, clean.checkpoints.get(step=step))
        assert _same_weights(mine, theirs), step
    assert not campaign_verify(campaign=campaign, deep=True).damaged_checkpoints


def test_a_checkpoint_digit_only_the_record_knows_makes_it_damaged(
    project, tmp_path, output_root, train
):
    pairs = tmp_path / "pairs"
    write_pairs(pairs, 12)
    stopped, _ = train(_campaign("digit", project, pairs), stop_at=2)
    last = stopped.checkpoints.get(step=2)
    sidecar = output_root / last.path / "checkpoint.json"
    data = json.loads(sidecar.read_text())
    # one hex digit of the data checksum, the sidecar still a whole and valid file
    digit = data["data_sha256"][0]
    data["data_sha256"] = ("1" if digit == "0" else "0") + data["data_sha256"][1:]
    sidecar.write_text(json.dumps(data, indent=1, sort_keys=True))

    report = campaign_verify(campaign=stopped.campaign)

    assert [d["step"] for d in report.damaged_checkpoints] == [2]
    assert (
        "checkpoint.json: sha256 differs from the one recorded"
        in (report.damaged_checkpoints[0]["problem"])
    )
    _resumed, loaded = train(stopped.campaign)
    assert loaded == ["step-00000001"]


def test_an_unrecorded_checkpoint_is_resumed_from_only_by_the_training_that_wrote_it(
    project, tmp_path, output_root, train
):
    pairs = tmp_path / "pairs"
    write_pairs(pairs, 20)
    campaign = _campaign("adapt", project, pairs)
    stopped, _ = train(campaign, stop_at=2)
    # given: its worker died after writing step 2, before recording it
    stopped.checkpoints.filter(step=2).delete()

    # then: the training that wrote it resumes from it
    resumed, loaded = train(campaign, stop_at=3)
    assert loaded == ["step-00000002"] and resumed.step == 3

    # given: the campaign deleted and made again under its name, on other pairs:
    # the old checkpoints are still in the folder of its version 1
    root = adaptation.checkpoint_root(resumed)
    campaign.delete()
    other = tmp_path / "other-pairs"
    write_pairs(other, 20, seed=7)
    again = _campaign("adapt", project, other)
    assert adaptation.checkpoint_root(Training(campaign=again, version=again.current_version)) == (
        root
    )
    assert (root / "step-00000003").is_dir()

    # then: its training starts from its base model, not from another's checkpoint
    fresh, loaded = train(again)
    assert fresh.state == Training.State.DONE, fresh.error
    assert loaded == []
    assert fresh.checkpoints.get(step=3).linkage["data_sha256"] == fresh.data_sha256
