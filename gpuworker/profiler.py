"""Measure before growing the batch: the largest batch that keeps a memory margin
on the campaign's *heaviest* inputs, not on whatever came first.

1. Count sweep: items of one typical size (the sample's median bucket), the
   batch doubled until it fails (out of memory, or peak reserved memory over
   the budget), then a binary search between the last fit and the first
   failure.
2. Heaviest sweep: the sizes that fitted, again, on the heaviest items, from
   small to large, then a binary search; the chosen size is the largest whose
   peak reserved memory stays under (1 − margin) × budget.
3. Leak check: the chosen size repeated; allocated memory after each batch
   must come back to its baseline.

Budget: device memory on CUDA; on CPU the configured budget against process
RSS, so the same logic runs, and is tested, without a GPU.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path

import torch
from django.conf import settings
from django.utils import timezone

from campaigns import profiling
from campaigns.inputs import InputError, read_bytes
from campaigns.models import Profile, Unit
from campaigns.outputs import write_atomic
from campaigns.processor_specs import get_spec

from . import training_profile
from .memory import StepMemory, allocated_now, device_memory, release_cached, runtime_facts
from .processors import get_processor

log = logging.getLogger(__name__)
MiB = 1024 * 1024
BINARY_STEPS = 6
LEAK_REPEATS = 4
# Growth per batch below this is noise, not a leak (RSS moves with the heap).
LEAK_TOLERANCE = {"cuda": 1 * MiB, "cpu": 8 * MiB}
WRITES_PER_STEP = 8


class _Sample:
    """The sample's prepared inputs: (unit, model input, cost, seconds to prepare)."""

    def __init__(self, profile: Profile, processor):
        root = Path(profile.campaign.input_root)
        units = Unit.objects.filter(pk__in=profile.sample).order_by("pk")
        self.items, self.failed = [], []
        for unit in units:
            started = time.perf_counter()
            try:
                item = processor.prepare(read_bytes(root, unit.source_path))
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

    def run(self, rows: list, size: int, phase: str, limit: int) -> dict:
        batch = [rows[i % len(rows)] for i in range(size)]
        costs = [cost for _, _, cost, _ in batch]
        release_cached(self.device)
        result, oom = None, False
        started = time.perf_counter()
        with StepMemory(self.device) as memory:
            try:
                result = self.processor.run([item for _, item, _, _ in batch])
            except torch.OutOfMemoryError:
                oom = True
        compute = time.perf_counter() - started
        step = {
            "phase": phase,
            "batch_size": size,
            "compute_s": round(compute, 5),
            "prepare_s": round(sum(seconds for *_, seconds in batch), 5),
            "padded": profiling.padded_cost(self.padding, costs),
            "real": sum(costs),
            "max_cost": max(costs),
            "peak_allocated": memory.peak_allocated,
            "peak_reserved": memory.peak_reserved,
            "limit": limit,
            "oom": oom,
        }
        if result is None:
            release_cached(self.device)
            step.update(fits=False, write_s_per_item=0.0, items_per_s=None, tokens_per_s=None)
        else:
            step.update(self._writes(result, size, phase))
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
        log.debug("profile %s: %s", self.profile.pk, step)
        return step

    def _writes(self, result, size: int, phase: str) -> dict:
        """Write and check a few outputs, as a run would: their time and size."""
        count = min(WRITES_PER_STEP, size)
        suffix = getattr(self.processor, "suffix", "") or ""
        started, written = time.perf_counter(), 0
        for index in range(count):
            data = self.processor.serialize(self.processor.output(result, index))
            path = self.workdir / f"{phase}-{size}-{index}{suffix}"
            written += write_atomic(path, data).size
            self.processor.validate(path)
        return {
            "write_s_per_item": round((time.perf_counter() - started) / count, 6),
            "output_bytes_per_item": written // count,
        }


def _largest_fit(stepper: _Stepper, rows: list, phase: str, limit: int, sizes) -> int:
    """Grow through `sizes` while they fit, then bisect up to the first failure."""
    last_fit, first_fail = 0, None
    for size in sizes:
        if stepper.run(rows, size, phase, limit)["fits"]:
            last_fit = size
        else:
            first_fail = size
            break
    if first_fail is None:
        return last_fit
    for _ in range(BINARY_STEPS):
        if first_fail - last_fit <= max(1, last_fit // 16):
            break
        middle = (last_fit + first_fail) // 2
        if stepper.run(rows, middle, phase, limit)["fits"]:
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
    growth = (after[-1] - after[0]) / (len(after) - 1)
    rising = all(b > a for a, b in zip(after, after[1:], strict=False))
    leak = rising and growth > LEAK_TOLERANCE["cuda" if device.type == "cuda" else "cpu"]
    return {
        "baseline": baseline,
        "after": after,
        "growth_per_batch": growth,
        "leak": leak,
        "message": (
            f"allocated memory grows by {growth / MiB:.1f} MiB per batch: something keeps "
            "tensors alive between batches"
            if leak
            else "allocated memory comes back to its baseline after each batch"
        ),
    }


def profile_run(profile_id: int) -> str:
    profile = Profile.objects.select_related("campaign", "version").filter(pk=profile_id).first()
    if profile is None:
        return "gone"
    claimed = Profile.objects.filter(pk=profile_id, state=Profile.State.QUEUED).update(
        state=Profile.State.RUNNING
    )
    if not claimed:
        return "not runnable"
    workdir = Path(tempfile.mkdtemp(prefix=f"profile-{profile_id}-"))
    try:
        if not profile.sample:
            profile.sample, profile.heavy = profiling.sample_build(campaign=profile.campaign)
        training = get_spec(profile.campaign.processor).training
        if training:
            training_profile.measure(profile)  # a training step, not an inference batch
        else:
            _measure(profile, workdir)
        profile.finished_at = timezone.now()
        profile.save()  # still running: the estimate reads what was measured
        if profile.chosen_batch_size and training:
            training_profile.estimate_build(profile)
        elif profile.chosen_batch_size:
            profiling.estimate_build(profile=profile)
        # Done only once the estimate exists, so a page (or a test) that sees
        # "done" finds it; no batch fitting even one heaviest input is a failure.
        profile.state = Profile.State.DONE if profile.chosen_batch_size else Profile.State.FAILED
        profile.save(update_fields=["state"])
        return profile.state
    except Exception as exc:
        log.exception("profile %s failed", profile_id)
        profile.state = Profile.State.FAILED
        profile.error = f"{type(exc).__name__}: {exc}"
        profile.finished_at = timezone.now()
        profile.save()
        return "failed"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def record_device(profile: Profile, device: torch.device) -> int:
    """The device, its runtime facts and the memory budget on the profile; the budget."""
    budget = (
        profile.memory_budget
        or device_memory(device)
        or settings.PROFILE_CPU_MEMORY_BUDGET_MB * MiB
    )
    facts = runtime_facts()
    profile.memory_budget = budget
    profile.runtime = facts
    profile.device = (
        facts.get("device") if device.type == "cuda" else f"CPU ({facts.get('threads')} threads)"
    )
    return budget


def _measure(profile: Profile, workdir: Path) -> None:
    processor = get_processor(profile.campaign.processor, profile.version.params)
    budget = record_device(profile, getattr(processor, "device", torch.device("cpu")))
    sample = _Sample(profile, processor)
    if not sample.items:
        raise ValueError("no input of the sample could be read: nothing to measure")
    stepper = _Stepper(profile, processor, budget, workdir)
    # 1. how many items of one typical size fit at all
    typical_max = _largest_fit(
        stepper, sample.typical, "count", budget, _doubling(profile.max_batch_size)
    )
    # 2. the same sizes on the heaviest items, with the margin
    heaviest = sample.heaviest or sample.items
    safe_limit = int((1 - profile.margin) * budget)
    tried = sorted({s["batch_size"] for s in stepper.steps if s["fits"]})
    candidates = [size for size in tried if size <= typical_max] or [1]
    chosen = _largest_fit(stepper, heaviest, "heaviest", safe_limit, candidates)
    profile.steps = stepper.steps
    profile.heaviest_tried = [{"uid": row[0].uid, "cost": row[2]} for row in heaviest]
    profile.sample_failures = sample.failed
    if not chosen:
        profile.chosen_batch_size = None
        profile.error = (
            "even one of the heaviest inputs needs more than "
            f"{safe_limit / MiB:.0f} MiB ({100 * (1 - profile.margin):.0f}% of the budget): "
            "lower max_tokens, use a larger card, or refuse such inputs"
        )
        return
    chosen_step = max(
        (s for s in stepper.steps if s["phase"] == "heaviest" and s["batch_size"] == chosen),
        key=lambda s: s["peak_reserved"],
    )
    profile.chosen_batch_size = chosen
    profile.chosen_peak_reserved = chosen_step["peak_reserved"]
    # 3. the chosen size again: memory must come back after each batch
    profile.leak = _leak_check(stepper, heaviest, chosen, safe_limit)
    profile.steps = stepper.steps
    profile.policies = profiling.policy_comparison(
        campaign=profile.campaign,
        params=profile.version.params,
        batch_size=chosen,
        token_budget=chosen * max(row[2] for row in heaviest),
    )
