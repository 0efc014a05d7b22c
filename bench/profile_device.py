"""The batch-size profiler on this machine's device, on the benchmark corpus.

    python bench/profile_device.py --limit 3000               # CUDA: budget = device memory
    python bench/profile_device.py --limit 300 --budget-mb 3000 --max-batch 64   # CPU
    python bench/profile_device.py --limit 600 --max-batch 64 --run   # + estimate vs a real run

Prints each step (phase, batch size, items/s, peak allocated and reserved),
the chosen batch size with its margin, the leak check and the estimate, as
`campaign profile --json` would; writes the report to --out as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import django_env  # noqa: E402
from bench.corpus import DEFAULT_CORPUS, corpus_folder, read_texts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--max-batch", type=int, default=4096)
    parser.add_argument("--budget-mb", type=int, default=None)
    parser.add_argument("--margin", type=float, default=0.2)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--run",
        action="store_true",
        help="then run the whole corpus at the chosen size in this process and "
        "compare its wall time with the estimate",
    )
    args = parser.parse_args()

    work = django_env.setup("bench-profile-")
    # Each step as it ends: on the first H200 run the whole profile outlasted
    # its 90 s bound and, printing only at the end, left nothing.
    import logging

    steps = logging.StreamHandler(sys.stdout)
    steps.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
    logging.getLogger("gpuworker.profiler").addHandler(steps)
    logging.getLogger("gpuworker.profiler").setLevel(logging.DEBUG)
    logging.getLogger("gpuworker.profiler").propagate = False  # once, not again as JSON
    from campaigns.profiles.report import profile_report
    from campaigns.profiles.services import profile_create
    from campaigns.runs import setup
    from gpuworker.profiler import profile_run

    texts = read_texts(args.corpus, args.limit)
    corpus = corpus_folder(work / "corpus", texts)
    campaign, _ = setup.campaign_create(
        checkpoint_after=0,  # measuring speed: no stop for a spot check
        name="profile-bench",
        processor="text-embedding",
        project=setup.project_for_user(name="bench"),
        input_folder=corpus,
        params={"max_tokens": args.max_tokens, "dtype": args.dtype},
    )
    profile = profile_create(
        campaign=campaign,
        margin=args.margin,
        memory_budget=args.budget_mb * 1024 * 1024 if args.budget_mb else None,
        max_batch_size=args.max_batch,
    )
    profile_run(profile.pk)
    profile.refresh_from_db()
    report = profile_report(profile)
    mib = 1024 * 1024
    print(f"# {len(texts)} texts, max_tokens {args.max_tokens}, {args.dtype}, {profile.device}")
    print(f"budget {report['memory_budget'] / mib:.0f} MiB, margin {args.margin:.0%}")
    print("| phase | batch | items/s | tokens/s | peak allocated MiB | peak reserved MiB | fits |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for s in report["steps"]:
        print(
            f"| {s['phase']} | {s['batch_size']} | {s['items_per_s'] or 'OOM'} | "
            f"{s['tokens_per_s'] or '—'} | {s['peak_allocated'] / mib:.0f} | "
            f"{s['peak_reserved'] / mib:.0f} | {'yes' if s['fits'] else 'no'} |"
        )
    print(f"chosen batch size: {report['chosen_batch_size']}; leak check: {report['leak']}")
    if report["estimate"]:
        print(json.dumps(report["estimate"], indent=1, default=str))
    if report["error"]:
        print("error:", report["error"])
    if args.run and report["estimate"]:
        print(compare_with_a_run(campaign, profile))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile_device.json").write_text(json.dumps(report, indent=1, default=str))


def compare_with_a_run(campaign, profile) -> str:
    """Run every unit at the chosen size, as a worker would, and time it."""
    import time
    from unittest import mock

    from campaigns.models import Batch
    from campaigns.runs import setup, start
    from gpuworker.runner.batch import run_batch

    setup.version_create(
        campaign=campaign,
        params={**campaign.current_version.params, "batch_size": profile.chosen_batch_size},
    )
    started = time.perf_counter()
    with mock.patch.object(start.celery_app, "send_task"):
        start.campaign_run(campaign=campaign)
    queued = Batch.objects.filter(campaign=campaign, state=Batch.State.QUEUED).order_by("pk")
    for pk in queued.values_list("pk", flat=True):
        run_batch(pk)
    real = time.perf_counter() - started
    estimated = profile.estimate.hours_measured_device * 3600
    return (
        f"estimate vs a real run at batch {profile.chosen_batch_size}: "
        f"estimated {estimated:.1f} s, real {real:.1f} s (estimate/real {estimated / real:.2f})"
    )


if __name__ == "__main__":
    main()
