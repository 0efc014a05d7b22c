"""How long the model waits between batches for the next batch's images, with
and without the prefetch (gpuworker/runner/prefetch.py).

    DEBUG=0 .venv/bin/python bench/input_prefetch.py --images 384 --repeat 2

An image-classification campaign over generated photos (noise and shapes,
JPEG, 1280×960 by default: decoding and resizing one costs more than a small
model's forward pass on a GPU) is run batch after batch in this process as a
pipelined Celery worker runs it (run_batch(hand_off=True): writes and recording
in the finisher thread). The model is a small scripted CNN with random
weights — its answers do not matter, its time does. "idle" is the time from
one forward pass's end to the next one's start: what a GPU would sit out. On a
CPU the prefetch thread and the model share the cores, so the wall time moves
less than the idle time; on a GPU the model leaves the cores to the prefetch.
Rows alternate off / on, each on a new campaign over the same files (the page
cache is warm for all but the first, which is run once unmeasured).
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import django_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--images", type=int, default=384)
    parser.add_argument("--size", default="1280x960", help="width x height of the photos")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=2, help="off/on pairs")
    args = parser.parse_args()
    work = django_env.setup("bench-prefetch-")
    logging.disable(logging.INFO)  # a line a batch would bury the table
    width, height = (int(v) for v in args.size.split("x"))
    folder = make_photos(work / "photos", args.images, width, height)
    model, labels = make_model(work)

    import torch

    print(
        f"# {platform.node()}: {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads); {args.images} JPEG {width}×{height}, "
        f"batch {args.batch_size}, crop 224"
    )
    run(folder, model, labels, args.batch_size, prefetch=True, label="warm-up")
    print("| prefetch | wall s | images/s | model s | idle ms/batch (median) | prefetched |")
    print("|---|---:|---:|---:|---:|---:|")
    for i in range(args.repeat):
        for on in (False, True):
            row = run(folder, model, labels, args.batch_size, prefetch=on, label=f"r{i}")
            print(
                f"| {'on' if on else 'off'} | {row['wall']:.2f} | {args.images / row['wall']:.1f}"
                f" | {row['model']:.2f} | {row['idle_ms']:.1f} | {row['prefetched']} |",
                flush=True,
            )


def make_photos(folder: Path, count: int, width: int, height: int) -> Path:
    import numpy as np
    from PIL import Image, ImageDraw

    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        # Coarse noise scaled up, then shapes and fine noise: JPEG-sized like a photo.
        base = rng.integers(0, 255, (height // 40, width // 40, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((width, height), Image.Resampling.BICUBIC)
        draw = ImageDraw.Draw(image)
        for _ in range(6):
            x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
            r = int(rng.integers(40, 300))
            draw.ellipse(
                (x - r, y - r, x + r, y + r), fill=tuple(int(c) for c in rng.integers(0, 255, 3))
            )
        grain = rng.integers(-12, 12, (height, width, 3))
        pixels = np.clip(np.asarray(image, dtype=np.int16) + grain, 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", quality=90)
    return folder


def make_model(work: Path) -> tuple[Path, Path]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(16, 32, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(64, 3),
    ).eval()
    path = work / "model.pt"
    torch.jit.script(model).save(str(path))
    labels = work / "labels.txt"
    labels.write_text("a\nb\nc\n")
    return path, labels


def run(folder: Path, model: Path, labels: Path, batch_size: int, *, prefetch: bool, label: str):
    from campaigns.models import Batch, Project
    from campaigns.runs import setup, start
    from gpuworker.processors.image_classification import ImageClassificationProcessor
    from gpuworker.runner.batch import run_batch
    from gpuworker.runner.pipeline import finisher
    from gpuworker.runner.prefetch import prefetch as ahead

    project, _ = Project.objects.get_or_create(name="bench")
    name = f"photos-{label}-{'on' if prefetch else 'off'}"
    campaign, _ = setup.campaign_create(
        name=name,
        processor="image-classification",
        project=project,
        input_folder=folder,
        params={"model": str(model), "labels": str(labels), "batch_size": batch_size},
    )
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    spans: list[tuple[float, float]] = []
    forward = ImageClassificationProcessor.run

    def timed(self, items):
        started = time.perf_counter()
        try:
            return forward(self, items)
        finally:
            spans.append((started, time.perf_counter()))

    prefetch_start = ahead.start if prefetch else (lambda *a, **k: None)
    ids = list(Batch.objects.filter(campaign=campaign).order_by("pk").values_list("pk", flat=True))
    began = time.perf_counter()
    with (
        mock.patch.object(ImageClassificationProcessor, "run", timed),
        mock.patch.object(ahead, "start", prefetch_start),
    ):
        for batch_id in ids:
            run_batch(batch_id, hand_off=True)
        finisher.drain()
    wall = time.perf_counter() - began
    ahead.drop()
    gaps = [b[0] - a[1] for a, b in zip(spans, spans[1:], strict=False)]
    prefetched = sum(
        b.metrics.get("prefetched", 0) for b in Batch.objects.filter(campaign=campaign)
    )
    return {
        "wall": wall,
        "model": sum(end - begin for begin, end in spans),
        "idle_ms": 1000 * statistics.median(gaps) if gaps else 0.0,
        "prefetched": prefetched,
    }


if __name__ == "__main__":
    main()
