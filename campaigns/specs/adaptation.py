"""The two adaptation processors: what they accept, known without importing torch.

An adaptation campaign's units are training examples, not items to process:
its run is one training (gpuworker/training_tasks.py) that writes checkpoints,
and its held-out units (the campaign's holdout share) are the evaluation set.
"""

from __future__ import annotations

import json

from campaigns.intake.inputs import InputError, decode_text
from campaigns.models import ErrorClass
from campaigns.specs.builtin import DEFAULT_TEXT_MODEL, IMAGE_CLASSIFICATION, decode_image
from campaigns.specs.limits import IMAGE_MAX_INPUT_BYTES, TEXT_EXAMPLE_MAX_INPUT_BYTES
from campaigns.specs.processors import ParamSpec, ProcessorSpec

TRAINING_PARAMS = {
    "epochs": ParamSpec(1, type=int, minimum=1, maximum=1000, help="passes over the examples"),
    "batch_size": ParamSpec(16, type=int, minimum=1, maximum=4096, help="examples per micro-batch"),
    "accumulate": ParamSpec(
        1, type=int, minimum=1, maximum=1024, help="micro-batches per optimizer step"
    ),
    "learning_rate": ParamSpec(2e-5, type=float, minimum=0, maximum=1),
    "weight_decay": ParamSpec(0.01, type=float, minimum=0, maximum=1),
    "warmup_steps": ParamSpec(0, type=int, minimum=0, help="linear warm-up of the learning rate"),
    "seed": ParamSpec(0, type=int, minimum=0, help="example order and dropout; recorded"),
    "precision": ParamSpec(
        "float32",
        choices=("float32", "float16", "bfloat16"),
        help="mixed precision (float16, bfloat16) needs a CUDA worker",
    ),
    "checkpoint_every": ParamSpec(50, type=int, minimum=1, help="optimizer steps"),
    "keep_last": ParamSpec(
        2, type=int, minimum=1, maximum=100, help="checkpoints kept, plus the best held-out one"
    ),
}


def parse_pair(data: bytes) -> dict:
    """A training example: a JSON object with anchor, positive and an optional negative."""
    text = decode_text(data)
    try:
        record = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputError(
            ErrorClass.INPUT_INVALID, f"not JSON: {exc.msg} (line {exc.lineno})"
        ) from None
    if not isinstance(record, dict):
        raise InputError(ErrorClass.INPUT_INVALID, "a pair is a JSON object")
    for key in ("anchor", "positive"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise InputError(ErrorClass.INPUT_INVALID, f"{key!r} is missing or empty")
    negative = record.get("negative")
    if negative is not None and (not isinstance(negative, str) or not negative.strip()):
        raise InputError(ErrorClass.INPUT_INVALID, "'negative' is given but not a text")
    return {"anchor": record["anchor"], "positive": record["positive"], "negative": negative}


TEXT_ADAPTATION = ProcessorSpec(
    name="text-adaptation",
    title="Fine-tune a sentence encoder",
    help="Contrastive fine-tuning on pairs or triplets (one JSON file per example: "
    "anchor, positive, optional negative), with in-batch negatives.",
    output_suffix="",
    training=True,
    implementation="gpuworker.training_tasks:text_trainer",
    params={
        "base_model": ParamSpec(
            DEFAULT_TEXT_MODEL,
            help="the encoder to fine-tune: a local Hugging Face folder, or the packaged MiniLM",
        ),
        "max_tokens": ParamSpec(128, type=int, minimum=8, maximum=8192),
        "scale": ParamSpec(
            20.0, type=float, minimum=1, maximum=100, help="similarity scale of the loss"
        ),
        **TRAINING_PARAMS,
        "max_input_bytes": TEXT_EXAMPLE_MAX_INPUT_BYTES,
    },
    check_input=lambda data, _params: parse_pair(data),
)


def _check_image(data: bytes, _params: dict):
    # The classifier's own limits apply when its new version runs; here only
    # "is it a picture at all".
    return decode_image(data, max_pixels=100_000_000, max_aspect=1000)


IMAGE_ADAPTATION = ProcessorSpec(
    name="image-adaptation",
    title="Fine-tune an image classifier",
    help="Labelled images (the category column, or the folder name) fine-tune your "
    "classifier (a model file, or an architecture's state dict): its last layer, or the "
    "whole network.",
    output_suffix="",
    training=True,
    implementation="gpuworker.training_tasks:image_trainer",
    params={
        **{
            k: IMAGE_CLASSIFICATION.params[k]
            for k in ("model", "architecture", "labels", "resize", "crop", "mean", "std")
        },
        "train": ParamSpec("head", choices=("head", "all"), help="the last layer, or everything"),
        **TRAINING_PARAMS,
        "learning_rate": ParamSpec(1e-3, type=float, minimum=0, maximum=1),
        "batch_size": ParamSpec(32, type=int, minimum=1, maximum=4096),
        "max_input_bytes": IMAGE_MAX_INPUT_BYTES,
    },
    check_input=_check_image,
    cost_unit="pixels",
    # The classifier's parameters, checked as the classifier's own are.
    validate=IMAGE_CLASSIFICATION.validate,
)

ADAPTATION = (TEXT_ADAPTATION, IMAGE_ADAPTATION)
