"""Audio transformation: our audio-transform campaign beside a plain loop of
soundfile and soxr over the same clips, in one run.

    DEBUG=0 .venv/bin/python bench/audio.py --clips 200 --seconds 10

The clips are tones with noise made here (44.1 kHz stereo FLAC), each made
into 16 kHz mono FLAC. The plain loop is what a user writes first: read,
mean of the channels, `soxr.resample`, write, one clip after the other. Ours
is a campaign over the same folder whose batches run through the worker's
path (`run_batch`: claim; read, check and transform each clip in the reader
threads; write each output, decode it back and check it; record).
Reported: clips/s and seconds of audio a second, wall time; rounds alternate
the two and the best of each is kept. Results go in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import django_env  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--clips", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    work = django_env.setup("bench-audio-")
    import numpy as np
    import soundfile
    import soxr

    from campaigns.models import Batch
    from campaigns.runs import setup, start
    from gpuworker.runner.batch import run_batch

    logging.getLogger("gpuworker").setLevel(logging.WARNING)
    logging.getLogger("campaigns.runs.recording").setLevel(logging.WARNING)
    clips = work / "clips"
    clips.mkdir()
    rng = np.random.default_rng(0)
    rate = 44100
    t = np.arange(round(args.seconds * rate)) / rate
    for i in range(args.clips):
        tone = 0.3 * np.sin(2 * np.pi * (200 + i) * t)
        left, right = tone + 0.05 * rng.standard_normal(t.size), tone * 0.8
        samples = np.stack([left, right], axis=1).astype(np.float32)
        soundfile.write(clips / f"clip-{i:04d}.flac", samples, rate, format="FLAC")
    names = sorted(p.name for p in clips.iterdir())
    project = setup.project_for_user(name="bench")

    def plain() -> float:
        out = work / "plain"
        out.mkdir(exist_ok=True)
        started = time.perf_counter()
        for name in names:
            samples, source_rate = soundfile.read(clips / name, dtype="float32", always_2d=True)
            mono = samples.mean(axis=1)
            made = soxr.resample(mono, source_rate, 16000, quality="HQ")
            soundfile.write(out / name, made, 16000, format="FLAC", subtype="PCM_16")
        return time.perf_counter() - started

    runs = {"ours": 0}

    def ours() -> float:
        runs["ours"] += 1
        campaign, _ = setup.campaign_create(
            checkpoint_after=0,
            name=f"audio-{runs['ours']}",
            processor="audio-transform",
            project=project,
            input_folder=clips,
            params={"format": "flac", "sample_rate": 16000, "batch_size": args.batch_size},
        )
        start.campaign_run(campaign=campaign)
        pks = list(
            Batch.objects.filter(campaign=campaign).order_by("pk").values_list("pk", flat=True)
        )
        started = time.perf_counter()
        for pk in pks:
            run_batch(pk)
        seconds = time.perf_counter() - started
        done = campaign.units.filter(state__in=("succeeded", "needs_review")).count()
        if done != len(names):
            raise SystemExit(f"ours: {done} of {len(names)} clips done")
        return seconds

    contenders = {"plain soundfile + soxr loop": plain, "audio-transform campaign": ours}
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            seconds = run()
            best[name] = min(best.get(name, seconds), seconds)
            print(f"  {name}: {seconds:.2f} s", flush=True)
    audio = args.clips * args.seconds
    print(
        f"\n{args.clips} clips of {args.seconds:g} s, 44.1 kHz stereo FLAC -> 16 kHz mono FLAC, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores\n"
    )
    reference = best["plain soundfile + soxr loop"]
    print("| contender | s | clips/s | audio s/s | × plain loop |")
    print("|---|---|---|---|---|")
    for name, seconds in best.items():
        print(
            f"| {name} | {seconds:.2f} | {args.clips / seconds:.1f} | {audio / seconds:,.0f} "
            f"| {reference / seconds:.2f} |"
        )


if __name__ == "__main__":
    main()
