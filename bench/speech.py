"""Speech to text: our speech-to-text campaign beside a plain loop of the
model's own `generate` over the same files, in one run.

    DEBUG=0 .venv/bin/python bench/speech.py --files 24

The model is a Whisper of width `--width` with random weights (made here and
saved as a user's folder: none can be downloaded here), so the figures say
what the path around the model costs, not how fast a real Whisper is. The
files are noise of 5–50 s (16 kHz mono FLAC). The plain loop reads each file,
makes its features whole and calls `generate(..., return_timestamps=True,
return_segments=True)`, one file after another. Ours is a campaign over the
same folder whose batches run through `run_batch` (files of one window read
together, longer ones alone; each transcript written, read back, checked and
recorded). Rounds alternate; best of each.
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
    parser.add_argument("--files", type=int, default=24)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()

    work = django_env.setup("bench-speech-")
    import numpy as np
    import soundfile
    import torch
    from transformers import AutoModelForSpeechSeq2Seq, AutoProcessor

    from campaigns.models import Batch
    from campaigns.runs import setup, start
    from gpuworker.runner.batch import run_batch
    from tests.speech import tiny_whisper

    logging.getLogger("gpuworker").setLevel(logging.WARNING)
    logging.getLogger("campaigns.runs.recording").setLevel(logging.WARNING)
    model_folder = tiny_whisper(work / "whisper")
    files = work / "calls"
    files.mkdir()
    rng = np.random.default_rng(0)
    seconds = [5 + (i * 7) % 46 for i in range(args.files)]
    for i, length in enumerate(seconds):
        noise = (0.1 * rng.standard_normal(length * 16000)).astype(np.float32)
        soundfile.write(files / f"call-{i:03d}.flac", noise, 16000, format="FLAC")
    names = sorted(p.name for p in files.iterdir())
    processor = AutoProcessor.from_pretrained(model_folder, local_files_only=True)
    model = AutoModelForSpeechSeq2Seq.from_pretrained(model_folder, local_files_only=True).eval()
    project = setup.project_for_user(name="bench")

    def plain() -> float:
        started = time.perf_counter()
        for name in names:
            samples, rate = soundfile.read(files / name, dtype="float32")
            longest = len(samples) > 30 * rate
            features = processor.feature_extractor(
                [samples],
                sampling_rate=rate,
                return_tensors="pt",
                truncation=False,
                padding="longest" if longest else "max_length",
                return_attention_mask=True,
            )
            with torch.inference_mode():
                model.generate(
                    features.input_features,
                    attention_mask=features.attention_mask,
                    language="en",
                    task="transcribe",
                    return_timestamps=True,
                    return_segments=True,
                    max_new_tokens=128,
                )
        return time.perf_counter() - started

    runs = {"ours": 0}

    def ours() -> float:
        runs["ours"] += 1
        campaign, _ = setup.campaign_create(
            checkpoint_after=0,
            name=f"speech-{runs['ours']}",
            processor="speech-to-text",
            project=project,
            input_folder=files,
            params={"model": str(model_folder), "language": "en", "batch_size": args.batch_size},
        )
        start.campaign_run(campaign=campaign)
        pks = list(
            Batch.objects.filter(campaign=campaign).order_by("pk").values_list("pk", flat=True)
        )
        started = time.perf_counter()
        for pk in pks:
            run_batch(pk)
        took = time.perf_counter() - started
        done = campaign.units.filter(state__in=("succeeded", "needs_review")).count()
        if done != len(names):
            raise SystemExit(f"ours: {done} of {len(names)} files done")
        return took

    contenders = {"plain generate loop": plain, "speech-to-text campaign": ours}
    best: dict[str, float] = {}
    for _ in range(args.rounds):
        for name, run in contenders.items():
            took = run()
            best[name] = min(best.get(name, took), took)
            print(f"  {name}: {took:.2f} s", flush=True)
    audio = sum(seconds)
    print(
        f"\n{args.files} files, {audio} s of audio, tiny random Whisper, "
        f"torch {torch.__version__}, "
        f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores\n"
    )
    reference = best["plain generate loop"]
    print("| contender | s | files/s | audio s/s | × plain loop |")
    print("|---|---|---|---|---|")
    for name, took in best.items():
        print(
            f"| {name} | {took:.2f} | {args.files / took:.2f} | {audio / took:,.0f} "
            f"| {reference / took:.2f} |"
        )


if __name__ == "__main__":
    main()
