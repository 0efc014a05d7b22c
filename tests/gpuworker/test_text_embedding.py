"""The processor against sentence-transformers, the reference implementation."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from campaigns.specs.builtin import TEXT_EMBEDDING
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
    # Counted before truncation, each text as the tokenizer sees it alone.
    whole = processor.tokenizer(TEXTS, truncation=False, verbose=False)["input_ids"]
    assert result.input_tokens == [len(ids) for ids in whole]
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


@pytest.mark.parametrize("pooling", ["cls", "max"])
def test_other_poolings_give_other_unit_vectors(processor, pooling):
    other = get_processor("text-embedding", TEXT_EMBEDDING.clean({"pooling": pooling}))
    mean_vectors = processor.embed(TEXTS[:3]).vectors
    vectors = other.embed(TEXTS[:3]).vectors
    assert vectors.shape == (3, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert not np.allclose(vectors, mean_vectors, atol=1e-3)


def test_without_normalisation_vectors_keep_their_norm_and_still_pass_the_check(tmp_path):
    raw = get_processor("text-embedding", TEXT_EMBEDDING.clean({"normalization": "none"}))
    vectors = raw.embed(TEXTS[:3]).vectors
    assert not np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-2)
    path = tmp_path / "v.npy"
    path.write_bytes(raw.serialize(vectors[0]))
    raw.validate(path)


def test_refuse_truncation_fails_over_long_texts_as_input_invalid():
    from campaigns.intake.inputs import InputError

    strict = get_processor("text-embedding", TEXT_EMBEDDING.clean({"truncation": "refuse"}))
    assert strict.prepare(TEXTS[0].encode()) == TEXTS[0]
    with pytest.raises(InputError) as info:
        strict.prepare(TEXTS[-1].encode())
    assert info.value.error_class == "input_invalid"
    assert "over max_tokens 256 (truncation=refuse)" in info.value.message


def test_a_text_over_the_cap_is_refused_while_another_batch_is_embedded():
    """With the pipeline, the next batch's texts are prepared (counted, under
    truncation=refuse) while the model embeds this one: a count taken under the
    embedding's truncation let over-long texts through."""
    import threading
    import time

    from campaigns.intake.inputs import InputError

    strict = get_processor("text-embedding", TEXT_EMBEDDING.clean({"truncation": "refuse"}))
    over = ("word " * 600).encode()
    let_through: list[str] = []
    stop = threading.Event()

    def prepare_ahead() -> None:
        while not stop.is_set():
            try:
                strict.prepare(over)
                let_through.append("not refused")
            except InputError as exc:
                if "602 tokens" not in exc.message:
                    let_through.append(exc.message)
            except Exception as exc:  # "Already borrowed": the tokenizer shared
                let_through.append(repr(exc))

    reader = threading.Thread(target=prepare_ahead)
    reader.start()
    try:
        deadline = time.monotonic() + 2
        while time.monotonic() < deadline:
            strict.embed(TEXTS[:4])  # tokenizes with truncation at max_tokens
    finally:
        stop.set()
        reader.join()
    assert let_through == []


def test_half_precision_on_a_cpu_worker_is_a_clear_error():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this worker has CUDA: float16 is allowed here")
    with pytest.raises(ValueError, match="float16 needs a CUDA worker"):
        get_processor("text-embedding", TEXT_EMBEDDING.clean({"dtype": "float16"}))


def test_the_token_cost_used_for_grouping_matches_the_model_tokenizer(processor, tmp_path):
    from campaigns.specs.builtin import text_token_cost

    params = TEXT_EMBEDDING.clean({})
    for text in TEXTS:
        path = tmp_path / "t.txt"
        path.write_text(text)
        expected = min(len(processor.tokenizer(text)["input_ids"]), 256)
        assert text_token_cost(path, params) == expected


def test_weighing_many_texts_at_once_gives_each_its_own_count_and_none_for_the_unreadable(
    processor, tmp_path, monkeypatch
):
    from campaigns.specs import builtin as builtin_processors

    params = TEXT_EMBEDDING.clean({"max_tokens": 64})
    root = tmp_path / "corpus"
    root.mkdir()
    (tmp_path / "secret.txt").write_text("outside the corpus " * 10)
    names, expected = [], []
    for i in range(150):  # enough for a thread per core to take a share
        name = f"t{i:03}.txt"
        text = f"{TEXTS[i % len(TEXTS)]} {'extra words ' * (i % 7)}"
        (root / name).write_text(text)
        names.append(name)
        expected.append(min(len(processor.tokenizer(text)["input_ids"]), 64))
    (root / "leaves.txt").symlink_to(tmp_path / "secret.txt")
    (root / "folder.txt").mkdir()
    bad = ["missing.txt", "leaves.txt", "folder.txt", "../secret.txt"]
    names[40:40] = bad
    expected[40:40] = [None] * len(bad)
    # A few hundred bytes a tokenizer call: many calls, their counts must land in place.
    monkeypatch.setattr(builtin_processors, "COST_READ_BYTES", 300)
    assert builtin_processors.text_token_costs(root, names, params) == expected


def test_versions_that_differ_in_a_flag_or_the_batching_share_one_copy_of_the_model(processor):
    for changed in ({"flag_norm_max": 2.0}, {"batch_policy": "length_grouped"}, {"pooling": "cls"}):
        other = get_processor("text-embedding", TEXT_EMBEDDING.clean(changed))
        assert other is not processor and other.params != processor.params
        assert other.model is processor.model and other.tokenizer is processor.tokenizer
    # Pooling is the processor's own: the shared model gives a different vector.
    cls = get_processor("text-embedding", TEXT_EMBEDDING.clean({"pooling": "cls"}))
    assert float(cls.embed([TEXTS[0]]).vectors[0] @ processor.embed([TEXTS[0]]).vectors[0]) < 0.999


def test_a_model_folder_saved_over_is_loaded_again_for_a_new_version(processor, tmp_path):
    folder = tmp_path / "encoder"
    shutil.copytree(resolve_model_path(TEXT_EMBEDDING.params["model"].default), folder)
    first = get_processor("text-embedding", TEXT_EMBEDDING.clean({"model": str(folder)}))
    assert first.model is not processor.model  # another folder, another model
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes())  # saved again: a new modification time
    again = get_processor(
        "text-embedding", TEXT_EMBEDDING.clean({"model": str(folder), "flag_norm_max": 2.0})
    )
    assert again.model is not first.model
