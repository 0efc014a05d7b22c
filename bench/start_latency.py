"""How long the campaign page's Start keeps its request: services.campaign_start.

    DEBUG=0 .venv/bin/python bench/start_latency.py --units 60000 --rounds 2

A token_budget campaign over --units texts (the benchmark corpus's texts,
repeated with a number so each file differs; one file a text), past its
checkpoint. Start in a web request weighs (tokenizes) and plans the first
slice of the run in the request and leaves the rest to a `portal` worker
(campaigns.tasks.plan_campaign, not run here: the broker send is mocked).
This times the request's part with the first slice at START_SLICE_UNITS
against a first slice of RUN_SLICE_UNITS (what the request planned before),
alternated, the units put back to pending and unweighed between rounds.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench.corpus import DEFAULT_CORPUS, corpus_folder, read_texts  # noqa: E402
from bench.django_env import setup  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--units", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--database-url", default="", help="emptied first: give one of its own")
    args = parser.parse_args()

    work = setup("bench-start-", args.database_url)
    from django.db import connection

    from campaigns import services
    from campaigns.models import Batch, Campaign, Unit, UnitState

    texts = read_texts(args.corpus, args.units)
    texts = [f"{texts[i % len(texts)]} ({i})" for i in range(args.units)]
    corpus = corpus_folder(work / "corpus", texts)
    campaign, _ = services.campaign_create(
        name="start-latency",
        processor="text-embedding",
        project=services.project_for_user(name="bench"),
        input_folder=corpus,
        params={"batch_policy": "token_budget"},
    )
    Campaign.objects.filter(pk=campaign.pk).update(checkpoint_after=0)
    campaign.refresh_from_db()
    units = Unit.objects.filter(campaign=campaign)

    def start(first: int) -> tuple[float, int]:
        units.update(state=UnitState.PENDING, batch=None, cost=None)
        Batch.objects.filter(campaign=campaign).delete()
        with (
            mock.patch.object(services, "START_SLICE_UNITS", first),
            mock.patch.object(services.celery_app, "send_task"),
        ):
            started = time.perf_counter()
            services.campaign_start(campaign=campaign)
            seconds = time.perf_counter() - started
        return seconds, units.filter(state=UnitState.QUEUED).count()

    start(services.START_SLICE_UNITS)  # the tokenizer and the files' pages loaded first
    print(f"# {connection.vendor}, {args.units:,} texts, token_budget, 2,048 tokens a batch")
    print(
        f"| round | first slice {services.START_SLICE_UNITS:,}, s | queued | "
        f"first slice {services.RUN_SLICE_UNITS:,}, s | queued |"
    )
    print("|---:|---:|---:|---:|---:|")
    for round_ in range(1, args.rounds + 1):
        small, small_queued = start(services.START_SLICE_UNITS)
        large, large_queued = start(services.RUN_SLICE_UNITS)
        print(
            f"| {round_} | {small:.2f} | {small_queued:,} | {large:.2f} | {large_queued:,} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
