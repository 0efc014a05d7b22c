"""Image resize / thumbnail / format conversion with Pillow (CPU)."""

from __future__ import annotations

import hashlib
import io
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from campaigns.intake.images import decode_image
from campaigns.review.flags import image_input_flags
from campaigns.specs.builtin import (
    IMAGE_FORMATS,
    IMAGE_FORMATS_WITH_ALPHA,
    check_image_output,
    expected_size,
)
from gpuworker.memory import MemoryProbe, cpu


@dataclass
class TransformBatch:
    images: list  # PIL images, transformed
    sources: list[tuple[int, int]]
    pixels: int
    seconds: float
    memory: dict


class SourceSizes:
    """The input size of each output serialized here, by its bytes' digest.

    validate() gets only the path the runner wrote (the batch runner and the
    profiler both call it so), yet a conversion's or a thumbnail's exact
    dimensions follow from its input's. The runner's checks run in threads,
    while the next batch computes: hence the lock. Bounded, oldest first: an
    output whose write failed is never checked, and must not stay forever.
    """

    LIMIT = 2 * 4096  # two batches of the largest batch_size

    def __init__(self):
        self._sizes: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    def remember(self, data: bytes, source: tuple[int, int]) -> None:
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            self._sizes[key] = source
            if len(self._sizes) > self.LIMIT:
                del self._sizes[next(iter(self._sizes))]

    def of(self, data: bytes) -> tuple[int, int] | None:
        """None for a file this process did not serialize (an adopted output)."""
        key = hashlib.sha256(data).hexdigest()
        with self._lock:
            return self._sizes.get(key)


class ImageTransformProcessor:
    def __init__(self, params: dict):
        self.params = params
        self.suffix = ".jpg" if params["format"] == "jpeg" else f".{params['format']}"
        self.probe = MemoryProbe(cpu())
        self.sources = SourceSizes()

    def prepare(self, data: bytes):
        return decode_image(
            data,
            max_pixels=int(self.params["max_pixels"]),
            max_aspect=int(self.params["max_aspect"]),
            keep_alpha=self.params["format"] in IMAGE_FORMATS_WITH_ALPHA,
        )

    def run(self, items: list) -> TransformBatch:
        started = time.perf_counter()
        out, sources = [], []
        for image in items:
            sources.append(image.size)
            source_w, source_h = image.size
            width, height = expected_size(source_w, source_h, self.params)
            if (width, height) != image.size:
                image = image.resize((width, height), Image.Resampling.LANCZOS)
            out.append(image)
        return TransformBatch(
            images=out,
            sources=sources,
            pixels=sum(w * h for w, h in sources),
            seconds=time.perf_counter() - started,
            memory=self.probe.snapshot(),
        )

    def output(self, result: TransformBatch, index: int):
        return result.images[index], result.sources[index]

    def serialize(self, output) -> bytes:
        image, source = output
        buf = io.BytesIO()
        fmt = IMAGE_FORMATS[self.params["format"]]
        options = {"quality": int(self.params["quality"])} if fmt in ("JPEG", "WEBP") else {}
        image.save(buf, format=fmt, **options)
        data = buf.getvalue()
        self.sources.remember(data, source)
        return data

    def validate(self, path: Path) -> None:
        check_image_output(path, self.params, self.sources.of(path.read_bytes()))

    def unit_metrics(self, result: TransformBatch, index: int) -> dict:
        width, height = result.sources[index]
        return {"source_width": width, "source_height": height}

    def flags(self, result: TransformBatch, index: int) -> list[tuple[str, str]]:
        return image_input_flags(*result.sources[index], self.params)

    def batch_metrics(self, result: TransformBatch) -> dict:
        # Pixels in the token columns: what the batch weighed, for comparisons.
        return {
            "real_tokens": result.pixels,
            "padded_tokens": result.pixels,
            "compute_seconds": round(result.seconds, 4),
            "memory": result.memory,
        }
