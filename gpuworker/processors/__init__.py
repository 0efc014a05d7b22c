"""Processor implementations, loaded once per worker process and parameter version.

Which class implements a processor is said by its spec (campaigns.specs.processors):
the built-ins live here, a user's own anywhere importable. What the runner calls
on one is the `Processor` protocol (gpuworker/processors/base.py).
"""

from __future__ import annotations

import functools
import gc
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeGuard

from django.utils.module_loading import import_string

from campaigns.specs import model_files
from campaigns.specs.processors import get_spec
from common.heap import settle_heap
from gpuworker.processors.base import (
    FlaggingProcessor,
    Processor,
    ProcessorClass,
    RowShardedProcessor,
    ShardedProcessor,
)

if TYPE_CHECKING:
    # Checked by mypy, never imported at run time (each built-in imports its
    # own libraries, loaded only by a worker whose version needs them): every
    # built-in class, made from a version's parameters, is a Processor; all
    # of them flag units for review, and the text embedding writes shards.
    from gpuworker.processors.audio_transform import AudioTransformProcessor
    from gpuworker.processors.image_classification import ImageClassificationProcessor
    from gpuworker.processors.image_transform import ImageTransformProcessor
    from gpuworker.processors.speech_to_text import SpeechToTextProcessor
    from gpuworker.processors.text_embedding import TextEmbeddingProcessor
    from gpuworker.processors.text_generation import TextGenerationProcessor

    _CHECK: tuple[ProcessorClass, ...] = (
        TextEmbeddingProcessor,
        ImageClassificationProcessor,
        ImageTransformProcessor,
        TextGenerationProcessor,
        AudioTransformProcessor,
        SpeechToTextProcessor,
    )
    _FLAGGING: tuple[Callable[[dict[str, Any]], FlaggingProcessor], ...] = (
        TextEmbeddingProcessor,
        ImageClassificationProcessor,
        ImageTransformProcessor,
        TextGenerationProcessor,
        AudioTransformProcessor,
        SpeechToTextProcessor,
    )
    _SHARDED: Callable[[dict[str, Any]], ShardedProcessor] = TextEmbeddingProcessor


@functools.lru_cache(maxsize=4)
def _load(processor: str, params_json: str, files_json: str) -> Processor:
    # Before the model loads, once a process (a refusal is not cached: the
    # next batch looks again); the loaded model then serves the version.
    model_files.check(json.loads(files_json))
    implementation: ProcessorClass = import_string(
        get_spec(processor).implementation.replace(":", ".")
    )
    return implementation(json.loads(params_json))


def get_processor(processor: str, params: dict, files: dict | None = None) -> Processor:
    """The loaded processor for these parameters; the model loads on first use only.

    `files`: the model files a version recorded (`software["files"]`,
    campaigns/specs/model_files.py): the model is not loaded if one is not what it
    was, so a version's outputs all come from the model it names.
    """
    misses = _load.cache_info().misses
    loaded = _load(
        processor, json.dumps(params, sort_keys=True), json.dumps(files or {}, sort_keys=True)
    )
    if _load.cache_info().misses != misses:
        # A model and its libraries loaded: kept out of the collections
        # (common/heap.py). After the cache let its oldest go, not inside
        # _load while it still holds it.
        settle_heap()
    return loaded


def sharded(processor: Processor) -> TypeGuard[ShardedProcessor]:
    """Whether the processor's outputs are rows of a shard a batch
    (campaigns/storage/vector_shards.py: `shard_outputs`, `output` gives a vector,
    `check_rows` checks a shard's) rather than a file a unit."""
    return bool(getattr(processor, "shard_outputs", False))


def row_sharded(processor: Processor) -> TypeGuard[RowShardedProcessor]:
    """Whether the processor's outputs are lines of a JSON Lines shard a batch
    (campaigns/storage/row_shards.py: `row_outputs`, `row_record` gives a
    line's fields, `check_record` checks one read back)."""
    return bool(getattr(processor, "row_outputs", False))


def shard_written(processor: Processor) -> bool:
    """Whether a batch's outputs go into one shard (vectors or JSON rows)
    rather than a file a unit beside the claim's lease record."""
    return sharded(processor) or row_sharded(processor)


def review_flags(processor: Processor) -> Callable[[Any, int], list[tuple[str, str]]] | None:
    """The processor's `flags` (FlaggingProcessor), or None when it flags nothing."""
    return getattr(processor, "flags", None)


def forget_loaded() -> None:
    """Drop every loaded processor and model, as a fresh worker process starts."""
    from gpuworker.processors.image_classification import load_classifier
    from gpuworker.processors.speech_to_text import load_speech
    from gpuworker.processors.text_embedding import load_encoder
    from gpuworker.processors.text_generation import load_generator

    _load.cache_clear()
    load_encoder.cache_clear()
    load_classifier.cache_clear()
    load_generator.cache_clear()
    load_speech.cache_clear()
    # Frozen, a model in a cycle would outlive the caches.
    gc.unfreeze()
    gc.collect()
