"""Rental advice from a profile's measured figures: which card and plan, and
the order link.

The catalog's side of an estimate: the measured device's speed relative to
the catalog's cards, the hours projected onto each active card, the cheapest
plan in stock within the rental durations, the environment with the
profile's torch and CUDA, and the order form pre-filled with all that.
campaigns asks for it through its Advisor interface
(campaigns/profiles/advice.py); PortalConfig.ready() registers `PortalAdvisor`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlencode

from django.conf import settings
from django.urls import reverse

from campaigns.models import Estimate
from campaigns.profiles.advice import HoursAt, RentalAdvice
from campaigns.profiles.tiers import TIERS_GB
from portal.models import Environment, GpuModel, RentalDuration
from portal.pricing import cards_available

#: A CPU's throughput relative to an A40 on the packaged encoder: the order of
#: magnitude between this project's CPU machines and the lent H200 (bench/RESULTS.md,
#: "On a lent GPU — `bench/device/`").
CPU_RELATIVE = 0.03


def _measured_relative(device: str) -> tuple[float, str, str | None]:
    """The measured device's speed relative to an A40, and where that figure comes from."""
    for gpu in GpuModel.objects.all():
        if gpu.name.lower().replace(" sxm", "") in device.lower():
            return float(gpu.relative_throughput), f"catalog figure of {gpu.name}", gpu.name
    assumed = settings.PROFILE_DEVICE_RELATIVE_THROUGHPUT
    if assumed is not None:
        return assumed, f"assumed {assumed} × an A40 (PROFILE_DEVICE_RELATIVE_THROUGHPUT)", None
    if device.startswith("CPU"):
        return CPU_RELATIVE, f"assumed {CPU_RELATIVE} × an A40 for a CPU", None
    # An unlisted GPU: a CPU's figure would make every card look about 30 times
    # faster than the device that measured; an A40's is the middle of the range,
    # from a T4 (~0.25) to an H200 (~3), and the reasons say so (bench/RESULTS.md,
    # "2026-12-01: less host work a unit, the profiler on the H200").
    return (
        1.0,
        f"{device} is not in the catalog: assumed as fast as an A40 "
        "(set PROFILE_DEVICE_RELATIVE_THROUGHPUT for a better projection)",
        None,
    )


def tier_of(memory_gb: int) -> int | None:
    """The largest memory tier a card of this memory holds; None below the smallest."""
    return max((tier for tier in TIERS_GB if tier <= memory_gb), default=None)


def rental_advise(
    *, device: str, tier_batch: Mapping[int, int | None], hours_at: HoursAt
) -> RentalAdvice:
    """Every active card's hours from the measured device's, and the cheapest plan.

    A card runs the batch its memory tier holds (`tier_batch`, None where no
    measured batch keeps the margin: no hours, and no plan on it).
    """
    relative, source, matched = _measured_relative(device)
    projections = []
    for gpu in GpuModel.objects.filter(active=True):
        tier = tier_of(gpu.memory_gb)
        size = tier_batch[tier] if tier else None
        cost = hours_at(size)
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
    plan, reasons = recommend(projections=projections)
    return RentalAdvice(projections=projections, speed_source=source, plan=plan, reasons=reasons)


def recommend(*, projections: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, list[str]]:
    """The cheapest rental whose cards hold their tier's batch and finish in time."""
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


def order_link(*, estimate: Estimate) -> str:
    """The configurator pre-filled with the recommended plan (see portal/order_views)."""
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
    duration = (
        RentalDuration.objects.filter(days=estimate.duration_days).first()
        if estimate.duration_days is not None
        else None
    )
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


def environment_match(runtime: dict[str, Any]) -> tuple[Environment | None, str]:
    """The catalog environment with the torch and CUDA the profile ran with, and why.

    Exact major.minor of both (of torch alone for a CPU profile, which has no
    CUDA to match); the first such environment in catalog order. None when
    none matches: the configurator is then left to the user, not guessed.
    """
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


class PortalAdvisor:
    """campaigns' Advisor (campaigns/profiles/advice.py) over this catalog."""

    rental_advise = staticmethod(rental_advise)
    rental_plan = staticmethod(recommend)
    environment_match = staticmethod(environment_match)
    order_link = staticmethod(order_link)
