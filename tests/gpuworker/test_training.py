"""Fine-tuning on CPU in seconds: checkpoints that resume exactly and are never half-loaded."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch

from campaigns.specs.builtin import DEFAULT_TEXT_MODEL, resolve_model_path
from campaigns.storage import checkpoint_files as checkpoints
from gpuworker.training import ClassifierTrainer, ContrastiveTrainer, Pair, TrainParams
from tests.gpuworker.test_image_classification import CLASSES, TinyCNN, _tensor, shape_image

BASE = resolve_model_path(DEFAULT_TEXT_MODEL)
LINKAGE = {"base_model": "all-MiniLM-L6-v2", "data_sha256": "d" * 64, "version": 1}


def pairs(n: int, seed: int = 0) -> list[Pair]:
    """Questions and the sentence that answers them: easy to learn, not identical."""
    rng = random.Random(seed)
    things = ["kettle", "bicycle", "violin", "lantern", "compass", "glacier", "harbour", "orchard"]
    out = []
    for i in range(n):
        thing, number = rng.choice(things), rng.randint(2, 99)
        out.append(
            Pair(f"how many {thing}s are in room {i}?", f"Room {i} holds {number} {thing}s.")
        )
    return out


def params(**extra) -> TrainParams:
    return TrainParams(
        **{"batch_size": 4, "epochs": 1, "checkpoint_every": 1, "keep_last": 10, **extra}
    )


def test_an_interrupted_run_resumes_from_its_last_checkpoint_with_the_same_steps_and_loss(
    tmp_path,
):
    data, heldout = pairs(16), pairs(6, seed=1)
    whole = ContrastiveTrainer(params(), BASE).run(
        data, heldout, root=tmp_path / "whole", linkage=LINKAGE
    )
    assert whole.steps == whole.total_steps == 4

    first = ContrastiveTrainer(params(), BASE).run(
        data, heldout, root=tmp_path / "cut", linkage=LINKAGE, stop=lambda step: step == 2
    )
    assert first.stopped and first.steps == 2
    resumed = ContrastiveTrainer(params(), BASE).run(
        data, heldout, root=tmp_path / "cut", linkage=LINKAGE
    )
    assert resumed.resumed_from == 2 and resumed.steps == 4
    assert resumed.losses == pytest.approx(whole.losses[2:], rel=1e-5)
    assert resumed.checkpoints[-1].heldout == pytest.approx(whole.checkpoints[-1].heldout, rel=1e-5)

    # each checkpoint names what it came from, with its metrics and checksums
    sidecar = checkpoints.verified(tmp_path / "cut" / "step-00000004")
    assert sidecar["base_model"] == "all-MiniLM-L6-v2" and sidecar["data_sha256"] == "d" * 64
    assert sidecar["step"] == 4 and sidecar["total_steps"] == 4
    assert {"train_loss", "heldout_loss", "heldout_accuracy"} <= set(sidecar["metrics"])
    assert "model.safetensors" in sidecar["files"] and len(sidecar["weights_sha256"]) == 64


def test_training_moves_the_encoder_towards_the_pairs(tmp_path):
    data, heldout = pairs(32), pairs(8, seed=1)
    trainer = ContrastiveTrainer(params(batch_size=8, epochs=2, learning_rate=1e-4), BASE)
    before = trainer.evaluate(heldout)
    outcome = trainer.run(data, heldout, root=tmp_path / "ckpt", linkage=LINKAGE)
    assert outcome.checkpoints[-1].heldout["heldout_loss"] < before["heldout_loss"]


def test_a_partial_or_damaged_checkpoint_is_never_loaded(tmp_path):
    root = tmp_path / "ckpt"
    ContrastiveTrainer(params(), BASE).run(
        pairs(8), [], root=root, linkage=LINKAGE, stop=lambda step: step == 2
    )
    # a later checkpoint whose weights were damaged, and one the writer never finished
    damaged = root / "step-00000003"
    (root / "step-00000002").rename(damaged)
    checkpoints.write(root, 2, lambda f: (f / "model.safetensors").write_bytes(b"x"), LINKAGE)
    weights = damaged / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[-100] ^= 0xFF
    weights.write_bytes(bytes(blob))
    (root / "step-00000004.partial").mkdir()

    assert any("sha256 differs" in p for p in checkpoints.problems(damaged))
    assert "partial" in checkpoints.problems(root / "step-00000004.partial")[0]
    with pytest.raises(checkpoints.CheckpointError):
        checkpoints.verified(damaged)
    folder, sidecar = checkpoints.latest_whole(root)
    assert folder.name == "step-00000002"
    assert json.loads((folder / "checkpoint.json").read_text())["step"] == 2


def test_the_classifier_head_learns_new_labels_and_the_body_stays_frozen(tmp_path):
    torch.manual_seed(0)
    rng = random.Random(3)
    model = TinyCNN()
    body_before = {k: v.clone() for k, v in model.body.state_dict().items()}
    train = [(shape_image(CLASSES[i % 3], rng), i % 3) for i in range(48)]
    heldout = [(shape_image(CLASSES[i % 3], rng), i % 3) for i in range(12)]
    trainer = ClassifierTrainer(
        params(batch_size=8, epochs=3, learning_rate=0.02, checkpoint_every=6),
        model,
        lambda image: torch.from_numpy(_tensor(image)),
        train="head",
    )
    before = trainer.evaluate(heldout)
    outcome = trainer.run(train, heldout, root=tmp_path / "ckpt", linkage=LINKAGE)
    after = outcome.checkpoints[-1].heldout
    assert after["heldout_loss"] < before["heldout_loss"]
    for key, value in model.body.state_dict().items():
        # .cpu(): on a CUDA worker the trainer moved the model to the device.
        assert torch.equal(value.cpu(), body_before[key]), key
    saved = checkpoints.verified(outcome.checkpoints[-1].folder)
    assert saved["step"] == outcome.total_steps == 18
    assert np.isfinite(after["heldout_accuracy"])


def test_each_checkpoint_times_its_held_out_evaluation_and_its_write(tmp_path):
    torch.manual_seed(0)
    rng = random.Random(5)
    train = [(shape_image(CLASSES[i % 3], rng), i % 3) for i in range(16)]
    heldout = [(shape_image(CLASSES[i % 3], rng), i % 3) for i in range(6)]
    trainer = ClassifierTrainer(
        params(batch_size=8, checkpoint_every=1),
        TinyCNN(),
        lambda image: torch.from_numpy(_tensor(image)),
        train="head",
    )
    outcome = trainer.run(train, heldout, root=tmp_path / "ckpt", linkage=LINKAGE)
    assert len(outcome.checkpoints) == 2
    for progress in outcome.checkpoints:
        # what the next training estimate of the campaign measures from
        assert 0 < progress.eval_s < progress.seconds
        assert progress.write_s > 0


def test_training_the_whole_classifier_moves_its_body_too(tmp_path):
    torch.manual_seed(0)
    rng = random.Random(4)
    model = TinyCNN()
    body_before = {k: v.clone() for k, v in model.body.state_dict().items()}
    train = [(shape_image(CLASSES[i % 3], rng), i % 3) for i in range(16)]
    trainer = ClassifierTrainer(
        params(batch_size=8, learning_rate=0.01, checkpoint_every=2),
        model,
        lambda image: torch.from_numpy(_tensor(image)),
        train="all",
    )
    trainer.run(train, [], root=tmp_path / "ckpt", linkage=LINKAGE)
    moved = [
        k for k, v in model.body.state_dict().items() if not torch.equal(v.cpu(), body_before[k])
    ]
    assert moved, "every layer trains with train: all"
