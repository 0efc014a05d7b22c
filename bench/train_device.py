"""A training on this machine's device: its memory profile, then a short fine-tune.

    python bench/train_device.py --pairs 300 --max-batch 16             # CPU rehearsal
    python bench/train_device.py --pairs 4000 --max-batch 512 --precision bfloat16   # CUDA

Pairs come from the benchmark corpus: a docstring's first line (anchor) and the
rest of it (positive). Prints the training profile (weights, gradients,
optimizer states, activations, peak allocated/reserved, seconds per step per
batch size), the chosen batch and its estimate, then trains one epoch at the
chosen size and prints examples/s and the held-out metrics before and after.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import django_env  # noqa: E402

DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "corpus_stdlib_docstrings_5000.jsonl.gz"
MiB = 1024 * 1024


def pairs_from(corpus: Path, limit: int):
    with gzip.open(corpus, "rt", encoding="utf-8") as fh:
        for line in fh:
            text = json.loads(line)["text"].strip()
            first, _, rest = text.partition("\n")
            if len(first) > 10 and len(rest.strip()) > 40:
                yield {"anchor": first.strip(), "positive": rest.strip()}
                limit -= 1
                if not limit:
                    return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--precision", default="float32")
    parser.add_argument("--budget-mb", type=int, default=None)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    work = django_env.setup("bench-train-")
    from campaigns.models import Training
    from campaigns.profiles.report import profile_report
    from campaigns.profiles.services import profile_create
    from campaigns.runs import setup
    from gpuworker.profiler import profile_run
    from gpuworker.training_tasks import run_training

    folder = work / "pairs"
    folder.mkdir()
    for i, pair in enumerate(pairs_from(args.corpus, args.pairs)):
        (folder / f"pair-{i:05d}.json").write_text(json.dumps(pair), encoding="utf-8")
    params = {"max_tokens": args.max_tokens, "precision": args.precision, "checkpoint_every": 10**6}
    campaign, _ = setup.campaign_create(
        name="train-bench",
        processor="text-adaptation",
        project=setup.project_for_user(name="bench"),
        input_folder=folder,
        params=params,
        checkpoint_after=0,
        holdout_share=0.05,
    )
    profile = profile_create(
        campaign=campaign,
        max_batch_size=args.max_batch,
        memory_budget=args.budget_mb * MiB if args.budget_mb else None,
    )
    profile_run(profile.pk)
    profile.refresh_from_db()
    report = profile_report(profile)
    lines = [
        f"# {campaign.units.count()} pairs, max_tokens {args.max_tokens}, {args.precision}, "
        f"{profile.device}, budget {profile.memory_budget / MiB:.0f} MiB, margin 20%",
        "| batch | weights MiB | gradients MiB | optimizer MiB | activations MiB | "
        "peak allocated MiB | peak reserved MiB | s/step | examples/s | fits |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for s in report["steps"]:
        lines.append(
            f"| {s['batch_size']} | {s['weights'] / MiB:.0f} "
            f"| {(s.get('gradients') or 0) / MiB:.0f} "
            f"| {(s.get('optimizer') or 0) / MiB:.0f} | {(s.get('activations') or 0) / MiB:.0f} "
            f"| {s['peak_allocated'] / MiB:.0f} | {s['peak_reserved'] / MiB:.0f} "
            f"| {s.get('step_s') or 'OOM'} | {s.get('items_per_s') or '—'} | "
            f"{'yes' if s['fits'] else 'no'} |"
        )
    lines.append(f"chosen batch {report['chosen_batch_size']}; leak check: {report['leak']}")
    if report["estimate"]:
        lines.append("estimate: " + " / ".join(report["estimate"]["reasoning"]))
    if report["error"]:
        lines.append(f"error: {report['error']}")
    print("\n".join(lines), flush=True)

    if report["chosen_batch_size"]:
        version = setup.version_create(
            campaign=campaign,
            params={**campaign.current_version.params, "batch_size": report["chosen_batch_size"]},
        )
        training = Training.objects.create(campaign=campaign, version=version)
        started = time.perf_counter()
        state = run_training(training.pk)
        seconds = time.perf_counter() - started
        training.refresh_from_db()
        last = training.checkpoints.order_by("-step").first()
        trained = f"{training.examples / seconds:.1f} examples/s over {seconds:.1f} s incl. loading"
        lines.append(
            f"training: {state}, {training.step} steps of {report['chosen_batch_size']}, "
            f"{trained}; "
            f"held-out before {training.base_metrics}, after "
            f"{last.linkage['metrics'] if last else None}"
        )
        print(lines[-1])
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "train_device.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
