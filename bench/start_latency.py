"""How long the campaign page's Start keeps its request (start.campaign_start),
and how soon `campaign run` sends its first batch.

    DEBUG=0 .venv/bin/python bench/start_latency.py --units 60000 --rounds 2

A token_budget campaign over --units texts (the benchmark corpus's texts,
repeated with a number so each file differs; one file a text), past its
checkpoint. Start in a web request weighs (tokenizes) and plans the first
slice of the run in the request and leaves the rest to a `portal` worker
(campaigns.tasks.plan_campaign, not run here: the broker send is mocked).
`campaign run` plans every slice itself; its workers start once the first
slice's batches are sent. This times both with the first slice at
FIRST_SLICE_UNITS against a first slice of RUN_SLICE_UNITS (as before),
alternated, the units put back to pending and unweighed before each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import django_env  # noqa: E402
from bench.corpus import DEFAULT_CORPUS, corpus_folder, read_texts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--units", type=int, default=60_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--database-url", default="", help="emptied first: give one of its own")
    args = parser.parse_args()

    work = django_env.setup("bench-start-", args.database_url)
    from django.db import connection

    from campaigns.models import Batch, Campaign, Unit, UnitState
    from campaigns.runs import setup, start

    texts = read_texts(args.corpus, args.units)
    texts = [f"{texts[i % len(texts)]} ({i})" for i in range(args.units)]
    corpus = corpus_folder(work / "corpus", texts)
    campaign, _ = setup.campaign_create(
        name="start-latency",
        processor="text-embedding",
        project=setup.project_for_user(name="bench"),
        input_folder=corpus,
        params={"batch_policy": "token_budget"},
    )
    Campaign.objects.filter(pk=campaign.pk).update(checkpoint_after=0)
    campaign.refresh_from_db()
    units = Unit.objects.filter(campaign=campaign)

    def reset() -> None:
        units.update(state=UnitState.PENDING, batch=None, cost=None)
        Batch.objects.filter(campaign=campaign).delete()

    def press_start(first: int) -> tuple[float, int]:
        """The page's Start: the request's seconds, the units it queued."""
        reset()
        with (
            mock.patch.object(start, "FIRST_SLICE_UNITS", first),
            mock.patch.object(start.celery_app, "send_task"),
        ):
            started = time.perf_counter()
            start.campaign_start(campaign=campaign)
            seconds = time.perf_counter() - started
        return seconds, units.filter(state=UnitState.QUEUED).count()

    def run(first: int) -> tuple[float, float]:
        """`campaign run`: seconds until its first batch is sent, and in all."""
        reset()
        sent: list[float] = []
        with (
            mock.patch.object(start, "FIRST_SLICE_UNITS", first),
            mock.patch.object(
                start.celery_app,
                "send_task",
                side_effect=lambda *_a, **_k: sent.append(time.perf_counter()),
            ),
        ):
            started = time.perf_counter()
            start.campaign_run(campaign=campaign)
            seconds = time.perf_counter() - started
        return sent[0] - started, seconds

    press_start(start.FIRST_SLICE_UNITS)  # the tokenizer and the files' pages loaded first
    small_n, large_n = start.FIRST_SLICE_UNITS, start.RUN_SLICE_UNITS
    print(f"# {connection.vendor}, {args.units:,} texts, token_budget, 2,048 tokens a batch")
    print(
        "| round | first slice | Start's request, s | queued by it | "
        "`campaign run`: first batch sent after, s | whole run planned, s |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for round_ in range(1, args.rounds + 1):
        for first in (small_n, large_n):
            seconds, queued = press_start(first)
            first_sent, whole = run(first)
            print(
                f"| {round_} | {first:,} | {seconds:.2f} | {queued:,} | "
                f"{first_sent:.2f} | {whole:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
