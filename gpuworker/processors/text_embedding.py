"""Sentence embeddings with a local Hugging Face encoder.

Pooling (mean / cls / max), normalisation (l2 / none), truncation (truncate /
refuse) and dtype come from the parameter version. With mean pooling and l2 it
matches sentence-transformers' encode for all-MiniLM-L6-v2 (tested), without
depending on it at run time.
"""

from __future__ import annotations

import functools
import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import AutoModel, AutoTokenizer

from campaigns.intake.inputs import decode_text
from campaigns.review.flags import norm_flags, truncation_flags
from campaigns.specs.builtin import embedding_row_check, resolve_model_path
from campaigns.specs.limits import refuse_over_max_tokens, refuse_without_tokens
from campaigns.storage import checkpoint_files as checkpoints
from campaigns.storage.outputs import validate_embedding_file, vector_to_npy
from gpuworker.memory import MemoryProbe, device_and_dtype

__all__ = ["EmbeddingBatch", "TextEmbeddingProcessor", "resolve_model_path"]


class CutText(str):
    """A text read in part (its file is longer than max_tokens can use): the
    words that hold its first max_tokens tokens. `tokens`: the whole text's
    tokens, estimated from the part read; `size`: the file's bytes."""

    tokens: int
    size: int


@dataclass
class EmbeddingBatch:
    vectors: np.ndarray  # (n, dim) float32, on the host
    norms: np.ndarray  # (n,) norm of each pooled vector before normalisation
    input_tokens: list[int]  # tokens of each text before truncation
    real_tokens: int
    padded_tokens: int
    seconds: float
    memory: dict
    cut_reads: dict[int, int] = field(default_factory=dict)  # index -> file bytes
    # The vectors rounded for the "same vector" rule, made once a batch.
    rounded: np.ndarray | None = field(default=None, repr=False)

    def vector_hash(self, index: int) -> str:
        """A row's hash, rounded so that the "same vector" rule also catches float noise."""
        if self.rounded is None:
            self.rounded = np.round(self.vectors, 5)
        return hashlib.sha1(self.rounded[index].tobytes()).hexdigest()[:16]


def folder_stamp(folder: Path) -> tuple:
    """Name, size and modification time of the folder's files: a model
    saved over the same folder is a new model."""
    return tuple(sorted((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in folder.iterdir()))


@functools.lru_cache(maxsize=2)
def load_encoder(path: str, _stamp: tuple, device: torch.device, dtype: torch.dtype):
    """(tokenizer, model) of a folder, once per worker process, folder
    contents (`folder_stamp`) and precision.

    Shared by every parameter version that names them: a new version that
    changes a flag or the batch policy must not put a second copy of the
    weights in device memory (the processors' own cache is per version).
    """
    folder = Path(path)
    if (folder / checkpoints.SIDECAR).exists():
        # A fine-tuned checkpoint: loaded only if every file is as written.
        checkpoints.verified(folder)
    # local_files_only: weights come from this folder, never from a hub.
    tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True)
    model = AutoModel.from_pretrained(folder, local_files_only=True, dtype=dtype)
    return tokenizer, model.to(device).eval()


class TextEmbeddingProcessor:
    suffix = ".npy"
    # A batch's vectors go to one shard file (campaigns/storage/vector_shards.py).
    shard_outputs = True

    def __init__(self, params: dict):
        self.params = params
        self.max_tokens = int(params["max_tokens"])
        self.device, dtype = device_and_dtype(params["dtype"])
        folder = resolve_model_path(params["model"])
        self.tokenizer, self.model = load_encoder(
            str(folder), folder_stamp(folder), self.device, dtype
        )
        self.dimension = int(self.model.config.hidden_size)
        if self.dimension != int(params["dimension"]):
            raise ValueError(
                f"model {params['model']} gives {self.dimension}-d vectors, "
                f"parameters say {params['dimension']}"
            )
        self.probe = MemoryProbe(self.device)
        # Counting for truncation=refuse, in prepare: a tokenizer of its own.
        # prepare runs in reader threads, also while run() tokenizes the last
        # batch (the prefetch), and the transformers tokenizer sets truncation
        # and padding on its Rust tokenizer at each call ("Already borrowed",
        # or a count taken under the other call's truncation).
        self.counter = Tokenizer.from_str(self.tokenizer.backend_tokenizer.to_str())
        self.counter.no_truncation()
        self.counter.no_padding()
        self.specials = len(self.counter.encode("").ids)  # [CLS] and [SEP]

    # --- the interface the batch runner uses ------------------------------

    def prepare(self, data: bytes) -> str:
        text = decode_text(data)
        refuse_without_tokens(text, self.counter)
        size = getattr(data, "size", len(data))
        if size > len(data):
            return self._cut(text, data, size)
        if self.params["truncation"] == "refuse":
            tokens = len(self.counter.encode(text).ids)
            refuse_over_max_tokens(data, tokens, self.max_tokens)
        return text

    def _cut(self, text: str, data: bytes, size: int) -> CutText:
        """The part read of a longer file (campaigns.specs.limits.text_read_limits),
        cut again after the word that holds token max_tokens: the tokenizer
        then gives the whole text's first max_tokens tokens, from a text a
        few times their length instead of the part read."""
        encoding = self.counter.encode(text, add_special_tokens=False)
        tokens = len(encoding.ids)
        if self.params["truncation"] == "refuse":
            refuse_over_max_tokens(data, tokens, self.max_tokens)
        words = encoding.word_ids
        if tokens > self.max_tokens and words[self.max_tokens] is not None:
            # The first token of the word holding token max_tokens: the words
            # before it are tokenized as in the whole text.
            first = self.max_tokens
            while first > 0 and words[first - 1] == words[self.max_tokens]:
                first -= 1
            if first >= self.max_tokens - self.specials:
                text = text[: encoding.offsets[first][0]]
        made = CutText(text)
        made.size = size
        made.tokens = round(tokens * size / max(1, len(data))) + self.specials
        return made

    def run(self, items: list[str]) -> EmbeddingBatch:
        return self.embed(items)

    def output(self, result: EmbeddingBatch, index: int) -> np.ndarray:
        return result.vectors[index]

    def serialize(self, vector: np.ndarray) -> bytes:
        return vector_to_npy(vector)

    def validate(self, path: Path) -> None:
        validate_embedding_file(
            path, dimension=self.dimension, normalized=self.params["normalization"] == "l2"
        )

    def check_rows(self, vectors: np.ndarray) -> list:
        """The shard's rows, as validate checks a file: dimension, finite, unit norm."""
        return embedding_row_check(vectors, self.params)

    def unit_metrics(self, result: EmbeddingBatch, index: int) -> dict:
        tokens = result.input_tokens[index]
        metrics = {
            "tokens": tokens,
            "truncated": tokens > self.max_tokens,
            "norm": round(float(result.norms[index]), 5),
            "vector_hash": result.vector_hash(index),
        }
        if index in result.cut_reads:
            # Read in part: the count is the part's, scaled to the file's size.
            metrics.update(truncated=True, tokens_estimated=True, bytes=result.cut_reads[index])
        return metrics

    def flags(self, result: EmbeddingBatch, index: int) -> list[tuple[str, str]]:
        return truncation_flags(
            result.input_tokens[index], self.max_tokens, self.params
        ) + norm_flags(float(result.norms[index]), self.params)

    def batch_metrics(self, result: EmbeddingBatch) -> dict:
        return {
            "real_tokens": result.real_tokens,
            "padded_tokens": result.padded_tokens,
            "compute_seconds": round(result.seconds, 4),
            "memory": result.memory,
        }

    # --- the model ----------------------------------------------------------

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> EmbeddingBatch:
        started = time.perf_counter()
        self.probe.reset_peak()
        encoded = self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_tokens,
            return_tensors="pt",
        )
        # Length before truncation, so a truncated input is visible in the
        # record. Only a text that fills max_tokens can have been cut: those
        # alone are tokenised again, whole (a second pass over every text
        # shows in the worker's time: bench/RESULTS.md, "The ceiling in every
        # row, four small cuts (2026-11-30)").
        input_tokens = encoded["attention_mask"].sum(dim=1).tolist()
        # A text read in part brings its estimate: its file is not tokenized whole.
        cut_reads = {i: t.size for i, t in enumerate(texts) if isinstance(t, CutText)}
        for i in cut_reads:
            input_tokens[i] = max(cast(CutText, texts[i]).tokens, self.max_tokens + 1)
        cut = [i for i, n in enumerate(input_tokens) if n >= self.max_tokens and i not in cut_reads]
        if cut:
            whole = self.tokenizer(
                [texts[i] for i in cut], add_special_tokens=True, truncation=False, verbose=False
            )["input_ids"]
            for i, ids in zip(cut, whole, strict=True):
                input_tokens[i] = len(ids)
        encoded = encoded.to(self.device)
        hidden = self.model(**encoded).last_hidden_state.float()
        pooled = self._pool(hidden, encoded["attention_mask"])
        norms = pooled.norm(dim=1).cpu().numpy()
        if self.params["normalization"] == "l2":
            pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        # Copied to the host at once: results are exported as they come,
        # never accumulated on the device.
        host = pooled.cpu().numpy()
        memory = self.probe.snapshot()
        return EmbeddingBatch(
            vectors=host,
            norms=norms,
            input_tokens=input_tokens,
            real_tokens=int(encoded["attention_mask"].sum()),
            padded_tokens=int(encoded["input_ids"].numel()),
            seconds=time.perf_counter() - started,
            memory=memory,
            cut_reads=cut_reads,
        )

    def _pool(self, hidden: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
        pooling = self.params["pooling"]
        if pooling == "cls":
            return hidden[:, 0]
        mask = attention.unsqueeze(-1).to(hidden.dtype)
        if pooling == "max":
            return hidden.masked_fill(mask == 0, float("-inf")).max(dim=1).values
        return (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
