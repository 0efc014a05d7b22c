"""Processor implementations, loaded once per worker process and parameter version.

Which class implements a processor is said by its spec (campaigns.processor_specs):
the built-ins live here, a user's own anywhere importable.
"""

from __future__ import annotations

import functools
import json

from django.utils.module_loading import import_string

from campaigns.processor_specs import get_spec


@functools.lru_cache(maxsize=4)
def _load(processor: str, params_json: str):
    implementation = get_spec(processor).implementation.replace(":", ".")
    return import_string(implementation)(json.loads(params_json))


def get_processor(processor: str, params: dict):
    """The loaded processor for these parameters; the model loads on first use only."""
    return _load(processor, json.dumps(params, sort_keys=True))


def sharded(processor) -> bool:
    """Whether the processor's outputs are rows of a shard a batch
    (campaigns/vector_shards.py: `shard_outputs`, `output` gives a vector,
    `check_rows` checks a shard's) rather than a file a unit."""
    return bool(getattr(processor, "shard_outputs", False))


def forget_loaded() -> None:
    """Drop every loaded processor and model, as a fresh worker process starts."""
    from .image_classification import load_classifier
    from .text_embedding import load_encoder

    _load.cache_clear()
    load_encoder.cache_clear()
    load_classifier.cache_clear()
