"""The whole corpus by its units' costs: padded cost under each batching policy,
and the bytes its outputs will take on disk, weighed from a profile's outputs.
"""

from __future__ import annotations

import math
from collections import Counter

from campaigns.models import Campaign, Unit
from campaigns.runs.batching import plan_batches
from campaigns.specs.processors import get_spec


def padded_cost(spec_padding: str, costs: list[int]) -> int:
    if not costs:
        return 0
    return len(costs) * max(costs) if spec_padding == "longest" else sum(costs)


def corpus_costs(*, campaign: Campaign) -> list[tuple[int, int]]:
    return [
        (pk, cost or 1)
        for pk, cost in Unit.objects.filter(campaign=campaign)
        .order_by("pk")
        .values_list("pk", "cost")
        .iterator(chunk_size=10_000)
    ]


def policy_comparison(
    *, campaign: Campaign, params: dict, batch_size: int, token_budget: int | None = None
) -> list[dict]:
    """Real and padded cost of the whole corpus under each policy at this batch size."""
    spec = get_spec(campaign.processor)
    pairs = corpus_costs(campaign=campaign)
    cost_of = dict(pairs)
    real = sum(cost_of.values())
    rows = []
    for policy in ("original", "length_grouped", "token_budget"):
        planned = {
            **params,
            "batch_policy": policy,
            "batch_size": batch_size,
            "token_budget": token_budget or params.get("token_budget") or batch_size,
        }
        batches = list(plan_batches(pairs, planned))
        padded = sum(padded_cost(spec.padding, [cost_of[pk] for pk in b]) for b in batches)
        rows.append(
            {
                "policy": policy,
                "batches": len(batches),
                "real": real,
                "padded": padded,
                "padding": round(padded / real, 3) if real else None,
            }
        )
    return rows


# Outputs are weighed per cost bucket (powers of two): an image's thumbnail, a
# text's token list grow with the input; the corpus's own mix sets the total.
def cost_bucket(cost: int) -> int:
    return int(math.log2(max(1, cost)))


def output_bytes_estimate(*, steps: list[dict], costs: list[int]) -> int:
    """Bytes on disk for these unit costs, from the outputs the profile wrote.

    Each written output's size is kept with its input's cost; the mean per
    cost bucket applies to the corpus's units of that bucket (the nearest
    measured bucket where the sample had none). A profile without them (a
    training one, an old one) falls back to the mean per output written.
    """
    per_bucket: dict[int, list[int]] = {}
    for step in steps:
        for cost, size in step.get("outputs") or ():
            per_bucket.setdefault(cost_bucket(cost), []).append(size)
    if not per_bucket:
        each = [s["output_bytes_per_item"] for s in steps if s.get("output_bytes_per_item")]
        return int(sum(each) / len(each) * len(costs)) if each else 0
    means = {bucket: sum(sizes) / len(sizes) for bucket, sizes in per_bucket.items()}
    total = 0.0
    for bucket, count in Counter(cost_bucket(c) for c in costs).items():
        nearest = min(means, key=lambda b: (abs(b - bucket), b))
        total += means[nearest] * count
    return int(total)
