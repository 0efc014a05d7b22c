"""A run over its wall clock, drawn for the watch panel: server-side SVG in
the profile charts' shapes (campaigns/profiles/charts.py), drawn by the same
template partial, from the run's finished batches summed by the database in
BUCKETS equal slices per worker (campaigns/db/run_timeline.py):

- items and cost (tokens, pixels) per second, every worker summed;
- memory per worker: the slice's largest peak reserved on CUDA, the largest
  process RSS on a CPU;
- GPU utilisation per worker, the slice's mean, where NVML gave one
  (gpuworker/nvml.py).
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict

from django.template.defaultfilters import filesizeformat

from campaigns.db.run_timeline import Slice, Timeline
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


def _merged(timeline: Timeline) -> dict[tuple[int, str], list[Slice]]:
    # The last batch's instant is the last slice's end: its row may come apart.
    merged: dict[tuple[int, str], list[Slice]] = defaultdict(list)
    for row in timeline.rows:
        merged[(row.index, row.worker)].append(row)
    return merged


def _mid(timeline: Timeline, index: int) -> dt.datetime:
    return timeline.start + dt.timedelta(seconds=timeline.width * (index + 0.5))


def rate_charts(timeline: Timeline | None, *, cost_unit: str) -> list[StepChart]:
    """Items/s and cost/s over the run, every worker summed a slice."""
    if timeline is None:
        return []
    items = [0.0] * timeline.slices
    cost = [0.0] * timeline.slices
    for row in timeline.rows:
        items[row.index] += row.items
        cost[row.index] += row.cost
    mids = [_mid(timeline, i) for i in range(timeline.slices)]
    charts = []
    for values, what, css in (
        (items, "items per second", "series-1"),
        (cost, f"{cost_unit} per second", "series-2"),
    ):
        per_s = [v / timeline.width for v in values]
        if not any(per_s):
            continue
        scale = _TimeScale(timeline.start, timeline.end, 1.05 * max(per_s))
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


def worker_charts(timeline: Timeline | None) -> list[StepChart]:
    """Memory (the slice's largest), and GPU utilisation where measured (the
    slice's mean), per worker over the run."""
    if timeline is None:
        return []
    merged = _merged(timeline)
    names = sorted({worker for _, worker in merged})[:MAX_WORKERS]
    on_cuda = any(r.mem_peak_reserved for r in timeline.rows)

    def memory(rows: list[Slice]) -> float | None:
        values = [r.mem_peak_reserved if on_cuda else r.rss for r in rows]
        found = [v for v in values if v is not None]
        return float(max(found)) if found else None

    def utilisation(rows: list[Slice]) -> float | None:
        found = [(r.gpu_util, r.batches) for r in rows if r.gpu_util is not None]
        weight = sum(n for _, n in found)
        return sum(u * n for u, n in found) / weight if weight else None

    what = "device memory reserved at the peak" if on_cuda else "worker process RSS"
    charts = []
    for measure, label, text, top in (
        (memory, what, lambda v: filesizeformat(int(v)), None),
        (utilisation, "GPU utilisation, %", lambda v: f"{v:.0f} %", 100.0),
    ):
        points = {
            name: [
                (index, value)
                for (index, worker), rows in sorted(merged.items())
                if worker == name and (value := measure(rows)) is not None
            ]
            for name in names
        }
        values = [v for found in points.values() for _, v in found]
        if not values:
            continue
        scale = _TimeScale(timeline.start, timeline.end, top or 1.05 * max(values))
        series = [
            Series(
                name,
                f"series-{min(n, 4)} worker-{n}",
                tuple(
                    Mark(
                        x=scale.x(_mid(timeline, index)),
                        y=scale.y(value),
                        failed=False,
                        title=f"{name}, {_mid(timeline, index):%H:%M:%S}: {text(value)}",
                    )
                    for index, value in found
                ),
            )
            for n, (name, found) in enumerate(points.items(), start=1)
            if found
        ]
        charts.append(_chart(f"{label} per worker", series, scale, text))
    return charts
