"""Image resize / thumbnail / format conversion with Pillow (CPU)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from campaigns.intake.images import decode_image, open_image
from campaigns.review.flags import image_input_flags
from campaigns.specs.builtin import (
    IMAGE_FORMATS,
    IMAGE_FORMATS_WITH_ALPHA,
    check_image_output,
    expected_size,
)
from campaigns.specs.limits import check_output_pixels
from gpuworker.memory import MemoryProbe, cpu

#: Outputs over this many pixels are checked one at a time: the runner checks a
#: batch's outputs in threads, and each check decodes its output whole.
LARGE_OUTPUT_PIXELS = 16_000_000
_LARGE_CHECK = threading.Lock()


@dataclass
class TransformBatch:
    # The decoded inputs: each is transformed when its output is asked for
    # (`output`), serialized and written before the next, so a batch never
    # holds more than one transformed image (docs/processors.md).
    images: list
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
        # Its output's size from the header first: one over max_output_pixels
        # fails before its input is decoded.
        check_output_pixels(data, self.params)
        return decode_image(
            data,
            max_pixels=int(self.params["max_pixels"]),
            max_aspect=int(self.params["max_aspect"]),
            keep_alpha=self.params["format"] in IMAGE_FORMATS_WITH_ALPHA,
        )

    def run(self, items: list) -> TransformBatch:
        sources = [image.size for image in items]
        return TransformBatch(
            images=list(items),
            sources=sources,
            pixels=sum(w * h for w, h in sources),
            seconds=0.0,
            memory=self.probe.snapshot(),
        )

    def output(self, result: TransformBatch, index: int):
        started = time.perf_counter()
        image = result.images[index]
        source_w, source_h = image.size
        width, height = expected_size(source_w, source_h, self.params)
        if (width, height) != image.size:
            image = image.resize((width, height), Image.Resampling.LANCZOS)
        result.seconds += time.perf_counter() - started
        return image, result.sources[index]

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
        try:
            with open_image(path, None) as header:  # the header only
                pixels = header.size[0] * header.size[1]
        except (OSError, SyntaxError, ValueError):
            pixels = 0  # not an image: check_image_output says so
        large = pixels > LARGE_OUTPUT_PIXELS
        with _LARGE_CHECK if large else contextlib.nullcontext():
            check_image_output(path, self.params, self.sources.of(path.read_bytes()))

    def unit_metrics(self, result: TransformBatch, index: int) -> dict:
        width, height = result.sources[index]
        return {"source_width": width, "source_height": height}

    def flags(self, result: TransformBatch, index: int) -> list[tuple[str, str]]:
        return image_input_flags(*result.sources[index], self.params)

    def batch_metrics(self, result: TransformBatch) -> dict:
        # Pixels in the token columns: what the batch weighed, for comparisons.
        # Asked once the outputs are written: the transformations are done
        # by then, their time and memory in these figures.
        return {
            "real_tokens": result.pixels,
            "padded_tokens": result.pixels,
            "compute_seconds": round(result.seconds, 4),
            "memory": self.probe.snapshot(),
        }
