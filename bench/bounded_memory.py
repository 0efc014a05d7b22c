"""Worker peak memory on huge inputs and outputs, against the same corpus without them.

    DEBUG=0 .venv/bin/python bench/bounded_memory.py [--big-mb 50] [--texts 40]
        [--runs 3] [--cases image+cap,image+huge]

Each case runs in a child process of its own, through the real path: a
campaign made by `setup.campaign_create`, planned by `campaign_run` (costs
weighed, batches made) and every batch run by gpuworker.runner.batch.run_batch
(claim, read, model, write, check, record). The corpus is written by another
process first, so the child's peak is the worker's alone. The child reports
its peak RSS (resource.getrusage, ru_maxrss), its RSS before the first batch and
after the last, and each batch's wall time. Cases:

- text: `--texts` short texts; and the same plus one `--big-mb` MB text
  (text-embedding, max_tokens 256, batch_size 16, original order so the big
  text shares a batch with small ones).
- image: `--images` small PNGs thumbnailed 32×32 (batch_size 16: one batch);
  image+huge: the same plus one `--huge-side` × 3/4 of it photo-like JPEG
  (48 Mpx at 8000) in their batch, so the batch's time is how long the small
  ones wait for it; image+4huge: four of them in the batch.
- image+cap: 4 small PNGs resized to max_output_pixels (the default cap, or
  `--cap`), batch_size 4.
- image+rawbig: the small PNGs plus `--raw-count` BMPs of `--raw-mpx`
  megapixels (uncompressed: 3 bytes a pixel on disk, 51 MB at 17 Mpx),
  converted to JPEG in one batch: a conversion needs its input until its
  output is made, and one over IMAGE_PIXEL_BUDGET is not kept decoded. More
  of them than the worker's 4 reader threads, so what the batch holds of
  their files while its outputs are written shows.

`--runs N` runs each case N times (the peak moves between runs) and prints
every run; `--glibc-default` leaves glibc's mmap threshold as it is, to see
what gpuworker.memory.map_large_allocations changes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# Words of the generated texts (a sentence split, kept as text to stay short).
SENTENCE = (
    "the harbour reopened on monday after three weeks of repairs while the council "
    "debated a new budget for schools roads and the library extension"
)
WORDS = SENTENCE.split(" ")
CASES = ("text", "text+big", "image", "image+huge", "image+4huge", "image+cap", "image+rawbig")


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize() / 2**20


def make_corpus(case: str, corpus: Path, args: argparse.Namespace) -> None:
    """The case's inputs, written by a process of their own (`--make`)."""
    from PIL import Image

    rng = random.Random(7)
    if case.startswith("text"):
        for i in range(args.texts):
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
            (corpus / f"t{i:04d}.txt").write_text(words)
        if case == "text+big":
            with open(corpus / "t0003-big.txt", "w") as fh:  # shares the first batch
                chunk = " ".join(rng.choice(WORDS) for _ in range(20000)) + "\n"
                while fh.tell() < args.big_mb * 2**20:
                    fh.write(chunk)
        return
    count = 4 if case == "image+cap" else args.images
    for i in range(count):
        Image.new("RGB", (64 + i, 48), (i * 7 % 255, 90, 160)).save(corpus / f"i{i:03d}.png")
    huge = {"image+huge": 1, "image+4huge": 4}.get(case, 0)
    if huge:
        # Photo-like: smooth noise, so the JPEG is a camera's size, not a flat colour's.
        side = args.huge_side
        noise = Image.frombytes("RGB", (64, 48), rng.randbytes(64 * 48 * 3))
        photo = noise.resize((side, side * 3 // 4), Image.Resampling.BICUBIC)
        for i in range(huge):
            photo.save(corpus / f"i{1 + 2 * i:03d}-huge.jpg", quality=90)
    if case == "image+rawbig":
        side = int((args.raw_mpx * 1e6 * 4 / 3) ** 0.5)
        size = (side, side * 3 // 4)
        ramp = Image.linear_gradient("L").resize(size)
        for i in range(args.raw_count):
            flat = Image.new("L", size, i * 20 % 255)
            raw = Image.merge("RGB", (ramp, flat, ramp.rotate(180)))
            raw.save(corpus / f"i{1 + 2 * i:03d}-raw.bmp")


def child(case: str, args: argparse.Namespace) -> dict:
    from bench import django_env

    work = django_env.setup(f"bench-bounded-{case.replace('+', '-')}-")
    from campaigns.models import Batch, Unit
    from campaigns.runs import setup, start
    from campaigns.specs.limits import MAX_OUTPUT_PIXELS
    from gpuworker.runner.batch import run_batch

    if args.glibc_default:
        from gpuworker.processors import image_transform

        image_transform.map_large_allocations = lambda: False  # type: ignore[assignment]
    corpus = work / "corpus"
    corpus.mkdir()
    subprocess.run(
        [sys.executable, __file__, "--make", case, str(corpus), *sys.argv[3:]], check=True
    )
    if case.startswith("text"):
        processor = "text-embedding"
        params = {"batch_size": 16, "batch_policy": "original"}
    else:
        processor = "image-transform"
        cap = args.cap or MAX_OUTPUT_PIXELS
        side = int(cap**0.5)
        params = (
            {
                "operation": "resize",
                "width": side,
                "height": side,
                "max_output_pixels": cap,
                "batch_size": 4,
            }
            if case == "image+cap"
            else {"operation": "convert", "format": "jpeg", "batch_size": 32}
            if case == "image+rawbig"
            else {"operation": "thumbnail", "width": 32, "height": 32, "batch_size": 16}
        )
    project = setup.project_for_user(name="bench")
    campaign, _ = setup.campaign_create(
        name=case.replace("+", "-"),
        processor=processor,
        project=project,
        input_folder=corpus,
        params=params,
    )
    started = time.perf_counter()
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    planning_s = time.perf_counter() - started
    planning_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    before = _rss_mb()
    batches = []
    for batch in Batch.objects.filter(campaign=campaign).order_by("pk"):
        t0 = time.perf_counter()
        assert run_batch(batch.pk) == "done"
        batches.append(round(time.perf_counter() - t0, 2))
    states = dict(
        Unit.objects.filter(campaign=campaign)
        .values_list("state")
        .annotate(n=__import__("django.db.models", fromlist=["Count"]).Count("pk"))
    )
    peak_mb = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    shutil.rmtree(corpus)  # hundreds of MB for image+rawbig
    return {
        "case": case,
        "planning_s": round(planning_s, 2),
        "planning_peak_mb": round(planning_peak),
        "rss_before_batches_mb": round(before),
        "peak_mb": peak_mb,
        "rss_after_batches_mb": round(_rss_mb()),
        "batch_seconds": batches,
        "units": states,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--big-mb", type=int, default=50)
    parser.add_argument("--texts", type=int, default=40)
    parser.add_argument("--images", type=int, default=5)
    parser.add_argument("--huge-side", type=int, default=8000)
    parser.add_argument("--raw-mpx", type=float, default=17.0)
    parser.add_argument("--raw-count", type=int, default=12)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument(
        "--cap", type=int, default=0, help="image+cap: this max_output_pixels, not the default"
    )
    parser.add_argument(
        "--glibc-default",
        action="store_true",
        help="leave glibc's mmap threshold as it is (gpuworker.memory.map_large_allocations)",
    )
    parser.add_argument("--child", default="")
    parser.add_argument("--make", nargs=2, metavar=("CASE", "FOLDER"))
    args = parser.parse_args()
    if args.make:
        make_corpus(args.make[0], Path(args.make[1]), args)
        return
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    rows = []
    options = [
        *("--big-mb", str(args.big_mb), "--texts", str(args.texts)),
        *("--images", str(args.images), "--huge-side", str(args.huge_side)),
        *("--raw-mpx", str(args.raw_mpx), "--raw-count", str(args.raw_count)),
        *(["--glibc-default"] if args.glibc_default else []),
        *(["--cap", str(args.cap)] if args.cap else []),
    ]
    for case in args.cases.split(","):
        for _ in range(args.runs):
            out = subprocess.run(
                [sys.executable, __file__, "--child", case, *options],
                capture_output=True,
                text=True,
            )
            if out.returncode:
                sys.exit(f"{case}: {out.stderr[-3000:]}")
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
    print(f"# {os.cpu_count()} cores; peak RSS of the child (ru_maxrss)")
    print(
        "| case | planning s | planning peak MB | RSS before batches MB | peak MB "
        "| peak over before MB | RSS after MB | batch s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(
            f"| {r['case']} | {r['planning_s']} | {r['planning_peak_mb']} | "
            f"{r['rss_before_batches_mb']} | {r['peak_mb']} | "
            f"{r['peak_mb'] - r['rss_before_batches_mb']:+} | {r['rss_after_batches_mb']} | "
            f"{', '.join(map(str, r['batch_seconds']))} |"
        )
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
