"""Classification and features from a user's model.

The model file goes through load_model_file — torch.export programs (.pt2) or
TorchScript — the same path for a user's file and for the tiny CNN the tests
train. forward(x) returns logits (n, classes), or a
tuple (logits, features) to also export the penultimate layer; without
features the logits are exported as the feature vector. Or the file is a
state dict of a named architecture (torchvision's, or one registered in
settings), whose penultimate features are taken at its last Linear layer.
"""

from __future__ import annotations

import functools
import io
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from django.utils.module_loading import import_string
from PIL import Image

from campaigns.intake.images import decode_image
from campaigns.review.flags import classification_flags, image_input_flags
from campaigns.specs.builtin import check_classification_output, image_architectures
from campaigns.storage import checkpoint_files as checkpoints
from gpuworker.memory import MemoryProbe, device_and_dtype


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


def build_architecture(name: str, num_classes: int) -> torch.nn.Module:
    """An untrained network of a named architecture, for a state dict to fill:
    "torchvision:NAME" (torchvision installed beside torch on the worker) or a
    name of settings.BRIEFGPU_IMAGE_ARCHITECTURES ("module:callable", called
    with num_classes)."""
    if name.startswith("torchvision:"):
        try:
            import torchvision
        except ImportError:
            raise ValueError(
                f"architecture {name}: torchvision is not installed on this worker"
            ) from None
        return torchvision.models.get_model(
            name.split(":", 1)[1], weights=None, num_classes=num_classes
        )
    known = image_architectures()
    if name not in known:
        raise ValueError(f"unknown architecture {name!r}; known: {', '.join(sorted(known))}")
    return import_string(known[name].replace(":", "."))(num_classes=num_classes)


def load_state_dict_file(path: Path) -> dict:
    """A state dict from .safetensors, or from a torch.save file read as
    tensors only (weights_only: a pickle that would run code is refused)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    state = torch.load(str(path), map_location="cpu", weights_only=True)
    if not isinstance(state, dict):
        raise ValueError(f"{path.name} holds a {type(state).__name__}, not a state dict")
    return state


class WithFeatures(torch.nn.Module):
    """A network that returns logits alone, made to return (logits, features):
    the features are the input of its last Linear layer — the penultimate
    layer of a torchvision classifier (resnet's fc, vgg's last classifier)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.network = model
        self._features: torch.Tensor | None = None
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        if linears:
            linears[-1].register_forward_hook(self._keep)

    def _keep(self, _module, inputs, _output) -> None:
        self._features = inputs[0]

    def forward(self, x: torch.Tensor):
        self._features = None
        logits = self.network(x)
        features, self._features = self._features, None
        return logits if features is None else (logits, features)


@functools.lru_cache(maxsize=2)
def load_classifier(
    path: str,
    _stamp: tuple,
    weights: str,
    device,
    dtype,
    architecture: str = "",
    num_classes: int = 0,
):
    """A user's model (with fine-tuned weights), once per worker process, file
    version and precision: parameter versions that differ in a flag or the
    preprocessing share one copy in device memory.

    Without `architecture` the file is the model (.pt2 or TorchScript); with
    it, the file is that architecture's state dict."""
    if architecture:
        model = build_architecture(architecture, num_classes)
        model.load_state_dict(load_state_dict_file(Path(path)))
        model = model.to(device).eval()
    else:
        model = load_model_file(Path(path), device)
    if weights:
        model.load_state_dict(load_checkpoint_weights(Path(weights)))
    if architecture:
        model = WithFeatures(model)  # after the weights: their keys are the network's
    if dtype != torch.float32:
        model = model.to(dtype)
    return model


def top_two_margin(ranked: np.ndarray) -> float:
    """Top-1 minus top-2 of every class's probability, highest first; top_k only
    says how many the output lists.

    A model with a single class has no runner-up: its margin is the top-1
    probability (1.0 after softmax), so it never counts as hesitating.
    """
    if len(ranked) < 2:
        return float(ranked[0])
    return float(ranked[0] - ranked[1])


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
        self.labels = [
            line.strip()
            for line in Path(params["labels"]).read_text(encoding="utf-8").splitlines()
            if line.strip()
        ]
        model = Path(params["model"])
        stat = model.stat()  # a file replaced in place is a new model
        self.model = load_classifier(
            str(model),
            (stat.st_mtime_ns, stat.st_size),
            params.get("weights") or "",
            self.device,
            self.dtype,
            params.get("architecture") or "",
            len(self.labels),
        )
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
        ranked = np.argsort(-probs)
        top = ranked[: min(int(self.params["top_k"]), len(probs))]
        return {
            "top_indices": top.astype(np.int64),
            "top_labels": np.array([self.labels[i] for i in top]),
            "top_probs": probs[top].astype(np.float32),
            "margin": np.float32(top_two_margin(probs[ranked])),
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
