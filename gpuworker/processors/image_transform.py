"""Image resize / thumbnail / format conversion with Pillow (CPU)."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from pathlib import Path

from PIL import Image

from campaigns.builtin_processors import IMAGE_FORMATS, check_image_output, expected_size
from campaigns.flags import image_input_flags
from campaigns.images import decode_image

from ..memory import MemoryProbe, cpu


@dataclass
class TransformBatch:
    images: list  # PIL images, transformed
    sources: list[tuple[int, int]]
    pixels: int
    seconds: float
    memory: dict


class ImageTransformProcessor:
    def __init__(self, params: dict):
        self.params = params
        self.suffix = ".jpg" if params["format"] == "jpeg" else f".{params['format']}"
        self.probe = MemoryProbe(cpu())

    def prepare(self, data: bytes):
        return decode_image(
            data,
            max_pixels=int(self.params["max_pixels"]),
            max_aspect=int(self.params["max_aspect"]),
        )

    def run(self, items: list) -> TransformBatch:
        started = time.perf_counter()
        out, sources = [], []
        for image in items:
            sources.append(image.size)
            width, height = expected_size(*image.size, self.params)
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
        image, _source = output
        buf = io.BytesIO()
        fmt = IMAGE_FORMATS[self.params["format"]]
        options = {"quality": int(self.params["quality"])} if fmt in ("JPEG", "WEBP") else {}
        image.save(buf, format=fmt, **options)
        return buf.getvalue()

    def validate(self, path: Path) -> None:
        check_image_output(path, self.params)

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
