"""A profile's estimate carried to a corpus of another size: "my full corpus is
2 M documents", or 500 GB, when the campaign profiled holds a sample of it.

An extrapolation, and said so: the per-unit rates the estimate measured (hours
on the measured device and on every card, output bytes) are multiplied by the
ratio of units, which assumes the full corpus's units cost what this
campaign's do. A size in bytes becomes units through the mean size of this
campaign's inputs. The memory tier and the batch do not change with the
corpus; the rental plan is chosen again on the scaled hours.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from django.db.models import Avg, Count

from campaigns.models import Estimate, Unit
from campaigns.profiles.advice import advisor

#: The units a corpus size may be given in, as the page's form offers them.
SIZE_UNITS: dict[str, int] = {"units": 1, "MB": 10**6, "GB": 10**9, "TB": 10**12}
_SUFFIX = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "b": 10**9}
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgb]?)\s*$", re.IGNORECASE)
#: Far beyond any corpus (a trillion units, an exabyte): a tampered field is
#: refused rather than priced.
MAX_UNITS = 10**12
MAX_BYTES = 10**18


class CorpusSizeError(ValueError):
    """A corpus size that cannot be read; the message says what is expected."""


@dataclass(frozen=True)
class CorpusSize:
    amount: float
    unit: str  # a key of SIZE_UNITS

    def __str__(self) -> str:
        if self.unit == "units":
            return f"{self.amount:,.0f} units"
        return f"{self.amount:,g} {self.unit}"


def corpus_size_parse(amount: str, unit: str) -> CorpusSize | None:
    """The form's size: a number with an optional k / M / G suffix ("2M",
    "2,000,000", "1.5k") in units or bytes. None when left empty; raises
    CorpusSizeError when it cannot be read."""
    text = amount.replace(",", "").replace("_", "").replace(" ", "")
    if not text:
        return None
    if unit not in SIZE_UNITS:
        raise CorpusSizeError(f"a corpus size is given in {', '.join(SIZE_UNITS)}")
    found = _AMOUNT.match(text)
    if found is None:
        raise CorpusSizeError(
            "a corpus size is a number, with k, M or G for thousands, millions, billions (2M)"
        )
    value = float(found.group(1)) * _SUFFIX[found.group(2).lower()]
    limit = MAX_UNITS if unit == "units" else MAX_BYTES
    if not 0 < value * SIZE_UNITS[unit] <= limit:
        raise CorpusSizeError("a corpus size is above zero and below a trillion units (1 EB)")
    return CorpusSize(value, unit)


@dataclass(frozen=True)
class Extrapolation:
    size: CorpusSize
    units: int
    factor: float  # units ÷ the estimate's units
    hours: float  # on the measured device
    output_bytes: int
    projections: list[dict[str, Any]]
    plan: dict[str, Any] | None
    reasons: list[str]
    assumptions: list[str] = field(default_factory=list)


def estimate_extrapolate(*, estimate: Estimate, size: CorpusSize) -> Extrapolation:
    """The estimate scaled to a corpus of `size`, with the rental plan chosen again."""
    campaign = estimate.profile.campaign
    measured = max(1, estimate.units)
    per_unit_s = estimate.hours_measured_device * 3600 / measured
    assumptions = [
        f"an extrapolation, not a measurement: {per_unit_s:.4g} s a unit on "
        f"{estimate.device} at batch {estimate.batch_size}, as measured over this campaign's "
        f"{estimate.units:,} units, times the units of the full corpus — it assumes their "
        "inputs cost what these do (lengths, sizes, failures)"
    ]
    if size.unit == "units":
        units = round(size.amount)
    else:
        sizes = Unit.objects.filter(campaign=campaign, size__gt=0).aggregate(
            mean=Avg("size"), n=Count("pk")
        )
        mean = sizes["mean"]
        if not mean:
            raise CorpusSizeError("this campaign's inputs have no recorded size: give units")
        units = max(1, round(size.amount * SIZE_UNITS[size.unit] / mean))
        assumptions.append(
            f"{size} is {units:,} units at the mean input size of this campaign's "
            f"{sizes['n']:,} units ({mean:,.0f} bytes)"
        )
    factor = units / measured
    projections = [_scaled(row, factor) for row in estimate.projections]
    plan, reasons = advisor().rental_plan(projections=projections)
    assumptions.append(
        "the batch and the memory tier stay as profiled: they depend on the heaviest "
        "inputs, which a larger corpus may exceed"
    )
    return Extrapolation(
        size=size,
        units=units,
        factor=factor,
        hours=estimate.hours_measured_device * factor,
        output_bytes=round(estimate.output_bytes * factor),
        projections=projections,
        plan=plan,
        reasons=reasons,
        assumptions=assumptions,
    )


def _scaled(row: dict[str, Any], factor: float) -> dict[str, Any]:
    """A card's projection for `factor` times the units (no hours stays none)."""
    scaled = dict(row)
    for key in ("hours", "compute_hours", "io_hours"):
        if scaled.get(key) is not None:
            scaled[key] = scaled[key] * factor
    return scaled
