"""A profile's steps drawn for its report page: server-side SVG, no JS library.

Two charts against batch size (log2): peak memory, with the budget and the
margin limit the chosen size had to stay under, and items per second. The
count sweep (typical inputs) and the heaviest sweep are separate series,
because the gap between them is the point of profiling on the heaviest.
Steps that ran out of memory or went over the limit get a red ring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from django.template.defaultfilters import filesizeformat

from campaigns.models import Profile

PHASES = ("count", "heaviest", "train")
WIDTH, HEIGHT = 600, 240
# Room for the axis labels around the plot area.
LEFT, RIGHT, TOP, BOTTOM = 72, 16, 12, 32
Y_TICKS = 4


@dataclass(frozen=True)
class Mark:
    x: float
    y: float
    failed: bool
    title: str
    # False when the step gave no value (items/s of an out-of-memory step):
    # it is marked on the axis, outside the line.
    measured: bool = True


@dataclass(frozen=True)
class Series:
    name: str
    css: str
    marks: tuple[Mark, ...]

    @property
    def points(self) -> str:
        return " ".join(f"{m.x:.1f},{m.y:.1f}" for m in self.marks if m.measured)


@dataclass(frozen=True)
class Rule:
    """A horizontal line across the plot: the budget, the margin limit."""

    label: str
    css: str
    y: float


@dataclass(frozen=True)
class Tick:
    at: float
    label: str


@dataclass
class StepChart:
    label: str
    series: list[Series]
    rules: list[Rule] = field(default_factory=list)
    x_ticks: list[Tick] = field(default_factory=list)
    y_ticks: list[Tick] = field(default_factory=list)
    x_label: str = "batch size on a log scale"
    failed_label: str = "out of memory or over the limit"
    width: int = WIDTH
    height: int = HEIGHT
    left: int = LEFT
    right: int = WIDTH - RIGHT
    top: int = TOP
    bottom: int = HEIGHT - BOTTOM

    @property
    def failures(self) -> int:
        return sum(1 for s in self.series for m in s.marks if m.failed)


class _Scale:
    """Batch size to x (log2), value to y (0 at the bottom)."""

    def __init__(self, sizes: list[int], top_value: float):
        self.lo = math.log2(min(sizes))
        self.hi = math.log2(max(sizes))
        self.top_value = top_value or 1

    def x(self, size: int) -> float:
        if self.hi == self.lo:
            return (LEFT + WIDTH - RIGHT) / 2
        share = (math.log2(size) - self.lo) / (self.hi - self.lo)
        return round(LEFT + (WIDTH - LEFT - RIGHT) * share, 1)

    def y(self, value: float) -> float:
        plot = HEIGHT - TOP - BOTTOM
        return round(HEIGHT - BOTTOM - plot * min(value, self.top_value) / self.top_value, 1)

    def x_ticks(self, sizes: list[int]) -> list[Tick]:
        # Every measured size would crowd the axis after a binary search:
        # powers of two, plus the ends.
        shown = sorted({s for s in sizes if s & (s - 1) == 0} | {min(sizes), max(sizes)})
        return [Tick(at=self.x(s), label=str(s)) for s in shown]

    def y_ticks(self, label) -> list[Tick]:
        return [
            Tick(at=self.y(self.top_value * i / Y_TICKS), label=label(self.top_value * i / Y_TICKS))
            for i in range(Y_TICKS + 1)
        ]


def _charted(profile: Profile) -> list[dict]:
    return [
        s
        for s in profile.steps or []
        if s.get("phase") in PHASES and (s.get("batch_size") or 0) > 0
    ]


def _failed(step: dict) -> bool:
    return bool(step.get("oom")) or not step.get("fits")


def _verdict(step: dict) -> str:
    if step.get("oom"):
        return "out of memory"
    return "fits" if step.get("fits") else "over the limit"


def _bytes(value: float) -> str:
    return filesizeformat(int(value))


def memory_chart(profile: Profile) -> StepChart | None:
    steps = _charted(profile)
    if not steps:
        return None
    budget = profile.memory_budget or 0
    limit = int((1 - profile.margin) * budget) if budget else 0
    peaks = [s.get(k) or 0 for s in steps for k in ("peak_allocated", "peak_reserved")]
    scale = _Scale([s["batch_size"] for s in steps], 1.05 * max([*peaks, budget]))
    series = []
    for index, phase in enumerate(PHASES, start=1):
        rows = sorted((s for s in steps if s["phase"] == phase), key=lambda s: s["batch_size"])
        if not rows:
            continue
        for key, what in (("peak_reserved", "reserved"), ("peak_allocated", "allocated")):
            marks = tuple(
                Mark(
                    x=scale.x(s["batch_size"]),
                    y=scale.y(s[key]),
                    failed=_failed(s),
                    title=f"{phase}, batch {s['batch_size']}: {what} {_bytes(s[key])}, "
                    f"{_verdict(s)}",
                )
                for s in rows
                if s.get(key) is not None
            )
            if marks:
                series.append(
                    Series(name=f"{phase}: peak {what}", css=f"series-{index} {what}", marks=marks)
                )
    rules = []
    if budget:
        rules.append(Rule(label=f"budget {_bytes(budget)}", css="budget", y=scale.y(budget)))
        rules.append(
            Rule(
                label=f"limit with {profile.margin:.0%} margin {_bytes(limit)}",
                css="limit",
                y=scale.y(limit),
            )
        )
    return StepChart(
        label="peak memory by batch size",
        series=series,
        rules=rules,
        x_ticks=scale.x_ticks([s["batch_size"] for s in steps]),
        y_ticks=scale.y_ticks(_bytes),
    )


def throughput_chart(profile: Profile) -> StepChart | None:
    steps = _charted(profile)
    if not steps:
        return None
    rates = [s.get("items_per_s") or 0 for s in steps]
    scale = _Scale([s["batch_size"] for s in steps], 1.05 * max(rates))
    series = []
    for index, phase in enumerate(PHASES, start=1):
        rows = sorted((s for s in steps if s["phase"] == phase), key=lambda s: s["batch_size"])
        marks = tuple(
            Mark(
                x=scale.x(s["batch_size"]),
                y=scale.y(s.get("items_per_s") or 0),
                failed=_failed(s),
                measured=s.get("items_per_s") is not None,
                title=f"{phase}, batch {s['batch_size']}: "
                + (
                    f"{s['items_per_s']:g} items/s"
                    if s.get("items_per_s") is not None
                    else "no result"
                )
                + f", {_verdict(s)}",
            )
            for s in rows
        )
        if marks:
            series.append(Series(name=f"{phase}: items/s", css=f"series-{index}", marks=marks))
    return StepChart(
        label="items per second by batch size",
        series=series,
        x_ticks=scale.x_ticks([s["batch_size"] for s in steps]),
        y_ticks=scale.y_ticks(_rate),
    )


def _rate(value: float) -> str:
    """A tick's items/s as a person reads it: 1,460 rather than 1.46e+03."""
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def headroom(profile: Profile) -> dict | None:
    """What the chosen size keeps free of the budget on the heaviest inputs."""
    if not profile.chosen_peak_reserved or not profile.memory_budget:
        return None
    budget, peak = profile.memory_budget, profile.chosen_peak_reserved
    return {
        "peak": peak,
        "limit": int((1 - profile.margin) * budget),
        "free": budget - peak,
        "free_percent": round(100 * (budget - peak) / budget, 1),
    }
