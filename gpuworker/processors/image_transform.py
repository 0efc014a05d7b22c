"""Image resize / thumbnail / format conversion with Pillow (CPU).

What a worker holds of a batch (docs/processors.md, "Memory"): between its
reading and its writing, each unit's output when it is smaller than its input
(a thumbnail is made as its input is read, in the reader threads, and the
input let go of), else its decoded input — while they fit the kept pixel
budget (gpuworker/processors/pixel_budget.py); past it, nothing but where
its file is: the file is read again (its sha256 checked against the bytes
first read) and decoded when its output is made. An output is made, encoded
straight into its file and checked from the file under the working budget:
one large image at a time, never the encoded bytes whole beside it.
"""

from __future__ import annotations

import functools
import hashlib
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Generic, TypeVar, cast

from PIL import Image

from campaigns.intake.images import decode_image, open_image
from campaigns.intake.inputs import InputSource
from campaigns.review.flags import image_input_flags
from campaigns.specs.builtin import (
    IMAGE_FORMATS,
    IMAGE_FORMATS_WITH_ALPHA,
    check_image_output,
    expected_size,
)
from campaigns.specs.limits import check_output_pixels
from campaigns.storage.outputs import HashingWriter, Streamed
from gpuworker.memory import MemoryProbe, cpu, map_large_allocations
from gpuworker.processors import pixel_budget

Source = TypeVar("Source")


@dataclass(eq=False)
class Prepared:
    """One input, read and checked (decoded whole once), ready for its output."""

    source: tuple[int, int]  # its width × height, EXIF orientation applied
    image: Image.Image | None  # its output when `made`, else its decoded input
    made: bool
    # When no image of it fitted the kept budget: its file, read again for its
    # output (bytes only when given bytes read_bytes did not read).
    again: InputSource | bytes | None
    seconds: float  # transforming it, when `made`


@dataclass
class TransformBatch:
    items: list[Prepared]
    sources: list[tuple[int, int]]
    pixels: int
    seconds: float
    memory: dict


@dataclass(frozen=True, eq=False)
class Job:
    """An output to make (`output`), made as it is written (`serialize`)."""

    item: Prepared
    batch: TransformBatch


class SourceSizes(Generic[Source]):
    """The input size of each output written here, by its bytes' digest (or
    another fact of its input: the audio transform keeps its header's).

    validate() gets only the path the runner wrote (the batch runner and the
    profiler both call it so), yet a conversion's or a thumbnail's exact
    dimensions follow from its input's. The runner's checks run in threads,
    while the next batch computes: hence the lock. Bounded, oldest first: an
    output whose write failed is never checked, and must not stay forever.
    """

    LIMIT = 2 * 4096  # two batches of the largest batch_size

    def __init__(self):
        self._sizes: dict[str, Source] = {}
        self._lock = threading.Lock()

    def remember(self, sha256: str, source: Source) -> None:
        with self._lock:
            self._sizes[sha256] = source
            if len(self._sizes) > self.LIMIT:
                del self._sizes[next(iter(self._sizes))]

    def of(self, path: Path) -> Source | None:
        """None for a file this process did not write (an adopted output)."""
        with open(path, "rb") as fh:
            key = hashlib.file_digest(fh, "sha256").hexdigest()
        with self._lock:
            return self._sizes.get(key)


class ImageTransformProcessor:
    def __init__(self, params: dict):
        self.params = params
        self.suffix = ".jpg" if params["format"] == "jpeg" else f".{params['format']}"
        self.probe = MemoryProbe(cpu())
        self.sources: SourceSizes[tuple[int, int]] = SourceSizes()
        map_large_allocations()

    def prepare(self, data: bytes) -> Prepared:
        # Its output's size from the header first: one over max_output_pixels
        # fails before its input is decoded.
        header = check_output_pixels(data, self.params)
        work = 0
        if header is not None:
            out_w, out_h = expected_size(*header, self.params)
            work = header[0] * header[1] + out_w * out_h
        with pixel_budget.working.hold(work):
            started = time.perf_counter()
            image = decode_image(
                data,
                max_pixels=int(self.params["max_pixels"]),
                max_aspect=int(self.params["max_aspect"]),
                keep_alpha=self.params["format"] in IMAGE_FORMATS_WITH_ALPHA,
            )
            source: tuple[int, int] = image.size
            size = expected_size(source[0], source[1], self.params)
            made = size[0] * size[1] < source[0] * source[1]
            if made:  # smaller than its input: made now, in this reader thread
                image = self.transform(image, size)
            seconds = time.perf_counter() - started if made else 0.0
            if pixel_budget.kept.keep(image, image.width * image.height):
                return Prepared(source, image, made, None, seconds)
            del image  # read again from its file instead
        return Prepared(source, None, False, getattr(data, "source", None) or data, 0.0)

    def transform(self, image: Image.Image, size: tuple[int, int]) -> Image.Image:
        """`image` as an output of `size` (itself when it has that size: a conversion)."""
        if size == image.size:
            return image
        return image.resize(size, Image.Resampling.LANCZOS)

    def run(self, items: list[Prepared]) -> TransformBatch:
        sources = [item.source for item in items]
        return TransformBatch(
            items=list(items),
            sources=sources,
            pixels=sum(w * h for w, h in sources),
            seconds=sum(item.seconds for item in items),
            memory=self.probe.snapshot(),
        )

    def output(self, result: TransformBatch, index: int) -> Job:
        return Job(result.items[index], result)

    def serialize(self, job: Job) -> Streamed:
        return Streamed(functools.partial(self._write, job))

    def _write(self, job: Job, fh: HashingWriter) -> None:
        """The output made (its input read and decoded again, when not kept,
        and transformed, unless made already) and encoded into the file.
        InputError when the input read again is not the one first read."""
        item = job.item
        size = expected_size(*item.source, self.params)
        work = 0
        if item.image is None:
            work += item.source[0] * item.source[1]
        if not item.made and size != item.source:
            work += size[0] * size[1]
        fmt = IMAGE_FORMATS[self.params["format"]]
        options = {"quality": int(self.params["quality"])} if fmt in ("JPEG", "WEBP") else {}
        with pixel_budget.working.hold(work):
            started = time.perf_counter()
            image = item.image
            if image is None:
                assert item.again is not None  # read again from its file instead
                data = item.again.read() if isinstance(item.again, InputSource) else item.again
                image = decode_image(
                    data,
                    max_pixels=int(self.params["max_pixels"]),
                    max_aspect=int(self.params["max_aspect"]),
                    keep_alpha=self.params["format"] in IMAGE_FORMATS_WITH_ALPHA,
                )
                del data
            if not item.made:
                image = self.transform(image, size)
            job.batch.seconds += time.perf_counter() - started
            image.save(cast(IO[bytes], fh), format=fmt, **options)  # it writes only
            del image
        self.sources.remember(fh.hexdigest(), item.source)

    def validate(self, path: Path) -> None:
        try:
            with open_image(path, None) as header:  # the header only
                pixels = header.size[0] * header.size[1]
        except (OSError, SyntaxError, ValueError):
            pixels = 0  # not an image: check_image_output says so
        # Each check decodes its output whole, in the runner's check threads.
        with pixel_budget.working.hold(pixels):
            check_image_output(path, self.params, self.sources.of(path))

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
