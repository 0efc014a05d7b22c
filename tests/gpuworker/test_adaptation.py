"""An adaptation campaign end to end, in this process: train, checkpoint, use, verify."""

from __future__ import annotations

import json
import random
from unittest import mock

import pytest

from campaigns.adaptation import services as adaptation
from campaigns.models import Batch, ModelCheckpoint, Training, Unit, UnitState
from campaigns.runs import setup, start
from campaigns.verify.reconcile import campaign_verify
from gpuworker.processors import forget_loaded
from gpuworker.training_tasks import run_training

# user_model and shapes are fixtures: the tiny CNN trained once, and its images.
from tests.gpuworker.test_image_classification import (  # noqa: F401
    _params,
    classifier_params,
    shapes,
    tiny_architecture,
    user_model,
)


def write_pairs(root, n: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    things = ["kettle", "bicycle", "violin", "lantern", "compass", "glacier", "harbour", "orchard"]
    root.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        thing, number = rng.choice(things), rng.randint(2, 99)
        pair = {
            "anchor": f"how many {thing}s are in room {i}?",
            "positive": f"Room {i} holds {number} {thing}s.",
        }
        (root / f"pair-{i:03d}.json").write_text(json.dumps(pair))


@pytest.fixture
def pairs_folder(tmp_path):
    root = tmp_path / "pairs"
    write_pairs(root, 24)
    (root / "broken.json").write_text('{"anchor": "no positive here"}')
    (root / "latin1.json").write_bytes('{"anchor": "caf\xe9", "positive": "x"}'.encode("latin-1"))
    return root


@pytest.fixture
def train_here(django_capture_on_commit_callbacks):
    """Start the training as the page does, then run the task it sends in this process."""

    def train(campaign) -> Training:
        with (
            mock.patch.object(start.celery_app, "send_task") as send,
            django_capture_on_commit_callbacks(execute=True),
        ):
            training = adaptation.training_start(campaign=campaign)
        for call in send.call_args_list:
            run_training(*call.kwargs["args"])
        training.refresh_from_db()
        return training

    return train


def test_an_adaptation_campaign_trains_checkpoints_and_its_checkpoint_embeds_with_lineage(
    project, pairs_folder, output_root, corpus, run_here, train_here
):
    # given: pairs, two of them unusable, a quarter held out
    campaign, report = setup.campaign_create(
        name="adapt",
        processor="text-adaptation",
        project=project,
        input_folder=pairs_folder,
        params={"batch_size": 4, "checkpoint_every": 2, "keep_last": 1, "epochs": 1},
        holdout_share=0.25,
    )
    assert report.created == 26

    # when: it trains
    training = train_here(campaign)

    # then: bad examples failed with their reason, the rest trained to the end
    assert training.state == Training.State.DONE, training.error
    broken = Unit.objects.get(campaign=campaign, uid="broken.json")
    assert broken.state == UnitState.FAILED and "'positive' is missing" in broken.error_message
    latin = Unit.objects.get(campaign=campaign, uid="latin1.json")
    assert latin.state == UnitState.FAILED and "not valid UTF-8" in latin.error_message
    assert training.examples + training.heldout == 24 and training.heldout > 0
    assert training.step == training.total_steps > 0
    assert training.base_metrics["cosine_stability"] == pytest.approx(1.0, abs=1e-5)
    kept = training.checkpoints.filter(state=ModelCheckpoint.State.KEPT)
    # keep_last 1, plus the best by held-out loss (possibly the same one)
    assert 1 <= kept.count() <= 2
    assert training.checkpoints.filter(state=ModelCheckpoint.State.PRUNED).exists()
    last = training.checkpoints.order_by("-step").first()
    assert last.step == training.step and last.heldout_loss is not None
    assert last.linkage["data_sha256"] == training.data_sha256
    assert last.linkage["base_weights_sha256"] == training.base_weights_sha256
    assert last.linkage["params"]["batch_size"] == 4
    assert 0 < last.linkage["metrics"]["cosine_stability"] < 1.0  # it moved, not far

    # when: the last checkpoint becomes the model of an embedding campaign
    texts, _ = setup.campaign_create(
        name="texts",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"batch_size": 50},
        checkpoint_after=0,
    )
    version = adaptation.checkpoint_use(checkpoint=last, target=texts)
    assert version.params["model"].endswith(last.path)
    run_here(texts)

    # then: its outputs exist and their version names the checkpoint's lineage
    assert texts.units.filter(state=UnitState.SUCCEEDED, batch__version=version).exists()
    link = adaptation.lineage(version)
    assert link["campaign"] == "adapt" and link["step"] == last.step
    assert link["data_sha256"] == training.data_sha256
    assert link["base_weights_sha256"] == training.base_weights_sha256
    assert link["training_params"]["learning_rate"] == pytest.approx(2e-5)

    # and a damaged checkpoint is found by verify and never loaded
    weights = output_root / last.path / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    weights.write_bytes(bytes(blob))
    verify = campaign_verify(campaign=campaign)
    assert [d["step"] for d in verify.damaged_checkpoints] == [last.step]
    assert "sha256 differs" in verify.damaged_checkpoints[0]["problem"]
    last.refresh_from_db()
    assert last.state == ModelCheckpoint.State.DAMAGED
    with pytest.raises(Exception, match="damaged"):
        adaptation.checkpoint_use(checkpoint=last, target=texts)
    # a campaign whose model is that folder fails its batch, saying why (a
    # fresh worker: this process still holds the model it verified and loaded)
    forget_loaded()
    again, _ = setup.campaign_create(
        name="texts-again",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={
            "batch_size": 50,
            "batch_policy": "length_grouped",
            "model": str(output_root / last.path),
        },
        checkpoint_after=0,
    )
    run_here(again)
    failed = Batch.objects.get(campaign=again)
    assert failed.state == Batch.State.FAILED and "sha256 differs" in failed.error
    assert not again.units.filter(state=UnitState.SUCCEEDED).exists()


@pytest.mark.parametrize("given_as", ["model file", "state dict"])
def test_an_image_classifier_learns_from_labelled_folders_and_its_checkpoint_classifies(
    project,
    user_model,  # noqa: F811 (the imported fixture)
    shapes,  # noqa: F811
    output_root,
    run_here,
    train_here,
    tiny_architecture,  # noqa: F811
    tmp_path,
    given_as,
):
    import torch

    model = user_model
    extra = {}
    if given_as == "state dict":
        # The same network as a state dict of a registered architecture.
        weights = tmp_path / "tiny.pt"
        torch.save(dict(torch.jit.load(str(user_model[0])).state_dict()), str(weights))
        model, extra = (weights, user_model[1]), {"architecture": "tiny"}
    campaign, _ = setup.campaign_create(
        name="shapes-tuned",
        processor="image-adaptation",
        project=project,
        input_folder=shapes,
        # the classifier's own model, labels and preprocessing, and training parameters
        params=classifier_params(
            model, batch_size=8, checkpoint_every=2, learning_rate=0.01, **extra
        ),
        holdout_share=0.2,
    )
    training = train_here(campaign)

    assert training.state == Training.State.DONE, training.error
    # the images of bad/ are no category of the labels file: failed with the reason
    stray = Unit.objects.get(campaign=campaign, uid="bad/notes.jpg")
    assert (
        stray.state == UnitState.FAILED and "'bad' is not in the labels file" in stray.error_message
    )
    last = training.checkpoints.order_by("-step").first()
    assert last.heldout_accuracy is not None
    assert set(training.base_metrics) == {"heldout_loss", "heldout_accuracy"}
    # its evaluation and write timed, for the next training estimate of the campaign
    timings = last.linkage["timings"]
    assert timings["heldout"] == training.heldout and timings["heldout_eval_s"] > 0
    assert timings["write_s"] > 0

    # the checkpoint's weights over the same model file classify a new campaign
    target, _ = setup.campaign_create(
        name="shapes-run",
        processor="image-classification",
        project=project,
        input_folder=shapes,
        params=_params(user_model, batch_size=64),
        checkpoint_after=0,
    )
    version = adaptation.checkpoint_use(checkpoint=last, target=target)
    assert version.params["weights"].endswith(last.path)
    assert version.params["architecture"] == extra.get("architecture", "")
    run_here(target)
    assert target.units.filter(state=UnitState.SUCCEEDED).count() == 30
    assert adaptation.lineage(version)["step"] == last.step
