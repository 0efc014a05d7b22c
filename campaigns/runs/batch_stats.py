"""What the batches measured, for the campaign page: policies side by side,
the last batches one by one, memory over the run as a chart, and a warning
when memory creeps up."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property

from django.core.cache import cache
from django.db.models import Count, Sum

from campaigns.db import page_queries
from campaigns.models import Batch, Campaign
from campaigns.runs.memory_errors import splits_text

CHART_BATCHES = 200
RECENT_BATCHES = 10
CREEP_WINDOW = 8
WARM_UP = 3


def padding(real_tokens: int | None, padded_tokens: int | None) -> float | None:
    """Padded over real tokens; None where a processor reports no padded tokens
    (a plugin that reads tokens but pads nothing) or no real ones."""
    if not real_tokens or padded_tokens is None:
        return None
    return padded_tokens / real_tokens


@dataclass
class PolicyRow:
    version: str
    policy: str
    batches: int
    items: int
    real_tokens: int
    padded_tokens: int | None
    seconds: float

    @property
    def padding(self) -> float | None:
        return padding(self.real_tokens, self.padded_tokens)

    @property
    def items_per_second(self) -> float | None:
        return self.items / self.seconds if self.seconds else None

    @property
    def tokens_per_second(self) -> float | None:
        return self.real_tokens / self.seconds if self.seconds else None


# How long cached panels may be reused although no batch finished later than
# the newest one they saw (a node whose clock runs behind may record an older
# finished_at): the panels are at most this stale.
POLICY_CACHE_SECONDS = 60


@dataclass
class BatchPanels:
    """The page's panels drawn from finished batches: they change only when a
    batch finishes."""

    policies: list[PolicyRow]
    recent: list[BatchRow]
    memory_chart: MemoryChart | None
    memory_warning: str | None
    # Of the batches charted, how many ran out of memory and were split.
    split_batches: int = 0
    charted: int = 0


_NOT_READ = object()


def batch_panels(*, campaign: Campaign, newest_finished=_NOT_READ) -> BatchPanels:
    """The policy comparison, the memory chart (drawn) and its warning.

    The aggregate reads every finished batch of the campaign, tens of
    milliseconds at a large campaign (bench/RESULTS.md, "Pages at scale —
    `bench/pages_scale.py`"), the chart the last 200 and formats 800
    points: all are computed again only when a batch finished
    since, which the newest finished_at tells from one index entry
    (batch_done_finished), the key of the cached panels. A caller that read
    that finished_at already (the campaign page's header query) passes it.
    """
    if newest_finished is _NOT_READ:
        newest_finished = page_queries.newest_finished_batch(campaign_id=campaign.pk)
    if newest_finished is None:  # nothing finished yet, or only rows without a time: no key
        return _batch_panels(campaign)
    # The time as the database gives it (a datetime, or text on SQLite),
    # without the space memcached refuses in a key.
    key = f"batch-panels:{campaign.pk}:{str(newest_finished).replace(' ', 'T')}"
    return cache.get_or_set(key, lambda: _batch_panels(campaign), timeout=POLICY_CACHE_SECONDS)


def _batch_panels(campaign: Campaign) -> BatchPanels:
    recent = _recent_rows(campaign)
    chart = _memory_chart(recent)
    if chart is not None:
        # Drawn now, once: the points are kept with the cached panels.
        chart.lines  # noqa: B018
    return BatchPanels(
        policies=_policy_rows(campaign),
        recent=recent[:RECENT_BATCHES],
        memory_chart=chart,
        memory_warning=memory_creep(chart),
        split_batches=sum(1 for row in recent if row.splits),
        charted=len(recent),
    )


class PanelsOnDemand:
    """The panels for a template that caches their markup per newest finished
    batch (`{% cache panels.cache_seconds ... panels.key %}`): read only when
    that fragment is rendered, so a page view on a cache hit neither reads nor
    draws them."""

    def __init__(self, *, campaign: Campaign, newest_finished) -> None:
        self._campaign = campaign
        self._newest_finished = newest_finished
        # As batch_panels' key: the time as the database gives it, no spaces.
        self.key = str(newest_finished).replace(" ", "T")
        # No finished batch with a time: no key, drawn every time (0 = not kept).
        self.cache_seconds = POLICY_CACHE_SECONDS if newest_finished is not None else 0

    @cached_property
    def _panels(self) -> BatchPanels:
        return batch_panels(campaign=self._campaign, newest_finished=self._newest_finished)

    @property
    def policies(self) -> list[PolicyRow]:
        return self._panels.policies

    @property
    def recent(self) -> list[BatchRow]:
        return self._panels.recent

    @property
    def memory_chart(self) -> MemoryChart | None:
        return self._panels.memory_chart

    @property
    def memory_warning(self) -> str | None:
        return self._panels.memory_warning

    @property
    def split_batches(self) -> int:
        return self._panels.split_batches

    @property
    def charted(self) -> int:
        return self._panels.charted


def policy_comparison(*, campaign: Campaign) -> list[PolicyRow]:
    """Per parameter version and batch policy, from every finished batch."""
    return batch_panels(campaign=campaign).policies


def _policy_rows(campaign: Campaign) -> list[PolicyRow]:
    rows = (
        Batch.objects.filter(campaign=campaign, state=Batch.State.DONE)
        .values("version__number", "version__fingerprint", "policy")
        .annotate(
            batches=Count("pk"),
            items=Sum("size"),
            real=Sum("real_tokens"),
            padded=Sum("padded_tokens"),
            seconds=Sum("compute_seconds"),
        )
        .order_by("version__number", "policy")
    )
    return [
        PolicyRow(
            version=f"v{r['version__number']}-{r['version__fingerprint'][:10]}",
            policy=r["policy"] or "original",
            batches=r["batches"],
            items=r["items"] or 0,
            real_tokens=r["real"] or 0,
            # None where no batch reported padded tokens: "—", not 0, as each batch shows.
            padded_tokens=r["padded"],
            seconds=r["seconds"] or 0.0,
        )
        for r in rows
    ]


@dataclass
class MemoryChart:
    series: dict[str, list[int]]  # name -> bytes after each batch, oldest first
    per_worker: bool = False  # a line a worker (several ran the batches)
    width: int = 600  # the plot; the labels of its axes lie outside it
    height: int = 160
    left: int = 64  # room for the memory axis's labels
    bottom_pad: int = 18  # and for the batches axis's

    @property
    def batches(self) -> int:
        return max((len(v) for v in self.series.values()), default=0)

    @property
    def top(self) -> int:
        return max((max(v) for v in self.series.values() if v), default=0) or 1

    @property
    def full_width(self) -> int:
        return self.left + self.width + 8

    @property
    def full_height(self) -> int:
        return self.height + self.bottom_pad + 6

    @property
    def y_ticks(self) -> list[tuple[float, int]]:
        """(y, bytes) at 0, ¼, ½, ¾ and the top: memory from zero, so a flat
        line high up reads as steady, not as a scale cut to exaggerate."""
        top = self.top
        return [(round(self.height + 6 - self.height * i / 4, 1), top * i // 4) for i in range(5)]

    def points(self, name: str) -> str:
        values = self.series[name]
        step = self.width / max(1, len(values) - 1)
        top = self.top  # once, not per point: it scans every series
        return " ".join(
            f"{self.left + i * step:.1f},{self.height + 6 - self.height * v / top:.1f}"
            for i, v in enumerate(values)
        )

    @cached_property
    def lines(self) -> list[tuple[str, str]]:
        return [(name, self.points(name)) for name, v in self.series.items() if v]


# What a batch measured, as BatchRow holds it after its first three fields
# (and batches.csv lists it), then its out-of-memory splits.
SPLITS = ("metrics__oom_splits", "metrics__oom_alone")
GENERATED = ("metrics__generated_tokens",)
MEASURED = (
    "size",
    "real_tokens",
    "padded_tokens",
    "compute_seconds",
    "metrics__seconds",
    "mem_allocated",
    "mem_reserved",
    "mem_peak_allocated",
    "mem_peak_reserved",
    "rss",
)


@dataclass
class BatchRow:
    """One finished batch as the page lists it."""

    pk: int
    finished_at: datetime
    worker: str
    items: int
    real_tokens: int | None
    padded_tokens: int | None
    compute_seconds: float | None  # the model's time
    seconds: float | None  # the whole batch: reads, model, writes, checks, recording
    allocated: int | None
    reserved: int | None
    peak_allocated: int | None
    peak_reserved: int | None
    rss: int | None
    oom_splits: list[int] | None = None  # the sizes halved on out-of-memory
    oom_alone: int | None = None  # units that failed alone at batch 1
    # A text generation's tokens generated (its real tokens count the prompts too).
    generated_tokens: int | None = None

    @property
    def padding(self) -> float | None:
        return padding(self.real_tokens, self.padded_tokens)

    @property
    def generated_per_second(self) -> float | None:
        if self.generated_tokens is None or not self.compute_seconds:
            return None
        return self.generated_tokens / self.compute_seconds

    @property
    def splits(self) -> str:
        """The batch sizes it ran at after out-of-memory, "" if it never split."""
        return splits_text(self.oom_splits, self.oom_alone)


def _recent_rows(campaign: Campaign) -> list[BatchRow]:
    """The last CHART_BATCHES finished batches, newest first: one query for
    the chart and the list of the last few."""
    rows = (
        Batch.objects.filter(campaign=campaign, state=Batch.State.DONE)
        .exclude(finished_at=None)
        .order_by("-finished_at", "-pk")
        .values_list("pk", "finished_at", "worker", *MEASURED, *SPLITS, *GENERATED)[:CHART_BATCHES]
    )
    return [BatchRow(*row) for row in rows]


def memory_chart(*, campaign: Campaign) -> MemoryChart | None:
    return _memory_chart(_recent_rows(campaign))


def _memory_chart(recent: list[BatchRow]) -> MemoryChart | None:
    if not recent:
        return None
    oldest_first = recent[::-1]
    if len({row.worker for row in oldest_first}) > 1:
        return _chart_by_worker(oldest_first)
    names = ("allocated", "reserved", "peak_reserved", "rss")
    labels = ("allocated", "reserved", "peak reserved", "RSS")
    series = {
        label: [getattr(row, name) for row in oldest_first if getattr(row, name) is not None]
        for name, label in zip(names, labels, strict=True)
    }
    series = {name: values for name, values in series.items() if values}
    if "allocated" in series:
        # A CUDA run: the chart is the device's memory. The host's RSS stays
        # on each batch's row; on one axis it would flatten the device lines.
        series.pop("RSS", None)
    return MemoryChart(series=series) if series else None


#: Lines of a chart by worker (the page's four colours).
CHART_WORKERS = 4


def _chart_by_worker(oldest_first: list[BatchRow]) -> MemoryChart | None:
    """Several workers' batches: one line each, of allocated memory on CUDA or
    RSS on a CPU. Each process has its own memory, so their figures
    interleaved in one line zigzag, and hide one process's steady rise."""
    cuda = any(row.allocated is not None for row in oldest_first)
    field, label = ("allocated", "allocated") if cuda else ("rss", "RSS")
    by_worker: dict[str, list[int]] = {}
    for row in oldest_first:
        value = getattr(row, field)
        if value is not None:
            by_worker.setdefault(row.worker or "?", []).append(value)
    busiest = sorted(by_worker, key=lambda w: -len(by_worker[w]))[:CHART_WORKERS]
    series = {f"{label} · {worker}": by_worker[worker] for worker in sorted(busiest)}
    return MemoryChart(series=series, per_worker=True) if series else None


def memory_creep(chart: MemoryChart | None) -> str | None:
    """A warning when memory after a batch rose batch after batch, in any
    one worker's line.

    Allocated on CUDA (what tensors the program keeps alive), RSS on CPU. A
    high reserved figure alone is the caching allocator, not a leak.
    """
    if chart is None:
        return None
    cuda = any(name.startswith("allocated") for name in chart.series)
    name = "allocated" if cuda else "RSS"
    for line, values in chart.series.items():
        if line == name or line.startswith(f"{name} · "):
            warning = _creep(name, line[len(name) + 3 :], values, cuda)
            if warning:
                return warning
    return None


def _creep(name: str, worker: str, values: list[int], cuda: bool) -> str | None:
    # The first batches of a run warm up (model load, allocator caches) and
    # are never a leak.
    values = values[WARM_UP:][-CREEP_WINDOW:]
    if len(values) < CREEP_WINDOW:
        return None
    rises = sum(1 for a, b in zip(values, values[1:], strict=False) if b > a)
    growth = values[-1] - values[0]
    # Allocated memory after a batch should come back to the same level
    # whatever the batch held: any steady rise is kept-alive tensors. RSS also
    # grows with heavier batches (length-grouped runs get heavier as they go)
    # and with the allocator's caches, so only a large steady rise counts.
    threshold = max(values[0] * 0.02, 1 << 20) if cuda else max(values[0] * 0.25, 256 << 20)
    if rises >= CREEP_WINDOW - 2 and growth > threshold:
        where = f" on {worker}" if worker else ""
        return (
            f"{name} memory after a batch rose in {rises} of the last {CREEP_WINDOW - 1} batches"
            f"{where} (+{growth / (1 << 20):.1f} MiB): something keeps results alive between "
            "batches. "
            "Stop growing the batch and look before it saturates mid-corpus."
        )
    return None
