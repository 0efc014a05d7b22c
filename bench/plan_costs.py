"""Planning's cost measurement: the token count of every text of a campaign.

    DEBUG=0 .venv/bin/python bench/plan_costs.py --limit 3000 --rounds 3

`campaign run` with a length_grouped or token_budget policy first weighs every
pending unit (costs.measure_costs): for texts, the model's tokenizer over
each file. That runs before the first batch is sent, so the device waits for
it. This times it over the benchmark corpus (one file a text), the processor's
batch call (ProcessorSpec.costs: the tokenizer's batch call on a thread per
core) against a call a text (ProcessorSpec.cost), alternated, the costs reset
between runs, and checks that both give every unit the same cost.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    work = django_env.setup("bench-plan-costs-")
    from campaigns.models import Unit
    from campaigns.runs import costs, setup
    from campaigns.specs import processors as processor_specs

    texts = read_texts(args.corpus, args.limit)
    corpus = corpus_folder(work / "corpus", texts)
    project = setup.project_for_user(name="bench")
    campaign, _ = setup.campaign_create(
        name="plan-costs",
        processor="text-embedding",
        project=project,
        input_folder=corpus,
        params={"batch_policy": "token_budget"},
    )
    params = campaign.current_version.params
    spec = processor_specs.get_spec("text-embedding")
    one_by_one = dataclasses.replace(spec, costs=None)

    def timed(which) -> tuple[float, dict[int, int]]:
        Unit.objects.filter(campaign=campaign).update(cost=None)
        with mock.patch.object(costs, "get_spec", lambda _name: which):
            started = time.perf_counter()
            measured = costs.measure_costs(campaign=campaign, params=params)
            seconds = time.perf_counter() - started
        assert measured == len(texts), measured
        return seconds, dict(Unit.objects.filter(campaign=campaign).values_list("pk", "cost"))

    # The tokenizer and the files' pages loaded before anything is timed.
    timed(spec)
    print(
        f"# {len(texts)} texts, {os.cpu_count()} cores, "
        f"TOKENIZERS_PARALLELISM={os.environ.get('TOKENIZERS_PARALLELISM')}"
    )
    print("| round | a call a text, s | batch call on every core, s | × |")
    print("|---:|---:|---:|---:|")
    for round_ in range(1, args.rounds + 1):
        single_s, single = timed(one_by_one)
        batch_s, batched = timed(spec)
        assert single == batched, "the batch call weighed some text differently"
        print(f"| {round_} | {single_s:.3f} | {batch_s:.3f} | {single_s / batch_s:.1f} |")


if __name__ == "__main__":
    main()
