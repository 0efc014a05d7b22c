"""Processor implementations, loaded once per worker process and parameter version."""

from __future__ import annotations

import functools
import json

from .text_embedding import TextEmbeddingProcessor

IMPLEMENTATIONS = {"text-embedding": TextEmbeddingProcessor}


@functools.lru_cache(maxsize=4)
def _load(processor: str, params_json: str):
    return IMPLEMENTATIONS[processor](json.loads(params_json))


def get_processor(processor: str, params: dict):
    """The loaded processor for these parameters; the model loads on first use only."""
    return _load(processor, json.dumps(params, sort_keys=True))
