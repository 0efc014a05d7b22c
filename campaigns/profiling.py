"""Profiles and estimates, the parts without torch: the sample, the policies, the plan.

The measuring itself is gpuworker/profiler.py. Here: which units a profile
runs on (ordinary ones at random plus the heaviest and those that failed
before), how each batching policy would pad the whole corpus, and how the
measured steps become an estimate for the corpus and a rental plan.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from . import services
from .batching import plan_batches
from .models import Campaign, Estimate, Profile, Unit, UnitState
from .processor_specs import get_spec

TIERS_GB = (24, 48, 80)
GiB = 1024**3


# --- the sample ---------------------------------------------------------------


def sample_build(
    *, campaign: Campaign, size: int = 48, heavy: int = 12, failed: int = 4, seed: int = 0
) -> tuple[list[int], list[int]]:
    """Unit ids of the sample and, among them, of the heaviest.

    Ordinary units at random, plus the heaviest by cost (the inputs that set
    the memory a batch needs) and a few that failed validation before (they
    must fail cleanly, not take the profile down). Costs are measured first
    for units that have none, whatever their state.
    """
    version = campaign.current_version
    services.measure_costs(campaign=campaign, params=version.params, pending_only=False)
    # The holdout stays out of profiling and tuning: it judges them afterwards.
    units = Unit.objects.filter(campaign=campaign, holdout=False)
    heaviest = list(
        units.exclude(state=UnitState.FAILED)
        .order_by("-cost", "pk")
        .values_list("pk", flat=True)[:heavy]
    )
    failed_before = list(
        units.filter(state=UnitState.FAILED, error_class__startswith="input")
        .order_by("pk")
        .values_list("pk", flat=True)[:failed]
    )
    taken = set(heaviest) | set(failed_before)
    # Ids only, in one query: a campaign may hold millions of units.
    ordinary = [
        pk
        for pk in units.exclude(state=UnitState.FAILED).values_list("pk", flat=True)
        if pk not in taken
    ]
    picked = random.Random(seed).sample(ordinary, min(size, len(ordinary)))
    return sorted(picked + heaviest + failed_before), heaviest


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
    sample, heaviest = sample_build(campaign=campaign, size=sample_size, heavy=heavy)
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


def profile_rerun(*, profile: Profile) -> Profile:
    """The same sample and settings again, to compare (another device, another day)."""
    return Profile.objects.create(
        campaign=profile.campaign,
        version=profile.campaign.current_version,
        sample=profile.sample,
        heavy=profile.heavy,
        margin=profile.margin,
        memory_budget=profile.memory_budget,
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
        if step.get("oom") or not step.get("padded") or step.get("compute_s") is None:
            continue
        if not math.isnan(step["compute_s"]):
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
        if s.get("fits") and s.get("batch_size")
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
    return assumed, f"assumed {assumed} × an A40 (PROFILE_DEVICE_RELATIVE_THROUGHPUT)", None


def memory_tier(peak: int, margin: float) -> int:
    needed = peak / (1 - margin) / GiB
    return next((tier for tier in TIERS_GB if needed <= tier), TIERS_GB[-1])


def recommend(*, projections: list[dict], tier_gb: int) -> tuple[dict | None, list[str]]:
    """The cheapest rental whose cards have the memory and finish in time."""
    from portal.models import GpuModel, RentalDuration
    from portal.pricing import cards_available

    safety = settings.PROFILE_SAFETY_FACTOR
    durations = [d.days for d in RentalDuration.objects.filter(active=True)]
    reasons = [
        f"memory: cards of {tier_gb} GB or more (measured peak plus the margin)",
        f"time: projected hours × {safety} for corrections, review and a second wave",
    ]
    best = None
    for row in projections:
        gpu = GpuModel.objects.filter(name=row["gpu"], active=True).first()
        if gpu is None or gpu.memory_gb < tier_gb:
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
                }
    if best is None:
        reasons.append("no card in stock has the memory and finishes within 30 days at 8 cards")
        return None, reasons
    reasons.append(
        f"{best['quantity']} × {best['gpu']} for {best['days']} days: about "
        f"{best['hours']:.1f} h of work per card with the safety factor, the cheapest plan "
        f"that fits ({best['cost']:.2f} {settings.FIAT_CURRENCY})"
    )
    return best, reasons


@transaction.atomic
def estimate_build(*, profile: Profile) -> Estimate:
    """The whole corpus from the profile's steps, on its own cost distribution."""

    campaign = profile.campaign
    spec = get_spec(campaign.processor)
    params = profile.version.params
    size = profile.chosen_batch_size
    model = fit_throughput(profile.steps)
    pairs = corpus_costs(campaign=campaign)
    cost_of = dict(pairs)
    heaviest_cost = max((cost_of.get(pk, 1) for pk in profile.heavy), default=1)
    planned = {**params, "batch_size": size, "token_budget": size * heaviest_cost}
    batches = list(plan_batches(pairs, planned))
    seconds = sum(
        model.batch_seconds(padded_cost(spec.padding, [cost_of[pk] for pk in b])) for b in batches
    ) + model.per_item * len(pairs)
    measured = [s for s in profile.steps if s.get("fits")]
    per_item_naive = sum(s["compute_s"] for s in measured) / max(
        1, sum(s["batch_size"] for s in measured)
    )
    return estimate_from_hours(
        profile=profile,
        units=len(pairs),
        hours=seconds / 3600,
        hours_naive=per_item_naive * len(pairs) / 3600 + model.per_item * len(pairs) / 3600,
        reason=f"{len(batches)} batches, policy {params.get('batch_policy', 'original')}",
    )


def estimate_from_hours(
    *, profile: Profile, units: int, hours: float, hours_naive: float, reason: str
) -> Estimate:
    """Hours on the measured device → projections on every card, memory tier, rental plan."""
    from portal.models import GpuModel

    size = profile.chosen_batch_size
    relative, source, matched = _measured_relative(profile.device)
    projections = []
    for gpu in GpuModel.objects.filter(active=True):
        is_measured = matched == gpu.name
        projections.append(
            {
                "gpu": gpu.name,
                "memory_gb": gpu.memory_gb,
                "hours": hours * relative / float(gpu.relative_throughput),
                "kind": "measured" if is_measured else "projection",
            }
        )
    tier = memory_tier(profile.chosen_peak_reserved or 0, profile.margin)
    plan, reasons = recommend(projections=projections, tier_gb=tier)
    reasons.insert(
        0,
        f"measured on {profile.device}: {hours:.2f} h for {units} units at batch {size} "
        f"({reason}); other cards are projections from relative throughput ({source})",
    )
    measured = [s for s in profile.steps if s.get("fits")]
    output_each = [s["output_bytes_per_item"] for s in measured if s.get("output_bytes_per_item")]
    Estimate.objects.filter(profile=profile).delete()
    return Estimate.objects.create(
        profile=profile,
        version=profile.version,
        device=profile.device,
        units=units,
        batch_size=size,
        hours_measured_device=hours,
        hours_naive=hours_naive,
        peak_memory=profile.chosen_peak_reserved or 0,
        memory_tier_gb=tier,
        output_bytes=int(sum(output_each) / len(output_each) * units) if output_each else 0,
        projections=projections,
        gpu_name=plan["gpu"] if plan else "",
        quantity=plan["quantity"] if plan else None,
        duration_days=plan["days"] if plan else None,
        reasoning=reasons,
    )


def profile_report(profile: Profile) -> dict:
    """Everything a profile measured and concluded, as plain data (CLI, page, dossier)."""
    report = {
        "profile": profile.pk,
        "campaign": profile.campaign.name,
        "version": profile.version.label,
        "state": profile.state,
        "device": profile.device,
        "runtime": profile.runtime,
        "memory_budget": profile.memory_budget,
        "margin": profile.margin,
        "chosen_batch_size": profile.chosen_batch_size,
        "chosen_peak_reserved": profile.chosen_peak_reserved,
        "sample": {"units": len(profile.sample), "heaviest": len(profile.heavy)},
        "heaviest_tried": profile.heaviest_tried,
        "sample_failures": profile.sample_failures,
        "steps": profile.steps,
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


def latest_profile(*, campaign: Campaign) -> Profile | None:
    return Profile.objects.filter(campaign=campaign).order_by("-created_at", "-pk").first()


PROFILE_TASK = "gpuworker.tasks.run_profile"


def profile_start(
    *, campaign: Campaign, margin: float = 0.2, max_batch_size: int = 1024
) -> Profile:
    """Queue a profile for a worker: the sample is built there (it measures every
    unit's cost, which is no work for a web request on a large corpus)."""
    from portal.celery import app as celery_app

    if not 0 <= margin < 1:
        raise ValueError("margin is a fraction of memory between 0 and 1 (0.2 keeps 20% free)")
    profile = Profile.objects.create(
        campaign=campaign,
        version=campaign.current_version,
        margin=margin,
        max_batch_size=max_batch_size,
    )
    transaction.on_commit(lambda: celery_app.send_task(PROFILE_TASK, args=[profile.pk]))
    return profile


def order_link(*, estimate: Estimate) -> str:
    """The configurator pre-filled with the recommended plan (see portal/order_views)."""
    from urllib.parse import urlencode

    from django.urls import reverse

    from portal.models import GpuModel, RentalDuration

    query: dict[str, object] = {
        "campaign": estimate.profile.campaign.name,
        "min_memory_gb": estimate.memory_tier_gb,
    }
    gpu = GpuModel.objects.filter(name=estimate.gpu_name).first()
    if gpu is not None:
        query["gpu"] = gpu.pk
        query["quantity"] = estimate.quantity
    duration = RentalDuration.objects.filter(days=estimate.duration_days).first()
    if duration is not None:
        query["duration"] = duration.pk
    environment = matching_environment(estimate.profile.runtime)
    if environment is not None:
        query["environment"] = environment.pk
    return f"{reverse('order_new')}?{urlencode(query)}"


def matching_environment(runtime: dict):
    """The catalog environment closest to the torch and CUDA the profile ran with."""
    from portal.models import Environment

    torch_version = str(runtime.get("torch", "")).split("+")[0]
    cuda = str(runtime.get("cuda") or "")
    environments = list(Environment.objects.filter(active=True))

    def score(env) -> tuple[int, int]:
        same_torch = env.framework.lower() == "pytorch" and torch_version.startswith(
            env.framework_version.rsplit(".", 1)[0]
        )
        return (int(same_torch), int(bool(cuda) and env.cuda_version == cuda))

    return max(environments, key=score, default=None)
