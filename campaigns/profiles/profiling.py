"""Profiles and estimates, the parts without torch: the sample, the policies, the plan.

The measuring itself is gpuworker/profiler.py. Here: which units a profile
runs on (ordinary ones at random plus the heaviest, the unusual shapes and
those that failed before), how each batching policy would pad the whole
corpus, and how the measured steps become an estimate for the corpus and a
rental plan.
"""

from __future__ import annotations

import datetime as dt
import heapq
import logging
import math
import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.db.models import Q, QuerySet
from django.utils import timezone

from campaigns.models import (
    INPUT_ERRORS,
    Campaign,
    ErrorClass,
    Estimate,
    ParameterVersion,
    Profile,
    Unit,
    UnitState,
)
from campaigns.runs.batching import batch_policy, plan_batches
from campaigns.runs.costs import measure_costs
from campaigns.specs.processors import get_spec
from campaigns.storage.paths import resolve_input

log = logging.getLogger(__name__)

TIERS_GB = (24, 48, 80)
GiB = 1024**3

# --- the sample ---------------------------------------------------------------

#: Failures of a run, not of the input: the input reads, but the batch it was
#: in ran out of memory or time, or the model raised. Heaviest candidates.
RUN_FAILURES = (ErrorClass.OUT_OF_MEMORY, ErrorClass.TIMEOUT, ErrorClass.PROCESSING_ERROR)
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"})
# Wider than 2:1 or taller than 1:2: a shape worth its own step (a classifier
# that resizes the shorter side makes a long strip of a panorama).
UNUSUAL_ASPECT = 2.0
# Image headers read at sample time, at most: a campaign of millions of images
# is scanned on a seeded random subset of this many (a manifest's width and
# height columns, when it has them, are read for every unit at no cost).
DIMENSION_SCAN_LIMIT = 20_000
SHAPE_KINDS = ("widest", "tallest")


def sample_build(
    *,
    campaign: Campaign,
    size: int = 48,
    heavy: int = 12,
    failed: int = 4,
    unusual: int = 2,
    seed: int = 0,
    version: ParameterVersion | None = None,
) -> tuple[list[int], list[int]]:
    """Unit ids of the sample and, among them, of the heaviest.

    Ordinary units at random, plus the hard ones: the heaviest by cost (the
    inputs that set the memory a batch needs) and those a run already failed
    for memory, time or a model error (whatever their cost); the unusual ones
    (`unusual_units`); and a few that failed validation before (they must fail
    cleanly, not take the profile down). Costs are measured first for units
    that have none, whatever their state.
    """
    version = version or campaign.current_version
    measure_costs(campaign=campaign, params=version.params, pending_only=False)
    # The holdout stays out of profiling and tuning: it judges them afterwards.
    units = Unit.objects.filter(campaign=campaign, holdout=False)
    readable = units.exclude(state=UnitState.FAILED, error_class__in=INPUT_ERRORS)
    heaviest = list(readable.order_by("-cost", "pk").values_list("pk", flat=True)[:heavy])
    failed_in_run = readable.filter(state=UnitState.FAILED, error_class__in=RUN_FAILURES)
    for pk in failed_in_run.order_by("-cost", "pk").values_list("pk", flat=True)[:failed]:
        if pk not in heaviest:
            heaviest.append(pk)
    failed_before = list(
        units.filter(state=UnitState.FAILED, error_class__in=INPUT_ERRORS)
        .order_by("pk")
        .values_list("pk", flat=True)[:failed]
    )
    odd = unusual_units(campaign=campaign, units=readable, each=unusual, seed=seed)
    taken = set(heaviest) | set(failed_before) | {pk for ids in odd.values() for pk in ids}
    # Ids only, in one query: a campaign may hold millions of units.
    ordinary = [pk for pk in readable.values_list("pk", flat=True) if pk not in taken]
    picked = random.Random(seed).sample(ordinary, min(size, len(ordinary)))
    return sorted(taken.union(picked)), heaviest


def unusual_units(
    *, campaign: Campaign, units: QuerySet[Unit], each: int = 2, seed: int = 0
) -> dict[str, list[int]]:
    """Units at the extremes the heaviest-by-cost list misses, by kind.

    widest / tallest: the most extreme aspect ratios (wider than 2:1, taller
    than 1:2), from the unit's metadata (width and height columns of a
    manifest) or the image header; lightest: the lowest cost; longest /
    shortest: the largest and smallest files (texts capped at max_tokens tie
    in cost; their length in bytes does not). A unit is listed under the
    first kind that claims it, in that order.
    """
    if each <= 0:
        return {}
    kinds: dict[str, list[int]] = {}
    kinds["widest"], kinds["tallest"] = _shape_extremes(
        campaign=campaign, units=units, each=each, seed=seed
    )
    kinds["lightest"] = list(units.order_by("cost", "pk").values_list("pk", flat=True)[:each])
    sized = units.filter(size__isnull=False)
    kinds["longest"] = list(sized.order_by("-size", "pk").values_list("pk", flat=True)[:each])
    kinds["shortest"] = list(sized.order_by("size", "pk").values_list("pk", flat=True)[:each])
    claimed: set[int] = set()
    found = {}
    for kind, ids in kinds.items():
        ids = [pk for pk in ids if pk not in claimed]
        claimed.update(ids)
        if ids:
            found[kind] = ids
    return found


def unit_dimensions(root: Path, source_path: str, metadata: dict | None) -> tuple[int, int] | None:
    """Width and height from the unit's metadata, else from an image's header."""
    dims = _metadata_dimensions(metadata)
    if dims is not None or Path(source_path).suffix.lower() not in IMAGE_SUFFIXES:
        return dims
    from campaigns.intake.images import open_image  # Pillow, only where images are measured

    try:
        with open_image(resolve_input(root, source_path), None) as image:
            width, height = image.size  # the header only: no pixel is decoded
    except (OSError, ValueError, SyntaxError):
        return None  # the worker classifies it; it has no shape to offer here
    return (width, height) if width > 0 and height > 0 else None


def _metadata_dimensions(metadata: dict | None) -> tuple[int, int] | None:
    if not metadata:
        return None
    try:
        width, height = int(float(metadata["width"])), int(float(metadata["height"]))
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return (width, height) if width > 0 and height > 0 else None


def _shape_extremes(
    *, campaign: Campaign, units: QuerySet[Unit], each: int, seed: int
) -> tuple[list[int], list[int]]:
    root = Path(campaign.input_root)
    wide: list[tuple[float, int]] = []  # bounded min-heaps of (ratio, -pk)
    tall: list[tuple[float, int]] = []

    def offer(pk: int, dims: tuple[int, int] | None) -> None:
        if dims is None:
            return
        width, height = dims
        for heap, ratio in ((wide, width / height), (tall, height / width)):
            if ratio >= UNUSUAL_ASPECT:
                heapq.heappush(heap, (ratio, -pk))
                if len(heap) > each:
                    heapq.heappop(heap)  # ties keep the smaller pk: deterministic

    # Reservoir sampling (seeded) bounds the header reads on a large corpus.
    rng, seen, to_read = random.Random(seed), 0, []
    rows = units.order_by("pk").values_list("pk", "source_path", "metadata")
    for pk, source_path, metadata in rows.iterator(chunk_size=10_000):
        dims = _metadata_dimensions(metadata)
        if dims is not None:
            offer(pk, dims)
        elif Path(source_path).suffix.lower() in IMAGE_SUFFIXES:
            seen += 1
            if len(to_read) < DIMENSION_SCAN_LIMIT:
                to_read.append((pk, source_path))
            elif (slot := rng.randrange(seen)) < DIMENSION_SCAN_LIMIT:
                to_read[slot] = (pk, source_path)
    for pk, source_path in to_read:
        offer(pk, unit_dimensions(root, source_path, None))
    return (
        [-pk for _, pk in sorted(wide, reverse=True)],
        [-pk for _, pk in sorted(tall, reverse=True)],
    )


def profile_create(
    *,
    campaign: Campaign,
    margin: float = 0.2,
    memory_budget: int | None = None,
    max_batch_size: int = 1024,
    sample_size: int = 48,
    heavy: int = 12,
) -> Profile:
    if not 0 <= margin < 1:
        raise ValueError("margin is a fraction of memory between 0 and 1 (0.2 keeps 20% free)")
    version = campaign.current_version
    sample, heaviest = sample_build(
        campaign=campaign, size=sample_size, heavy=heavy, version=version
    )
    if not sample:
        raise ValueError(f"campaign {campaign.name} has no unit to profile")
    return Profile.objects.create(
        campaign=campaign,
        version=version,
        sample=sample,
        heavy=heaviest,
        margin=margin,
        memory_budget=memory_budget,
        max_batch_size=max_batch_size,
    )


def profile_rerun(*, profile: Profile, memory_budget: int | None = None) -> Profile:
    """The same sample, parameter version and settings again, queued, to compare
    (another device, another day, another worker).

    The memory budget carries over only when it was given (a CPU budget, or a
    smaller card emulated on a larger one): one read from the device's memory
    is the next device's to read again.
    """
    if not profile.sample:
        raise ValueError(f"profile {profile.pk} has no saved sample to run again")
    if memory_budget is None and profile.runtime.get("budget_source") == "given":
        memory_budget = profile.memory_budget
    return Profile.objects.create(
        campaign=profile.campaign,
        version=profile.version,
        sample=profile.sample,
        heavy=profile.heavy,
        margin=profile.margin,
        memory_budget=memory_budget,
        max_batch_size=profile.max_batch_size,
    )


# --- batching policies over the whole corpus ----------------------------------------


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


# --- the estimate -----------------------------------------------------------------


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


def _measured_relative(device: str) -> tuple[float, str, str | None]:
    """The measured device's speed relative to an A40, and where that figure comes from."""
    from portal.models import GpuModel

    for gpu in GpuModel.objects.all():
        if gpu.name.lower().replace(" sxm", "") in device.lower():
            return float(gpu.relative_throughput), f"catalog figure of {gpu.name}", gpu.name
    assumed = settings.PROFILE_DEVICE_RELATIVE_THROUGHPUT
    if assumed is not None:
        return assumed, f"assumed {assumed} × an A40 (PROFILE_DEVICE_RELATIVE_THROUGHPUT)", None
    if device.startswith("CPU"):
        return CPU_RELATIVE, f"assumed {CPU_RELATIVE} × an A40 for a CPU", None
    # An unlisted GPU: a CPU's figure would make every card look 30 times
    # faster than it (an H200 measured this way did); an A40's is the middle of
    # the range, from a T4 (~0.25) to an H200 (~3), and the reasons say so.
    return (
        1.0,
        f"{device} is not in the catalog: assumed as fast as an A40 "
        "(set PROFILE_DEVICE_RELATIVE_THROUGHPUT for a better projection)",
        None,
    )


#: A CPU's throughput relative to an A40 on the packaged encoder (bench/RESULTS.md).
CPU_RELATIVE = 0.03


def memory_tier(peak: int, margin: float) -> int | None:
    """The smallest tier whose memory, less the margin, holds this peak; None when
    even the largest does not (no card tier fits at that batch)."""
    needed = peak / (1 - margin) / GiB
    return next((tier for tier in TIERS_GB if needed <= tier), None)


# Steps measured on the hard inputs: the ones whose memory a tier must hold.
HARD_PHASES = ("heaviest", "unusual", "train")


def tier_batches(profile: Profile) -> list[dict]:
    """Per memory tier, the largest measured batch that keeps the margin on it.

    For each tier (24 / 48 / 80 GB): the largest batch size measured on the
    hard inputs whose peak reserved memory stays under tier × (1 − margin),
    never above the chosen size (sizes above it were neither leak-checked nor
    tried on the unusual inputs: profile on the larger card to go further).
    A size that ran out of memory on any hard input does not count. So a
    small load is not pushed onto a larger card because the measuring device
    allowed a huge batch, and a batch no tier holds is said plainly.
    """
    chosen = profile.chosen_batch_size or 0
    peaks: dict[int, int] = {}
    broken: set[int] = set()
    for step in profile.steps:
        if step.get("phase") not in HARD_PHASES or not step.get("batch_size"):
            continue
        size = step["batch_size"]
        if step.get("oom") or step.get("error") or step.get("peak_reserved") is None:
            broken.add(size)
        else:
            peaks[size] = max(peaks.get(size, 0), step["peak_reserved"])
    rows = []
    for tier in TIERS_GB:
        limit = int(tier * GiB * (1 - profile.margin))
        fitting = [
            s for s, peak in peaks.items() if s <= chosen and s not in broken and peak <= limit
        ]
        size = max(fitting, default=None)
        rows.append(
            {
                "tier_gb": tier,
                "limit": limit,
                "batch_size": size,
                "peak_reserved": peaks.get(size) if size else None,
            }
        )
    return rows


def _tier_of(memory_gb: int) -> int | None:
    return max((tier for tier in TIERS_GB if tier <= memory_gb), default=None)


def recommend(*, projections: list[dict]) -> tuple[dict | None, list[str]]:
    """The cheapest rental whose cards hold their tier's batch and finish in time."""
    from portal.models import GpuModel, RentalDuration
    from portal.pricing import cards_available

    safety = settings.PROFILE_SAFETY_FACTOR
    durations = [d.days for d in RentalDuration.objects.filter(active=True)]
    reasons = [f"time: projected hours × {safety} for corrections, review and a second wave"]
    best = None
    for row in projections:
        if row["hours"] is None:
            continue  # no measured batch keeps the margin on this card's memory
        gpu = GpuModel.objects.filter(name=row["gpu"], active=True).first()
        if gpu is None:
            continue
        free = cards_available(gpu=gpu)
        for quantity in range(1, min(free, 8) + 1):
            per_card = row["hours"] * safety / quantity
            days = next((d for d in durations if per_card <= d * 24), None)
            if days is None:
                continue
            cost = float(gpu.price_per_day) * quantity * days
            key = (cost, quantity, days)
            if best is None or key < best["key"]:
                best = {
                    "key": key,
                    "gpu": gpu.name,
                    "quantity": quantity,
                    "days": days,
                    "cost": cost,
                    "hours": per_card,
                    "batch_size": row["batch_size"],
                }
    if best is None:
        reasons.append(
            "no card in stock holds a measured batch with the margin and finishes within "
            "30 days at 8 cards"
        )
        return None, reasons
    reasons.append(
        f"{best['quantity']} × {best['gpu']} for {best['days']} days at batch "
        f"{best['batch_size']}: about {best['hours']:.1f} h of work per card with the safety "
        f"factor, the cheapest plan that fits ({best['cost']:.2f} {settings.FIAT_CURRENCY})"
    )
    return best, reasons


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
    # The naive figure of the issue: the mean over the sweeps' batches, which
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
) -> Estimate:
    """Hours on the measured device → projections on every card, memory tier, rental plan.

    `hours` is the whole at the chosen batch size, `io_hours` the part of it
    spent reading, decoding, writing and checking: a faster card shortens the
    compute only. `hours_at(size)` prices another batch size the same way,
    for a tier that holds only a smaller batch; without it such a tier's
    cards are left out of the plan.
    """
    from portal.models import GpuModel

    chosen = profile.chosen_batch_size
    priced: dict[int, tuple[float, float]] = {chosen: (hours, io_hours)}

    def price(size: int | None) -> tuple[float, float] | None:
        if size and size not in priced and hours_at is not None:
            priced[size] = hours_at(size)
        return priced.get(size) if size else None

    tiers = tier_batches(profile)
    by_tier = {row["tier_gb"]: row for row in tiers}
    relative, source, matched = _measured_relative(profile.device)
    projections = []
    for gpu in GpuModel.objects.filter(active=True):
        tier = _tier_of(gpu.memory_gb)
        size = by_tier[tier]["batch_size"] if tier else None
        cost = price(size)
        row = {
            "gpu": gpu.name,
            "memory_gb": gpu.memory_gb,
            "tier_gb": tier,
            "batch_size": size if cost else None,
            "hours": None,
            "compute_hours": None,
            "io_hours": None,
            "kind": "measured" if matched == gpu.name else "projection",
        }
        if cost is not None:
            total, io = cost
            # Only the compute runs faster on a faster card: the disk, the
            # decoding and the checks stay where they are.
            compute = (total - io) * relative / float(gpu.relative_throughput)
            row.update(hours=compute + io, compute_hours=compute, io_hours=io)
        projections.append(row)
    plan, plan_reasons = recommend(projections=projections)
    size = plan["batch_size"] if plan else chosen
    peak_of = {row["batch_size"]: row["peak_reserved"] for row in tiers if row["batch_size"]}
    peak = peak_of.get(size) or profile.chosen_peak_reserved or 0
    tier = memory_tier(peak, profile.margin)
    hours_plan, io_plan = priced.get(size, (hours, io_hours))
    io_part = f", of which {io_hours:.2f} h reading and writing" if io_hours else ""
    reasons = [
        f"measured on {profile.device}: {hours:.2f} h for {units} units at batch {chosen} "
        f"({reason}){io_part}; other cards are projections from relative throughput "
        f"({source}): their compute scaled, the reading and writing not",
        *_memory_reasons(profile, tiers),
        *plan_reasons,
    ]
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
        projections=projections,
        gpu_name=plan["gpu"] if plan else "",
        quantity=plan["quantity"] if plan else None,
        duration_days=plan["days"] if plan else None,
        reasoning=reasons,
    )


def _memory_reasons(profile: Profile, tiers: list[dict]) -> list[str]:
    chosen, peak = profile.chosen_batch_size, profile.chosen_peak_reserved or 0
    margin = f"{profile.margin:.0%}"
    needed = peak / (1 - profile.margin) / GiB
    tier = memory_tier(peak, profile.margin)
    if tier is not None:
        lines = [
            f"memory: at batch {chosen} the heaviest inputs peak at {peak / GiB:.1f} GB "
            f"reserved; with the {margin} margin, cards of {tier} GB or more"
        ]
    else:
        lines = [
            f"memory: at batch {chosen} the heaviest inputs need {needed:.0f} GB with the "
            f"{margin} margin, more than the largest tier ({TIERS_GB[-1]} GB): no card tier "
            "fits at this batch; a smaller batch is recommended"
        ]
    for row in tiers:
        if row["batch_size"]:
            lines.append(
                f"{row['tier_gb']} GB cards: batch {row['batch_size']} (peak "
                f"{row['peak_reserved'] / GiB:.1f} GB, under {row['limit'] / GiB:.1f} GB "
                f"with the margin)"
            )
        else:
            lines.append(
                f"{row['tier_gb']} GB cards: no measured batch keeps the margin "
                f"(under {row['limit'] / GiB:.1f} GB)"
            )
    return lines


def chosen_rate(profile: Profile) -> float | None:
    """Items per second at the chosen size on the hard inputs (the median of its runs)."""
    rates = sorted(
        step["items_per_s"]
        for step in profile.steps
        if step.get("batch_size") == profile.chosen_batch_size
        and step.get("phase") in ("heaviest", "leak check", "train")
        and step.get("items_per_s")
    )
    return rates[len(rates) // 2] if rates else None


def report_steps(steps: list[dict]) -> list[dict]:
    """The steps with their write time per batch (measured per output, on a few)."""
    rows = []
    for step in steps:
        row = dict(step)
        if "write_s" not in row and row.get("write_s_per_item") is not None:
            row["write_s"] = round(row["write_s_per_item"] * row.get("batch_size", 0), 5)
        rows.append(row)
    return rows


def profile_report(profile: Profile) -> dict:
    """Everything a profile measured and concluded, as plain data (CLI, page, dossier)."""
    runtime = {k: v for k, v in profile.runtime.items() if k != "budget_source"}
    chosen_peak = profile.chosen_peak_reserved
    report = {
        "profile": profile.pk,
        "campaign": profile.campaign.name,
        "version": profile.version.label,
        "state": profile.state,
        "device": profile.device,
        "runtime": runtime,
        "memory_budget": profile.memory_budget,
        "budget_source": profile.runtime.get("budget_source"),
        "margin": profile.margin,
        "chosen_batch_size": profile.chosen_batch_size,
        "chosen_peak_reserved": chosen_peak,
        "chosen_tier_gb": memory_tier(chosen_peak, profile.margin) if chosen_peak else None,
        "memory_tiers": tier_batches(profile) if profile.chosen_batch_size else [],
        "largest_tier_gb": TIERS_GB[-1],
        "sample": {"units": len(profile.sample), "heaviest": len(profile.heavy)},
        "heaviest_tried": profile.heaviest_tried,
        "sample_failures": profile.sample_failures,
        "steps": report_steps(profile.steps),
        "leak": profile.leak,
        "policies": profile.policies,
        "error": profile.error,
        "created_at": profile.created_at.isoformat() if profile.created_at else None,
        "finished_at": profile.finished_at.isoformat() if profile.finished_at else None,
        "estimate": None,
    }
    estimate = Estimate.objects.filter(profile=profile).first()
    if estimate is not None:
        report["estimate"] = {
            "units": estimate.units,
            "batch_size": estimate.batch_size,
            "device": estimate.device,
            "hours_measured_device": round(estimate.hours_measured_device, 4),
            "hours_naive_sample_mean": round(estimate.hours_naive, 4),
            "peak_memory": estimate.peak_memory,
            "memory_tier_gb": estimate.memory_tier_gb,
            "output_bytes": estimate.output_bytes,
            "projections": estimate.projections,
            "plan": {
                "gpu": estimate.gpu_name,
                "quantity": estimate.quantity,
                "duration_days": estimate.duration_days,
            }
            if estimate.gpu_name
            else None,
            "reasoning": estimate.reasoning,
        }
    return report


def profile_summary(profile: Profile) -> dict:
    """The figures two profiles are compared on."""
    estimate = Estimate.objects.filter(profile=profile).first()
    return {
        "profile": profile.pk,
        "state": profile.state,
        "device": profile.device,
        "version": profile.version.label,
        "created_at": profile.created_at.isoformat() if profile.created_at else None,
        "sample_units": len(profile.sample),
        "chosen_batch_size": profile.chosen_batch_size,
        "chosen_peak_reserved": profile.chosen_peak_reserved,
        "items_per_s": chosen_rate(profile),
        "hours": round(estimate.hours_measured_device, 4) if estimate else None,
        "estimate_batch_size": estimate.batch_size if estimate else None,
        "memory_tier_gb": estimate.memory_tier_gb if estimate else None,
    }


COMPARED = (
    ("chosen_batch_size", "Chosen batch size"),
    ("chosen_peak_reserved", "Peak reserved at the chosen size"),
    ("items_per_s", "Items/s at the chosen size"),
    ("hours", "Estimate, hours on the measured device"),
)


def profile_comparison(*, profile: Profile, other: Profile) -> dict:
    """Two profiles side by side: the same sample on another device, another day."""
    this, that = profile_summary(profile), profile_summary(other)
    rows = []
    for field, label in COMPARED:
        a, b = this[field], that[field]
        change = round((a - b) / b * 100, 1) if a is not None and b else None
        rows.append(
            {
                "field": field,
                "label": label,
                "this": a,
                "other": b,
                "pair": [a, b],
                "change": change,
            }
        )
    return {
        "profile": this,
        "other": that,
        "same_sample": profile.sample == other.sample,
        "same_version": profile.version_id == other.version_id,
        "rows": rows,
    }


def latest_profile(*, campaign: Campaign) -> Profile | None:
    return Profile.objects.filter(campaign=campaign).order_by("-created_at", "-pk").first()


PROFILE_TASK = "gpuworker.tasks.run_profile"


def profiles_fail_stale(*, now: dt.datetime | None = None) -> list[int]:
    """Fail the running profiles whose worker stopped beating: killed (on a CPU
    a profile grows its batches until memory runs short, so perhaps by the
    kernel for memory) or its machine lost. Failed, not sent again: what
    killed the worker would likely kill the next one; the report keeps the
    steps measured and offers to profile again."""
    now = now or timezone.now()
    stale = now - dt.timedelta(seconds=settings.PROFILE_HEARTBEAT_SECONDS * 3)
    # A profile from before heartbeats counts from when it was queued.
    silent = Q(heartbeat_at__lt=stale) | Q(heartbeat_at__isnull=True, created_at__lt=stale)
    failed = []
    running = Profile.objects.filter(silent, state=Profile.State.RUNNING)
    for profile in running.only("pk", "heartbeat_at", "created_at", "steps"):
        since = profile.heartbeat_at or profile.created_at
        moved = Profile.objects.filter(
            pk=profile.pk, state=Profile.State.RUNNING, heartbeat_at=profile.heartbeat_at
        ).update(
            state=Profile.State.FAILED,
            finished_at=now,
            error=(
                f"its worker stopped answering (no heartbeat since "
                f"{since:%Y-%m-%d %H:%M:%S} UTC) after {len(profile.steps)} measured "
                "batch(es): it was killed, perhaps for memory, or its machine was lost. "
                "The batches measured are below; profile again."
            ),
        )
        if moved:
            log.warning("profile %s: worker silent since %s; failed", profile.pk, since)
            failed.append(profile.pk)
    return failed


def _queue(profile: Profile) -> None:
    from celery import current_app as celery_app

    transaction.on_commit(lambda: celery_app.send_task(PROFILE_TASK, args=[profile.pk]))


def profile_start(
    *, campaign: Campaign, margin: float = 0.2, max_batch_size: int = 1024
) -> Profile:
    """Queue a profile for a worker: the sample is built there (it measures every
    unit's cost, which is no work for a web request on a large corpus)."""
    if not 0 <= margin < 1:
        raise ValueError("margin is a fraction of memory between 0 and 1 (0.2 keeps 20% free)")
    profile = Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        margin=margin,
        max_batch_size=max_batch_size,
    )
    _queue(profile)
    return profile


def profile_rerun_start(*, profile: Profile) -> Profile:
    """Queue the same sample again for a worker (the page's "Re-run this sample")."""
    again = profile_rerun(profile=profile)
    _queue(again)
    return again


def order_link(*, estimate: Estimate) -> str:
    """The configurator pre-filled with the recommended plan (see portal/order_views)."""
    from urllib.parse import urlencode

    from django.urls import reverse

    from portal.models import GpuModel, RentalDuration

    query: dict[str, object] = {
        "campaign": estimate.profile.campaign.name,
        # The order keeps this profile: its dossier shows what was ordered.
        "profile": estimate.profile.pk,
        "min_memory_gb": estimate.memory_tier_gb,
    }
    gpu = GpuModel.objects.filter(name=estimate.gpu_name).first()
    if gpu is not None:
        query["gpu"] = gpu.pk
        query["quantity"] = estimate.quantity
    duration = RentalDuration.objects.filter(days=estimate.duration_days).first()
    if duration is not None:
        query["duration"] = duration.pk
    environment, _note = environment_match(estimate.profile.runtime)
    if environment is not None:
        query["environment"] = environment.pk
    return f"{reverse('order_new')}?{urlencode(query)}"


def major_minor(version: object) -> str | None:
    """ "2.13" of "2.13.0+cu130", "12.8" of "12.8"; None when there is none."""
    parts = str(version or "").split("+")[0].split(".")
    if len(parts) < 2 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return f"{int(parts[0])}.{int(parts[1])}"


def environment_match(runtime: dict):
    """The catalog environment with the torch and CUDA the profile ran with, and why.

    Exact major.minor of both (of torch alone for a CPU profile, which has no
    CUDA to match); the first such environment in catalog order. None when
    none matches: the configurator is then left to the user, not guessed.
    """
    from portal.models import Environment

    torch_version, cuda = major_minor(runtime.get("torch")), major_minor(runtime.get("cuda"))
    if torch_version is None:
        return None, (
            "the profile recorded no torch version: choose the environment in the configurator"
        )
    matches = [
        env
        for env in Environment.objects.filter(active=True)
        if env.framework.lower() == "pytorch"
        and major_minor(env.framework_version) == torch_version
        and (cuda is None or major_minor(env.cuda_version) == cuda)
    ]
    wanted = f"torch {torch_version}" + (f" with CUDA {cuda}" if cuda else "")
    if not matches:
        return None, (
            f"no catalog environment has {wanted}, as profiled: the configurator leaves "
            "the environment for you to choose"
        )
    how = "as profiled" if cuda else "as profiled (on the CPU: no CUDA version to match)"
    return matches[0], f"{matches[0].name}: {wanted}, {how}"
