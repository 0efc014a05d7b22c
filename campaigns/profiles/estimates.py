"""A profile's measured steps made into an Estimate of the whole corpus.

A least-squares model of batch time against padded cost, applied to the
batches the corpus's own costs give; then the memory tiers and, from the
registered advisor (campaigns/profiles/advice.py), the hours on every card of
the catalog and the rental plan.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from django.db import transaction

from campaigns.models import Estimate, Profile
from campaigns.profiles.advice import advisor
from campaigns.profiles.corpus import corpus_costs, output_bytes_estimate, padded_cost
from campaigns.profiles.report import CAP_REACHED, cap_reached
from campaigns.profiles.tiers import memory_reasons, memory_tier, tier_batches
from campaigns.runs.batching import batch_policy, plan_batches
from campaigns.specs.processors import get_spec


@dataclass(frozen=True)
class ThroughputModel:
    """Seconds of one batch = fixed + per_cost × padded cost, fitted on the steps."""

    fixed: float
    per_cost: float
    per_item: float  # reading, decoding, writing and checking one output

    def batch_seconds(self, padded: int) -> float:
        return self.fixed + self.per_cost * padded


def fit_throughput(steps: list[dict]) -> ThroughputModel:
    measured: dict[int, list[float]] = {}
    for step in steps:
        if step.get("oom") or step.get("error") or not step.get("padded"):
            continue
        if step.get("compute_s") is not None and not math.isnan(step["compute_s"]):
            measured.setdefault(step["padded"], []).append(step["compute_s"])
    # One point per padded size, its median: a repeated step (the leak check
    # runs the chosen size four more times) steadies the fit against noise.
    points = [(x, sorted(ys)[len(ys) // 2]) for x, ys in sorted(measured.items())]
    if not points:
        raise ValueError("no measured step to estimate from")
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    var = sum((x - mean_x) ** 2 for x, _ in points)
    if var == 0:
        per_cost, fixed = mean_y / mean_x, 0.0
    else:
        per_cost = sum((x - mean_x) * (y - mean_y) for x, y in points) / var
        fixed = mean_y - per_cost * mean_x
        if per_cost <= 0:
            per_cost, fixed = mean_y / mean_x, 0.0
        fixed = max(0.0, fixed)
    per_item_values = sorted(
        (s["prepare_s"] + s["write_s_per_item"] * s["batch_size"]) / s["batch_size"]
        for s in steps
        if s.get("fits") and s.get("batch_size") and "prepare_s" in s
    )
    per_item = per_item_values[len(per_item_values) // 2] if per_item_values else 0.0
    return ThroughputModel(fixed=fixed, per_cost=per_cost, per_item=per_item)


@transaction.atomic
def estimate_build(*, profile: Profile) -> Estimate:
    """The whole corpus from the profile's steps, on its own cost distribution."""
    campaign = profile.campaign
    spec = get_spec(campaign.processor)
    params = profile.version.params
    model = fit_throughput(profile.steps)
    pairs = corpus_costs(campaign=campaign)
    cost_of = dict(pairs)
    heaviest_cost = max((cost_of.get(pk, 1) for pk in profile.heavy), default=1)
    batches_at: dict[int, int] = {}

    def hours_at(size: int) -> tuple[float, float]:
        """(hours, of which reading and writing) for the corpus at this batch size."""
        planned = {**params, "batch_size": size, "token_budget": size * heaviest_cost}
        compute, count = 0.0, 0
        for batch in plan_batches(pairs, planned):
            compute += model.batch_seconds(padded_cost(spec.padding, [cost_of[pk] for pk in batch]))
            count += 1
        batches_at[size] = count
        io = model.per_item * len(pairs)
        return (compute + io) / 3600, io / 3600

    size = profile.chosen_batch_size
    hours, io_hours = hours_at(size)
    # The naive figure, kept beside the estimate: the mean over the sweeps' batches, which
    # over-represent the heaviest inputs (the unusual and outputs steps aside).
    measured = [
        s
        for s in profile.steps
        if s.get("fits") and s.get("phase") in ("count", "heaviest", "leak check")
    ]
    per_item_naive = sum(s["compute_s"] for s in measured) / max(
        1, sum(s["batch_size"] for s in measured)
    )
    return estimate_from_hours(
        profile=profile,
        units=len(pairs),
        hours=hours,
        io_hours=io_hours,
        hours_naive=per_item_naive * len(pairs) / 3600 + io_hours,
        reason=f"{batches_at[size]} batches, policy {batch_policy(params)}",
        hours_at=hours_at,
        costs=[cost for _, cost in pairs],
    )


def estimate_from_hours(
    *,
    profile: Profile,
    units: int,
    hours: float,
    hours_naive: float,
    reason: str,
    io_hours: float = 0.0,
    hours_at: Callable[[int], tuple[float, float]] | None = None,
    costs: list[int] | None = None,
    assumed: list[str] | None = None,
) -> Estimate:
    """Hours on the measured device → projections on every card, memory tier, rental plan.

    `hours` is the whole at the chosen batch size, `io_hours` the part of it
    spent reading, decoding, writing and checking: a faster card shortens the
    compute only. `hours_at(size)` prices another batch size the same way,
    for a tier that holds only a smaller batch; without it such a tier's
    cards are left out of the plan. `assumed`: what the hours took besides
    the measurement, said after the first reason.
    """
    chosen = profile.chosen_batch_size
    priced: dict[int, tuple[float, float]] = {chosen: (hours, io_hours)}

    def price(size: int | None) -> tuple[float, float] | None:
        if size and size not in priced and hours_at is not None:
            priced[size] = hours_at(size)
        return priced.get(size) if size else None

    tiers = tier_batches(profile)
    advice = advisor().rental_advise(
        device=profile.device,
        tier_batch={row["tier_gb"]: row["batch_size"] for row in tiers},
        hours_at=price,
    )
    plan = advice.plan
    size = plan["batch_size"] if plan else chosen
    peak_of = {row["batch_size"]: row["peak_reserved"] for row in tiers if row["batch_size"]}
    peak = peak_of.get(size) or profile.chosen_peak_reserved or 0
    tier = memory_tier(peak, profile.margin)
    hours_plan, io_plan = priced.get(size, (hours, io_hours))
    io_part = f", of which {io_hours:.2f} h reading and writing" if io_hours else ""
    reasons = [
        f"measured on {profile.device}: {hours:.2f} h for {units} units at batch {chosen} "
        f"({reason}){io_part}; other cards are projections from relative throughput "
        f"({advice.speed_source}): their compute scaled, the reading and writing not",
        *(assumed or []),
        *memory_reasons(profile, tiers),
        *advice.reasons,
    ]
    if cap_reached(profile):
        reasons.append(
            f"batch {chosen} is the largest batch the profile tried: {CAP_REACHED}; "
            "a larger batch would change these hours and the plan"
        )
    Estimate.objects.filter(profile=profile).delete()
    return Estimate.objects.create(
        profile=profile,
        version=profile.version,
        device=profile.device,
        units=units,
        batch_size=size,
        hours_measured_device=hours_plan,
        hours_naive=hours_naive,
        peak_memory=peak,
        memory_tier_gb=tier or 0,  # 0: no tier holds even the smallest measured batch
        output_bytes=output_bytes_estimate(
            steps=profile.steps, costs=costs if costs is not None else [1] * units
        ),
        projections=advice.projections,
        gpu_name=plan["gpu"] if plan else "",
        quantity=plan["quantity"] if plan else None,
        duration_days=plan["days"] if plan else None,
        reasoning=reasons,
    )
