"""Measure before growing the batch: the largest batch that keeps a memory margin
on the campaign's *heaviest* inputs, not on whatever came first.

0. Probe: inputs a run already failed on (memory, time, a model error), each
   alone; one the model raises on is a sample failure, not the profile's end.
1. Count sweep: items of one typical size (the sample's median bucket), the
   batch doubled until it fails (out of memory, or peak reserved memory over
   the budget), then a binary search between the last fit and the first
   failure.
2. Heaviest sweep: the sizes that fitted, again, on the heaviest items, from
   small to large, then a binary search; the chosen size is the largest whose
   peak reserved memory stays under (1 − margin) × budget.
3. Unusual inputs (the widest and tallest images, the lightest inputs, the
   longest and shortest files): the chosen size on each kind; one that does
   not keep the margin lowers it.
4. Leak check: the chosen size repeated; allocated memory after each batch
   must come back to its baseline, neither growing nor staying above it.
5. Outputs: a few sample items per cost bucket, every output written and
   checked, so the estimate weighs the disk by the corpus's own mix.

Budget: device memory on CUDA; on CPU the configured budget against process
RSS, so the same logic runs, and is tested, without a GPU.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from django.conf import settings
from django.utils import timezone

from campaigns.intake.inputs import InputError, read_bytes
from campaigns.models import ErrorClass, Profile, Unit, UnitState
from campaigns.profiles import estimates
from campaigns.profiles.corpus import cost_bucket, padded_cost, policy_comparison
from campaigns.profiles.sample import RUN_FAILURES, SHAPE_KINDS, sample_build, unusual_units
from campaigns.profiles.tiers import HARD_PHASES
from campaigns.specs.processors import get_spec
from campaigns.storage.outputs import check_read_back, write_atomic, write_atomic_group
from campaigns.storage.row_shards import SUFFIX as ROW_SHARD_SUFFIX
from campaigns.storage.row_shards import make_row_shard
from campaigns.storage.vector_shards import make_shard
from gpuworker import training_profile
from gpuworker.heartbeat import Heartbeat
from gpuworker.memory import (
    StepMemory,
    allocated_now,
    device_memory,
    release_cached,
    runtime_facts,
    workers_per_device,
)
from gpuworker.processors import get_processor, row_sharded, sharded
from gpuworker.processors.base import RowShardedProcessor

log = logging.getLogger(__name__)
MiB = 1024 * 1024
# The binary search stops when the gap between the last fit and the first
# failure is at most 1/16 of the last fit (or 1 item), or after this many
# bisections: the chosen size is within about 6% of the largest that fits.
BINARY_STEPS = 6
BINARY_PRECISION = 16
LEAK_REPEATS = 4
# Growth per batch below this is noise, not a leak (RSS moves with the heap).
LEAK_TOLERANCE = {"cuda": 1 * MiB, "cpu": 8 * MiB}
# Memory kept above the baseline after every repeat, below this, is noise:
# the CUDA allocator's rounding; on CPU, heap pages glibc does not return.
RETAINED_TOLERANCE = {"cuda": 8 * MiB, "cpu": 48 * MiB}
WRITES_PER_STEP = 8
UNUSUAL_EACH = 2
OUTPUTS_PER_BUCKET = 3


class _Sample:
    """The sample's prepared inputs: (unit, model input, cost, seconds to prepare)."""

    def __init__(self, profile: Profile, processor):
        root = Path(profile.campaign.input_root)
        units = Unit.objects.filter(pk__in=profile.sample).order_by("pk")
        # Read as a batch reads them: a text only as far as the model uses it.
        limits = get_spec(profile.campaign.processor).input_limits(profile.version.params)
        self.items, self.failed = [], []
        for unit in units:
            started = time.perf_counter()
            try:
                item = processor.prepare(read_bytes(root, unit.source_path, limits=limits))
            except InputError as exc:
                # A bad input fails cleanly here as in a run; it is reported, not fatal.
                self.failed.append({"uid": unit.uid, "error": exc.error_class})
                continue
            self.items.append((unit, item, unit.cost or 1, time.perf_counter() - started))
        heavy = set(profile.heavy)
        self.heaviest = sorted(
            (row for row in self.items if row[0].pk in heavy), key=lambda row: -row[2]
        )
        ordinary = sorted((row for row in self.items if row[0].pk not in heavy), key=lambda r: r[2])
        self.typical = _median_bucket(ordinary) or self.items
        self.failed_in_run = [
            row
            for row in self.items
            if row[0].state == UnitState.FAILED and row[0].error_class in RUN_FAILURES
        ]
        # The unusual kinds among the sample's readable inputs: the sample was
        # built to hold the corpus's extremes, so they are the sample's too
        # (and a re-run finds the same ones). A cost extreme the count or
        # heaviest sweep already runs is not run again; a shape always is, in
        # a batch of its own (mixed with square ones, it hides its worst case).
        by_pk = {row[0].pk: row for row in self.items}
        covered = heavy | {row[0].pk for row in self.typical}
        kinds = unusual_units(
            campaign=profile.campaign,
            units=Unit.objects.filter(pk__in=list(by_pk)),
            each=UNUSUAL_EACH,
        )
        self.unusual = {
            kind: [by_pk[pk] for pk in ids if kind in SHAPE_KINDS or pk not in covered]
            for kind, ids in kinds.items()
        }
        self.unusual = {kind: rows for kind, rows in self.unusual.items() if rows}

    def drop(self, rows: list, error: str) -> None:
        """Inputs the model raised on: a sample failure with its reason, run no more."""
        gone = {row[0].pk for row in rows}
        self.failed.extend({"uid": row[0].uid, "error": error} for row in rows)
        self.items = [row for row in self.items if row[0].pk not in gone]
        self.heaviest = [row for row in self.heaviest if row[0].pk not in gone]
        self.failed_in_run = [row for row in self.failed_in_run if row[0].pk not in gone]
        self.typical = [row for row in self.typical if row[0].pk not in gone] or self.items
        self.unusual = {
            kind: kept
            for kind, rows_of in self.unusual.items()
            if (kept := [row for row in rows_of if row[0].pk not in gone])
        }

    def tried(self) -> list[dict]:
        """The hard inputs the profile ran, and why each was picked."""
        failed_before = {row[0].pk for row in self.failed_in_run}
        rows = [
            {
                "uid": row[0].uid,
                "cost": row[2],
                "why": f"failed before: {row[0].error_class}"
                if row[0].pk in failed_before
                else "heaviest",
            }
            for row in self.heaviest
        ]
        for kind, kind_rows in self.unusual.items():
            rows.extend({"uid": row[0].uid, "cost": row[2], "why": kind} for row in kind_rows)
        return rows


def _median_bucket(rows: list) -> list:
    """Items within ±25% of the median cost: one item format for the count sweep."""
    if not rows:
        return []
    median = rows[len(rows) // 2][2]
    return [row for row in rows if 0.75 * median <= row[2] <= 1.25 * median]


class _Stepper:
    def __init__(self, profile: Profile, processor, budget: int, workdir: Path):
        self.profile, self.processor, self.budget, self.workdir = (
            profile,
            processor,
            budget,
            workdir,
        )
        self.device = getattr(processor, "device", torch.device("cpu"))
        self.padding = get_spec(profile.campaign.processor).padding
        self.steps: list[dict] = []

    def _run(self, items: list):
        # A processor whose memory depends on how its batch ends (a text
        # generation that may stop early) measures its longest run instead.
        longest = getattr(self.processor, "run_longest", None)
        return longest(items) if longest is not None else self.processor.run(items)

    def run(
        self,
        rows: list,
        size: int,
        phase: str,
        limit: int,
        *,
        kind: str = "",
        tolerate: bool = False,
        write_all: bool = False,
    ) -> dict:
        """One batch of `size` items cycled from `rows`, measured.

        tolerate: an exception other than out-of-memory is the step's error
        (an input the model raises on), not the profile's end.
        write_all: every output written and checked, not the first few.
        """
        batch = [rows[i % len(rows)] for i in range(size)]
        costs = [cost for _, _, cost, _ in batch]
        release_cached(self.device)
        result, oom, error = None, False, ""
        started = time.perf_counter()
        with StepMemory(self.device) as memory:
            try:
                result = self._run([item for _, item, _, _ in batch])
            except torch.OutOfMemoryError:
                oom = True
            except Exception as exc:
                if not tolerate:
                    raise
                error = f"{type(exc).__name__}: {exc}"
        compute = time.perf_counter() - started
        step = {
            "phase": phase,
            **({"kind": kind} if kind else {}),
            "batch_size": size,
            "compute_s": round(compute, 5),
            "prepare_s": round(sum(seconds for *_, seconds in batch), 5),
            "padded": padded_cost(self.padding, costs),
            "real": sum(costs),
            "max_cost": max(costs),
            "peak_allocated": memory.peak_allocated,
            "peak_reserved": memory.peak_reserved,
            "limit": limit,
            "oom": oom,
        }
        if error:
            step["error"] = error
        if result is None:
            release_cached(self.device)
            step.update(fits=False, write_s_per_item=0.0, items_per_s=None, tokens_per_s=None)
        else:
            step.update(self._writes(result, costs, phase, write_all=write_all))
            metrics = self.processor.batch_metrics(result)
            real = metrics.get("real_tokens") or step["real"]
            step.update(
                fits=memory.peak_reserved <= limit,
                items_per_s=round(size / compute, 2),
                tokens_per_s=round(real / compute, 1),
                real_tokens=metrics.get("real_tokens"),
                padded_tokens=metrics.get("padded_tokens"),
            )
        del result
        self.steps.append(step)
        # Saved as measured: the report page, which polls, shows each step as
        # it lands (a CPU profile takes minutes) and a worker that dies
        # mid-profile leaves what it had measured.
        Profile.objects.filter(pk=self.profile.pk).update(steps=self.steps)
        log.debug("profile %s: %s", self.profile.pk, step)
        return step

    def _writes(self, result, costs: list[int], phase: str, *, write_all: bool) -> dict:
        """Write and check outputs, as a run would: their time, and each one's size
        with its input's cost (the estimate weighs the disk per cost bucket)."""
        size = len(costs)
        count = size if write_all else min(WRITES_PER_STEP, size)
        if sharded(self.processor):
            return self._shard_write(result, costs, phase, count)
        if row_sharded(self.processor):
            return self._row_shard_write(self.processor, result, costs, phase, count)
        suffix = getattr(self.processor, "suffix", "") or ""
        started = time.perf_counter()
        paths = [self.workdir / f"{phase}-{size}-{index}{suffix}" for index in range(count)]
        # One group write, as the batch runner writes a batch's outputs.
        written = write_atomic_group(
            (path, self.processor.serialize(self.processor.output(result, index)))
            for index, path in enumerate(paths)
        )
        outputs = []
        for index, (path, file) in enumerate(zip(paths, written, strict=True)):
            if isinstance(file, OSError):
                raise file
            outputs.append([costs[index], file.size])
            self.processor.validate(path)
        return {
            "write_s_per_item": round((time.perf_counter() - started) / count, 6),
            "output_bytes_per_item": sum(b for _, b in outputs) // count,
            "outputs": outputs,
        }

    def _row_shard_write(
        self, processor: RowShardedProcessor, result, costs: list[int], phase: str, count: int
    ) -> dict:
        """The batch's JSON rows in one shard, read back and checked, as a run
        writes them; each row's size its line's."""
        started = time.perf_counter()
        path = self.workdir / f"{phase}-{len(costs)}{ROW_SHARD_SUFFIX}"
        records = [processor.row_record(processor.output(result, i)) for i in range(count)]
        # Ids and input digests as long as a run's lines carry (a unit id of
        # a dozen characters), so each line's size is a run's.
        ids = [f"unit-{i:07d}" for i in range(count)]
        data, shard = make_row_shard(ids, records, ["0" * 64] * count)
        write_atomic(path, data)
        check_read_back(path, data)
        bad = next((p for p in map(processor.check_record, shard.records) if p is not None), None)
        if bad is not None:
            raise bad
        return {
            "write_s_per_item": round((time.perf_counter() - started) / count, 6),
            "output_bytes_per_item": len(data) // count,
            "outputs": [[costs[i], len(shard.lines[i]) + 1] for i in range(count)],
        }

    def _shard_write(self, result, costs: list[int], phase: str, count: int) -> dict:
        """The batch's rows in one shard, read back and checked, as a run writes them;
        a shard's size shared over its rows."""
        started = time.perf_counter()
        path = self.workdir / f"{phase}-{len(costs)}.npz"
        vectors = np.stack([self.processor.output(result, i) for i in range(count)])
        data, shard = make_shard([str(i) for i in range(count)], vectors)
        written = write_atomic(path, data)
        check_read_back(path, data)
        problems = self.processor.check_rows(shard.vectors)
        bad = next((p for p in problems if p is not None), None)
        if bad is not None:
            raise bad
        per_row = written.size // count
        return {
            "write_s_per_item": round((time.perf_counter() - started) / count, 6),
            "output_bytes_per_item": per_row,
            "outputs": [[costs[i], per_row] for i in range(count)],
        }


def _largest_fit(stepper: _Stepper, rows: list, phase: str, limit: int, sizes, **extra) -> int:
    """Grow through `sizes` while they fit, then bisect up to the first failure
    (to within 1/BINARY_PRECISION of the last fit, BINARY_STEPS at most)."""
    last_fit, first_fail = 0, None
    for size in sizes:
        if stepper.run(rows, size, phase, limit, **extra)["fits"]:
            last_fit = size
        else:
            first_fail = size
            break
    if first_fail is None:
        return last_fit
    for _ in range(BINARY_STEPS):
        if first_fail - last_fit <= max(1, last_fit // BINARY_PRECISION):
            break
        middle = (last_fit + first_fail) // 2
        if stepper.run(rows, middle, phase, limit, **extra)["fits"]:
            last_fit = middle
        else:
            first_fail = middle
    return last_fit


def _doubling(upto: int) -> list[int]:
    sizes, size = [], 1
    while size < upto:
        sizes.append(size)
        size *= 2
    return [*sizes, upto]


def _leak_check(stepper: _Stepper, rows: list, size: int, limit: int) -> dict:
    device = stepper.device
    baseline = allocated_now(device)
    after = []
    for _ in range(LEAK_REPEATS):
        stepper.run(rows, size, "leak check", limit)
        after.append(allocated_now(device))
    kind = "cuda" if device.type == "cuda" else "cpu"
    return leak_verdict(
        baseline,
        after,
        per_batch=LEAK_TOLERANCE[kind],
        retained=RETAINED_TOLERANCE[kind],
    )


def leak_verdict(baseline: int, after: list[int], *, per_batch: int, retained: int) -> dict:
    """Does allocated memory come back to its baseline after each repeat?

    Each repeat's memory after it is compared with the baseline taken before
    the first. Two ways it does not: it grows, the least-squares slope over
    the repeats (which catches a leak every other batch as well as a steady
    one), by more than `per_batch` a batch and still up at the end; or it
    stays up, never coming back within `retained` of the baseline (memory
    kept after the first batch: a cache, a last batch held by a reference).
    """
    kept = [value - baseline for value in after]
    n = len(kept)
    mean_x, mean_y = (n - 1) / 2, sum(kept) / n
    var = sum((x - mean_x) ** 2 for x in range(n))
    slope = sum((x - mean_x) * (y - mean_y) for x, y in enumerate(kept)) / var if var else 0.0
    growing = slope > per_batch and kept[-1] - kept[0] > per_batch
    held = min(kept)
    staying = held > retained
    if growing:
        message = (
            f"allocated memory grows by {slope / MiB:.1f} MiB per batch "
            f"({kept[-1] / MiB:.0f} MiB above the baseline after {n} batches): something "
            "keeps tensors alive between batches"
        )
    elif staying:
        message = (
            f"allocated memory stays {held / MiB:.0f} MiB above its baseline after the first "
            "batch and does not come back: something keeps tensors (a cache, the last "
            "batch) alive"
        )
    else:
        message = "allocated memory comes back to its baseline after each batch"
    return {
        "baseline": baseline,
        "after": after,
        "kept": kept,
        "growth_per_batch": round(slope),
        "retained": held,
        "leak": growing or staying,
        "message": message,
    }


def _probe(stepper: _Stepper, sample: _Sample, limit: int) -> None:
    """Inputs a run failed on before (memory, time, a model error), each alone:
    one the model raises on leaves the sample with its reason."""
    for row in list(sample.failed_in_run):
        step = stepper.run([row], 1, "probe", limit, kind=row[0].uid, tolerate=True)
        if step.get("error"):
            sample.drop([row], error=f"{ErrorClass.PROCESSING_ERROR}: {step['error']}")


def _unusual_check(
    stepper: _Stepper, sample: _Sample, chosen: int, limit: int, sizes: list[int]
) -> tuple[int, str]:
    """The chosen size on each unusual kind; one that does not keep the margin
    lowers it (the sizes below it, grown then bisected). Returns the size and
    the kind that set it ("" when none did)."""
    blocker = ""
    for kind, rows in list(sample.unusual.items()):
        if not chosen:
            break
        step = stepper.run(rows, chosen, "unusual", limit, kind=kind, tolerate=True)
        if step.get("error"):
            sample.drop(rows, error=f"{ErrorClass.PROCESSING_ERROR}: {step['error']}")
            continue
        if step["fits"]:
            continue
        smaller = [size for size in sizes if size < chosen]
        chosen = _largest_fit(stepper, rows, "unusual", limit, smaller, kind=kind)
        blocker = kind
    return chosen, blocker


def _output_pass(stepper: _Stepper, sample: _Sample, size: int, limit: int) -> None:
    """A few sample items from every cost bucket, every output written and checked."""
    buckets: dict[int, list] = {}
    for row in sorted(sample.items, key=lambda r: (r[2], r[0].pk)):
        bucket = buckets.setdefault(cost_bucket(row[2]), [])
        if len(bucket) < OUTPUTS_PER_BUCKET:
            bucket.append(row)
    picked = [row for rows in buckets.values() for row in rows]
    for start in range(0, len(picked), size):
        chunk = picked[start : start + size]
        stepper.run(chunk, len(chunk), "outputs", limit, tolerate=True, write_all=True)


# What a measurement writes (a failed one: those it has); the state and
# heartbeat_at are not its own.
_MEASURED = [
    f.name
    for f in Profile._meta.concrete_fields
    if f.name not in ("id", "campaign", "version", "state", "heartbeat_at", "created_at")
]


def profile_run(profile_id: int) -> str:
    profile = Profile.objects.select_related("campaign", "version").filter(pk=profile_id).first()
    if profile is None:
        return "gone"
    claimed = Profile.objects.filter(pk=profile_id, state=Profile.State.QUEUED).update(
        state=Profile.State.RUNNING, heartbeat_at=timezone.now()
    )
    if not claimed:
        return "not runnable"
    profile.state = Profile.State.RUNNING
    held = Profile.objects.filter(pk=profile_id, state=Profile.State.RUNNING)
    heartbeat = Heartbeat(held, settings.PROFILE_HEARTBEAT_SECONDS, f"profile {profile_id}")
    workdir = Path(tempfile.mkdtemp(prefix=f"profile-{profile_id}-"))
    try:
        with heartbeat:
            return _profile(profile, heartbeat, workdir)
    except Exception as exc:
        log.exception("profile %s failed", profile_id)
        # What it had measured stays on the report, unless the sweeper already
        # failed it (then held is empty and its verdict stands).
        kept = {
            field: getattr(profile, field)
            for field in _MEASURED
            if field not in ("error", "finished_at") and getattr(profile, field)
        }
        held.update(
            **kept,
            state=Profile.State.FAILED,
            error=f"{type(exc).__name__}: {exc}",
            finished_at=timezone.now(),
        )
        return "failed"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def _profile(profile: Profile, heartbeat: Heartbeat, workdir: Path) -> str:
    if not profile.sample:
        profile.sample, profile.heavy = sample_build(
            campaign=profile.campaign, version=profile.version
        )
        profile.save(update_fields=["sample", "heavy"])
    training = get_spec(profile.campaign.processor).training
    if training:
        training_profile.measure(profile)  # a training step, not an inference batch
    else:
        _measure(profile, workdir)
    heartbeat.beat()
    if heartbeat.lost:
        # The sweeper failed it while this worker looked dead: its verdict stands.
        log.warning("profile %s: failed by the sweeper meanwhile; results dropped", profile.pk)
        return "lost"
    profile.finished_at = timezone.now()
    # Still running: the estimate reads what was measured. Not the state nor
    # the heartbeat, which the sweeper and the heartbeat's thread own.
    profile.save(update_fields=_MEASURED)
    if profile.chosen_batch_size and training:
        training_profile.estimate_build(profile)
    elif profile.chosen_batch_size:
        estimates.estimate_build(profile=profile)
    # Done only once the estimate exists, so a page (or a test) that sees
    # "done" finds it; no batch fitting even one heaviest input is a failure.
    profile.state = Profile.State.DONE if profile.chosen_batch_size else Profile.State.FAILED
    if not Profile.objects.filter(pk=profile.pk, state=Profile.State.RUNNING).update(
        state=profile.state
    ):
        log.warning("profile %s: failed by the sweeper meanwhile; not marked done", profile.pk)
        return "lost"
    return profile.state


def record_device(profile: Profile, device: torch.device) -> int:
    """The device, its runtime facts and the memory budget on the profile; the budget."""
    if profile.memory_budget:
        budget, source = profile.memory_budget, "given"
    elif memory := device_memory(device):
        budget, source = memory, "device memory"
    else:
        budget = settings.PROFILE_CPU_MEMORY_BUDGET_MB * MiB // workers_per_device()
        source = "PROFILE_CPU_MEMORY_BUDGET_MB"
    if source != "given" and workers_per_device() > 1:
        source += f" ÷ {workers_per_device()} (WORKERS_PER_DEVICE)"
    # Where the budget came from: a re-run keeps a given one, and reads a
    # device's memory again on its own device.
    facts = {**runtime_facts(), "budget_source": source}
    profile.memory_budget = budget
    profile.runtime = facts
    profile.device = (
        facts.get("device") if device.type == "cuda" else f"CPU ({facts.get('threads')} threads)"
    )
    return budget


def _measure(profile: Profile, workdir: Path) -> None:
    processor = get_processor(
        profile.campaign.processor, profile.version.params, profile.version.software.get("files")
    )
    budget = record_device(profile, getattr(processor, "device", torch.device("cpu")))
    # The device and its budget on the page while the steps come in.
    profile.save(update_fields=["memory_budget", "runtime", "device"])
    sample = _Sample(profile, processor)
    if not sample.items:
        raise ValueError("no input of the sample could be read: nothing to measure")
    stepper = _Stepper(profile, processor, budget, workdir)
    safe_limit = int((1 - profile.margin) * budget)
    # 0. inputs a run failed on before, each alone
    _probe(stepper, sample, budget)
    if not sample.items:
        raise ValueError("the model raised on every input of the sample: nothing to measure")
    # 1. how many items of one typical size fit at all
    typical_max = _largest_fit(
        stepper, sample.typical, "count", budget, _doubling(profile.max_batch_size)
    )
    # 2. the same sizes on the heaviest items, with the margin
    heaviest = sample.heaviest or sample.items
    tried = sorted({s["batch_size"] for s in stepper.steps if s["phase"] == "count" and s["fits"]})
    candidates = [size for size in tried if size <= typical_max] or [1]
    chosen = _largest_fit(stepper, heaviest, "heaviest", safe_limit, candidates)
    # 3. the unusual inputs at that size
    blocker = ""
    if chosen:
        sizes = sorted({s["batch_size"] for s in stepper.steps if s["phase"] == "heaviest"})
        chosen, blocker = _unusual_check(stepper, sample, chosen, safe_limit, sizes)
    profile.steps = stepper.steps
    profile.heaviest_tried = sample.tried()
    profile.sample_failures = sample.failed
    if not chosen:
        profile.chosen_batch_size = None
        which = f"the {blocker} inputs" if blocker else "the heaviest inputs"
        profile.error = (
            f"even one of {which} needs more than "
            f"{safe_limit / MiB:.0f} MiB ({100 * (1 - profile.margin):.0f}% of the budget): "
            "lower max_tokens, use a larger card, or refuse such inputs"
        )
        return
    chosen_step = max(
        (
            s
            for s in stepper.steps
            if s["phase"] in HARD_PHASES
            and s["batch_size"] == chosen
            and s["fits"]
            and not s.get("error")
        ),
        key=lambda s: s["peak_reserved"],
    )
    profile.chosen_batch_size = chosen
    profile.chosen_peak_reserved = chosen_step["peak_reserved"]
    # 4. the chosen size again: memory must come back after each batch
    profile.leak = _leak_check(stepper, heaviest, chosen, safe_limit)
    # 5. outputs across the cost buckets, for the disk estimate
    _output_pass(stepper, sample, chosen, safe_limit)
    profile.steps = stepper.steps
    profile.sample_failures = sample.failed
    profile.heaviest_tried = sample.tried()
    profile.policies = policy_comparison(
        campaign=profile.campaign,
        params=profile.version.params,
        batch_size=chosen,
        token_budget=chosen * max(row[2] for row in heaviest),
    )
