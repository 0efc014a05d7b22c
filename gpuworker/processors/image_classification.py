"""Classification and features from a user's TorchScript model.

The model file goes through load_model_file — torch.export programs (.pt2) or
TorchScript — the same path for a user's file and for the tiny CNN the tests
train. forward(x) returns logits (n, classes), or a
tuple (logits, features) to also export the penultimate layer; without
features the logits are exported as the feature vector.
"""

from __future__ import annotations

import functools
import io
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from campaigns import checkpoint_files as checkpoints
from campaigns.builtin_processors import check_classification_output
from campaigns.flags import classification_flags, image_input_flags
from campaigns.images import decode_image

from ..memory import MemoryProbe, device_and_dtype


def load_model_file(path: Path, device: torch.device):
    """A user's model file: torch.export (.pt2) or TorchScript (anything else)."""
    if path.suffix == ".pt2":
        program = torch.export.load(str(path))
        return program.module().to(device)
    return torch.jit.load(str(path), map_location=device).eval()


def load_checkpoint_weights(folder: Path) -> dict:
    """A fine-tuned state dict, only from a checkpoint whose files match their checksums."""
    from safetensors.torch import load_file

    checkpoints.verified(folder)  # CheckpointError: damaged or partial, never loaded
    return load_file(str(folder / "model.safetensors"))


@functools.lru_cache(maxsize=2)
def load_classifier(path: str, _stamp: tuple, weights: str, device, dtype):
    """A user's model (with fine-tuned weights), once per worker process, file
    version and precision: parameter versions that differ in a flag or the
    preprocessing share one copy in device memory."""
    model = load_model_file(Path(path), device)
    if weights:
        model.load_state_dict(load_checkpoint_weights(Path(weights)))
    if dtype != torch.float32:
        model = model.to(dtype)
    return model


@dataclass
class ClassificationBatch:
    probs: np.ndarray  # (n, classes)
    sources: list[tuple[int, int]]  # input width, height (before resizing)
    features: np.ndarray  # (n, d)
    pixels: int
    seconds: float
    memory: dict


class ImageClassificationProcessor:
    suffix = ".npz"

    def __init__(self, params: dict):
        self.params = params
        self.device, self.dtype = device_and_dtype(params["dtype"])
        model = Path(params["model"])
        stat = model.stat()  # a file replaced in place is a new model
        self.model = load_classifier(
            str(model),
            (stat.st_mtime_ns, stat.st_size),
            params.get("weights") or "",
            self.device,
            self.dtype,
        )
        self.labels = [
            line.strip()
            for line in Path(params["labels"]).read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        self.mean = np.array([float(v) for v in params["mean"].split(",")], dtype=np.float32)
        self.std = np.array([float(v) for v in params["std"].split(",")], dtype=np.float32)
        self.probe = MemoryProbe(self.device)

    def prepare(self, data: bytes) -> tuple[np.ndarray, tuple[int, int]]:
        image = decode_image(
            data,
            max_pixels=int(self.params["max_pixels"]),
            max_aspect=int(self.params["max_aspect"]),
        )
        return self._preprocess(image), image.size

    def _preprocess(self, image: Image.Image) -> np.ndarray:
        resize, crop = int(self.params["resize"]), int(self.params["crop"])
        width, height = image.size
        scale = resize / min(width, height)
        image = image.resize(
            (max(crop, round(width * scale)), max(crop, round(height * scale))),
            Image.Resampling.BILINEAR,
        )
        left = (image.width - crop) // 2
        top = (image.height - crop) // 2
        image = image.crop((left, top, left + crop, top + crop))
        array = np.asarray(image, dtype=np.float32) / 255.0
        array = (array - self.mean) / self.std
        return array.transpose(2, 0, 1)  # CHW

    @torch.inference_mode()
    def run(self, items: list[tuple[np.ndarray, tuple[int, int]]]) -> ClassificationBatch:
        started = time.perf_counter()
        self.probe.reset_peak()
        batch = torch.from_numpy(np.stack([array for array, _ in items])).to(
            self.device, self.dtype
        )
        out = self.model(batch)
        logits, features = (out[0], out[1]) if isinstance(out, tuple) else (out, out)
        if logits.shape[1] != len(self.labels):
            raise ValueError(
                f"model gives {logits.shape[1]} classes, labels file has {len(self.labels)}"
            )
        probs = torch.softmax(logits.float(), dim=1).cpu().numpy()
        feats = features.float().reshape(len(items), -1).cpu().numpy()
        return ClassificationBatch(
            probs=probs,
            sources=[size for _, size in items],
            features=feats,
            pixels=int(batch.shape[0] * batch.shape[2] * batch.shape[3]),
            seconds=time.perf_counter() - started,
            memory=self.probe.snapshot(),
        )

    def output(self, result: ClassificationBatch, index: int) -> dict:
        probs = result.probs[index]
        k = min(int(self.params["top_k"]), len(probs))
        top = np.argsort(-probs)[:k]
        margin = float(probs[top[0]] - probs[top[1]]) if k > 1 else float(probs[top[0]])
        return {
            "top_indices": top.astype(np.int64),
            "top_labels": np.array([self.labels[i] for i in top]),
            "top_probs": probs[top].astype(np.float32),
            "margin": np.float32(margin),
            "features": result.features[index].astype(np.float32),
        }

    def serialize(self, output: dict) -> bytes:
        buf = io.BytesIO()
        np.savez(buf, **output)
        return buf.getvalue()

    def validate(self, path: Path) -> None:
        check_classification_output(path, self.params)

    def unit_metrics(self, result: ClassificationBatch, index: int) -> dict:
        out = self.output(result, index)
        return {
            "category": str(out["top_labels"][0]),
            "probability": round(float(out["top_probs"][0]), 4),
            "margin": round(float(out["margin"]), 4),
        }

    def flags(self, result: ClassificationBatch, index: int) -> list[tuple[str, str]]:
        return classification_flags(
            [float(p) for p in result.probs[index]], self.labels, self.params
        ) + image_input_flags(*result.sources[index], self.params)

    def batch_metrics(self, result: ClassificationBatch) -> dict:
        return {
            "real_tokens": result.pixels,
            "padded_tokens": result.pixels,
            "compute_seconds": round(result.seconds, 4),
            "memory": result.memory,
        }
