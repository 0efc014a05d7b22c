"""A training's checkpoints drawn for its page: loss and held-out metrics by step.

The same server-side SVG as the profile's charts (campaigns/profiles/charts.py,
drawn by the `step-chart` partial of campaign_profile.html), with step on a
linear x axis and the base model's value as a rule to beat.
"""

from __future__ import annotations

from campaigns.models import ModelCheckpoint, Training
from campaigns.profiles.charts import (
    BOTTOM,
    HEIGHT,
    LEFT,
    RIGHT,
    TOP,
    WIDTH,
    Y_TICKS,
    Mark,
    Rule,
    Series,
    StepChart,
    Tick,
)


class _Linear:
    def __init__(self, steps: list[int], top_value: float):
        self.lo, self.hi = min(steps), max(steps)
        self.top_value = top_value or 1

    def x(self, step: int) -> float:
        if self.hi == self.lo:
            return (LEFT + WIDTH - RIGHT) / 2
        share = (step - self.lo) / (self.hi - self.lo)
        return round(LEFT + (WIDTH - LEFT - RIGHT) * share, 1)

    def y(self, value: float) -> float:
        plot = HEIGHT - TOP - BOTTOM
        return round(HEIGHT - BOTTOM - plot * min(value, self.top_value) / self.top_value, 1)

    def ticks(self, steps: list[int], label) -> tuple[list[Tick], list[Tick]]:
        shown = sorted({steps[0], steps[len(steps) // 2], steps[-1]})
        x = [Tick(at=self.x(s), label=str(s)) for s in shown]
        y = [
            Tick(at=self.y(self.top_value * i / Y_TICKS), label=label(self.top_value * i / Y_TICKS))
            for i in range(Y_TICKS + 1)
        ]
        return x, y


def _rows(training: Training) -> list[ModelCheckpoint]:
    return list(training.checkpoints.order_by("step"))


def _series(scale, rows, key: str, name: str, css: str) -> Series | None:
    marks = tuple(
        Mark(
            x=scale.x(c.step),
            y=scale.y(getattr(c, key) if hasattr(c, key) else c.linkage["metrics"][key]),
            failed=c.state == ModelCheckpoint.State.DAMAGED,
            title=f"step {c.step}: {name} "
            f"{getattr(c, key) if hasattr(c, key) else c.linkage['metrics'][key]:.4f}",
        )
        for c in rows
        if (getattr(c, key, None) if hasattr(c, key) else c.linkage.get("metrics", {}).get(key))
        is not None
    )
    return Series(name=name, css=css, marks=marks) if marks else None


def loss_chart(training: Training) -> StepChart | None:
    rows = _rows(training)
    if not rows:
        return None
    base = training.base_metrics.get("heldout_loss")
    values = [c.train_loss for c in rows] + [c.heldout_loss or 0 for c in rows] + [base or 0]
    scale = _Linear([c.step for c in rows], 1.05 * max(values))
    series = [
        s
        for s in (
            _series(scale, rows, "train_loss", "training loss", "series-1 reserved"),
            _series(scale, rows, "heldout_loss", "held-out loss", "series-2 reserved"),
        )
        if s
    ]
    # No base line without held-out examples: the worker measures none then.
    rules = (
        [Rule(label=f"base model held-out loss {base:.4f}", css="limit", y=scale.y(base))]
        if base is not None
        else []
    )
    x_ticks, y_ticks = scale.ticks([c.step for c in rows], lambda v: f"{v:.3g}")
    return StepChart(
        label="loss by step",
        x_label="optimizer steps",
        failed_label="damaged checkpoint",
        series=series,
        rules=rules,
        x_ticks=x_ticks,
        y_ticks=y_ticks,
    )


def metric_chart(training: Training) -> StepChart | None:
    """Held-out accuracy (and, for an encoder, cosine stability) by step, 0 to 1."""
    rows = _rows(training)
    if not rows:
        return None
    scale = _Linear([c.step for c in rows], 1.0)
    series = [
        s
        for s in (
            _series(scale, rows, "heldout_accuracy", "held-out accuracy", "series-1 reserved"),
            _series(scale, rows, "cosine_stability", "cosine stability", "series-2 reserved"),
        )
        if s
    ]
    base = training.base_metrics.get("heldout_accuracy")
    rules = (
        [Rule(label=f"base model accuracy {base:.1%}", css="limit", y=scale.y(base))]
        if base is not None
        else []
    )
    x_ticks, y_ticks = scale.ticks([c.step for c in rows], lambda v: f"{v:.0%}")
    return StepChart(
        label="held-out metrics by step",
        x_label="optimizer steps",
        failed_label="damaged checkpoint",
        series=series,
        rules=rules,
        x_ticks=x_ticks,
        y_ticks=y_ticks,
    )
