"""Processor implementations, loaded once per worker process and parameter version.

Which class implements a processor is said by its spec (campaigns.specs.processors):
the built-ins live here, a user's own anywhere importable.
"""

from __future__ import annotations

import functools
import json

from django.utils.module_loading import import_string

from campaigns.specs import model_files
from campaigns.specs.processors import get_spec


@functools.lru_cache(maxsize=4)
def _load(processor: str, params_json: str, files_json: str):
    # Before the model loads, once a process (a refusal is not cached: the
    # next batch looks again); the loaded model then serves the version.
    model_files.check(json.loads(files_json))
    implementation = get_spec(processor).implementation.replace(":", ".")
    return import_string(implementation)(json.loads(params_json))


def get_processor(processor: str, params: dict, files: dict | None = None):
    """The loaded processor for these parameters; the model loads on first use only.

    `files`: the model files a version recorded (`software["files"]`,
    campaigns/specs/model_files.py): the model is not loaded if one is not what it
    was, so a version's outputs all come from the model it names.
    """
    return _load(
        processor, json.dumps(params, sort_keys=True), json.dumps(files or {}, sort_keys=True)
    )


def sharded(processor) -> bool:
    """Whether the processor's outputs are rows of a shard a batch
    (campaigns/storage/vector_shards.py: `shard_outputs`, `output` gives a vector,
    `check_rows` checks a shard's) rather than a file a unit."""
    return bool(getattr(processor, "shard_outputs", False))


def forget_loaded() -> None:
    """Drop every loaded processor and model, as a fresh worker process starts."""
    from gpuworker.processors.image_classification import load_classifier
    from gpuworker.processors.text_embedding import load_encoder

    _load.cache_clear()
    load_encoder.cache_clear()
    load_classifier.cache_clear()
