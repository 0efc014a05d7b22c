"""The processor against sentence-transformers, the reference implementation."""

from __future__ import annotations

import numpy as np
import pytest

from campaigns.processor_specs import TEXT_EMBEDDING
from gpuworker.processors import get_processor
from gpuworker.processors.text_embedding import resolve_model_path

TEXTS = [
    "The harbour reopened on Monday after three weeks of repairs.",
    "Hello",
    "Le port a rouvert lundi après trois semaines de travaux.",
    "def fib(n):\n    a, b = 0, 1\n    return a",
    "港は月曜日に再開した。",
    " ".join(["A very long document that goes well past the truncation limit."] * 80),
]


@pytest.fixture(scope="module")
def processor():
    return get_processor("text-embedding", TEXT_EMBEDDING.clean({}))


@pytest.fixture(scope="module")
def reference():
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(
        str(resolve_model_path(TEXT_EMBEDDING.params["model"].default)),
        device="cpu",
        local_files_only=True,
    )
    assert model.max_seq_length == 256
    return model


def test_vectors_equal_sentence_transformers_encode(processor, reference):
    ours = processor.embed(TEXTS).vectors
    theirs = reference.encode(TEXTS, batch_size=4, normalize_embeddings=True)
    cosine = (ours * theirs).sum(axis=1) / (
        np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
    )
    assert ours.shape == (len(TEXTS), 384)
    assert cosine.min() >= 0.9999, cosine


def test_batch_composition_does_not_change_a_vector(processor):
    alone = processor.embed([TEXTS[1]]).vectors[0]
    padded = processor.embed(TEXTS).vectors[1]
    assert float(alone @ padded) >= 0.9999


def test_long_inputs_are_truncated_at_256_tokens_and_say_so(processor):
    result = processor.embed(TEXTS)
    long_index = len(TEXTS) - 1
    assert result.input_tokens[long_index] > 256
    assert processor.unit_metrics(result, long_index)["truncated"] is True
    assert processor.unit_metrics(result, 1)["truncated"] is False
    # Padding to the longest (truncated) text: 256 columns for every row.
    assert result.padded_tokens == 256 * len(TEXTS)
    assert result.real_tokens < result.padded_tokens


def test_memory_is_reported_for_the_device(processor):
    memory = processor.embed(TEXTS[:2]).memory
    assert memory["device"] == "cpu" or memory["peak_reserved"] >= memory["peak_allocated"]
    if memory["device"] == "cpu":
        assert memory["peak_rss"] >= memory["rss"] > 0


def test_the_processor_loads_once_per_process_and_version(processor):
    assert get_processor("text-embedding", TEXT_EMBEDDING.clean({})) is processor
