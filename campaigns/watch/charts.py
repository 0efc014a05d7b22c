"""A run over its wall clock, drawn for the watch panel: server-side SVG in
the profile charts' shapes (campaigns/profiles/charts.py), drawn by the same
template partial.

- items and cost (tokens, pixels) per second, the finished batches summed in
  up to BUCKETS equal slices of the run's time;
- device memory per worker: each batch's peak reserved on CUDA, the
  process's RSS on a CPU;
- GPU utilisation per worker, where NVML gave one (gpuworker/nvml.py).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.template.defaultfilters import filesizeformat

from campaigns.profiles.charts import BOTTOM as MARGIN_BOTTOM
from campaigns.profiles.charts import HEIGHT, LEFT, RIGHT, TOP, WIDTH, Mark, Series, StepChart, Tick

BUCKETS = 48
X_TICKS = 5
#: Workers drawn apart in the per-worker charts; the rest are left out (said).
MAX_WORKERS = 8


class _TimeScale:
    def __init__(self, start: dt.datetime, end: dt.datetime, top_value: float):
        self.start, self.end = start, end
        self.span = max(1.0, (end - start).total_seconds())
        self.top_value = top_value or 1

    def x(self, at: dt.datetime) -> float:
        share = (at - self.start).total_seconds() / self.span
        return round(LEFT + (WIDTH - LEFT - RIGHT) * min(1.0, max(0.0, share)), 1)

    def y(self, value: float) -> float:
        plot = HEIGHT - TOP - MARGIN_BOTTOM
        return round(HEIGHT - MARGIN_BOTTOM - plot * min(value, self.top_value) / self.top_value, 1)

    def x_ticks(self) -> list[Tick]:
        fmt = "%H:%M" if self.span < 86400 else "%m-%d %H:%M"
        return [
            Tick(at=self.x(at), label=at.strftime(fmt))
            for at in (
                self.start + dt.timedelta(seconds=self.span * i / (X_TICKS - 1))
                for i in range(X_TICKS)
            )
        ]

    def y_ticks(self, label) -> list[Tick]:
        return [
            Tick(at=self.y(self.top_value * i / 4), label=label(self.top_value * i / 4))
            for i in range(5)
        ]


def _rate(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"


def _chart(label: str, series: list[Series], scale: _TimeScale, y_label) -> StepChart:
    return StepChart(
        label=label,
        series=series,
        x_ticks=scale.x_ticks(),
        y_ticks=scale.y_ticks(y_label),
        x_label="wall clock, UTC",
        failed_label="",
    )


def rate_charts(rows: list[dict], *, cost_unit: str) -> list[StepChart]:
    """Items/s and cost/s over the run, from finished batches (oldest first)."""
    if len(rows) < 2:
        return []
    start = min(r["started_at"] or r["finished_at"] for r in rows)
    end = max(r["finished_at"] for r in rows)
    span = max(1.0, (end - start).total_seconds())
    width = span / BUCKETS
    items: list[float] = [0.0] * BUCKETS
    cost: list[float] = [0.0] * BUCKETS
    for r in rows:
        i = min(BUCKETS - 1, int((r["finished_at"] - start).total_seconds() / width))
        items[i] += r["size"]
        cost[i] += r["real_tokens"] or 0
    mids = [start + dt.timedelta(seconds=width * (i + 0.5)) for i in range(BUCKETS)]
    charts = []
    for values, what, css in (
        (items, "items per second", "series-1"),
        (cost, f"{cost_unit} per second", "series-2"),
    ):
        per_s = [v / width for v in values]
        if not any(per_s):
            continue
        scale = _TimeScale(start, end, 1.05 * max(per_s))
        marks = tuple(
            Mark(
                x=scale.x(at),
                y=scale.y(v),
                failed=False,
                title=f"{at:%H:%M:%S}: {_rate(v)} {what}",
            )
            for at, v in zip(mids, per_s, strict=True)
        )
        charts.append(_chart(f"{what} over the run", [Series(what, css, marks)], scale, _rate))
    return charts


def worker_charts(rows: list[dict]) -> list[StepChart]:
    """Device memory, and GPU utilisation where measured, per worker and batch."""
    if not rows:
        return []
    start = min(r["started_at"] or r["finished_at"] for r in rows)
    end = max(r["finished_at"] for r in rows)
    by_worker: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by_worker[r["worker"] or "?"].append(r)
    names = sorted(by_worker)[:MAX_WORKERS]
    charts = []
    on_cuda = any(r["mem_peak_reserved"] for r in rows)
    memory_key = "mem_peak_reserved" if on_cuda else "rss"
    memory_what = "device memory reserved at the peak" if on_cuda else "worker process RSS"
    for key, what, label in (
        (memory_key, memory_what, lambda v: filesizeformat(int(v))),
        ("metrics__gpu_util", "GPU utilisation, %", lambda v: f"{v:.0f} %"),
    ):
        values = [r[key] for r in rows if isinstance(r.get(key), int | float)]
        if not values:
            continue
        top = 100.0 if key == "metrics__gpu_util" else 1.05 * max(values)
        scale = _TimeScale(start, end, top)
        series = []
        for index, name in enumerate(names, start=1):
            marks = tuple(
                Mark(
                    x=scale.x(r["finished_at"]),
                    y=scale.y(r[key]),
                    failed=False,
                    title=f"{name}, {r['finished_at']:%H:%M:%S}: {label(r[key])}",
                )
                for r in by_worker[name]
                if isinstance(r.get(key), int | float)
            )
            if marks:
                series.append(Series(name, f"series-{min(index, 4)} worker-{index}", marks))
        if series:
            charts.append(_chart(f"{what} per worker", series, scale, label))
    return charts
