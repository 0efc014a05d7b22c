"""The batch-size profile of a training: weights, gradients, optimizer states and
activations measured apart, on the heaviest examples, with the margin.

A training step holds far more than inference: the weights, a gradient per
trainable weight, the optimizer's states (two per weight for AdamW) and the
activations kept for the backward pass. The first three are counted exactly
from the tensors; activations are what the step's peak adds on top (peak
allocated on CUDA; on the CPU the RSS peak over the step, which also counts
the allocator's slack — said so on the report). The largest batch whose peak
(reserved on CUDA) stays under (1 − margin) × the budget is chosen, and the
estimate is epochs × steps × the measured seconds per step.
"""

from __future__ import annotations

import math
import time

import torch

from campaigns.adaptation.estimate import training_overhead
from campaigns.models import Estimate, Profile, Unit
from campaigns.profiles.estimates import estimate_from_hours
from gpuworker.memory import StepMemory, allocated_now, release_cached
from gpuworker.training import TrainParams

MiB = 1024 * 1024


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _optimizer_bytes(optimizer) -> int:
    return sum(
        _bytes(v for v in state.values() if torch.is_tensor(v))
        for state in optimizer.state.values()
    )


def _weight(example) -> int:
    """How heavy an example is for a training step: text length, or pixels."""
    if hasattr(example, "anchor"):
        return len(example.anchor) + len(example.positive) + len(example.negative or "")
    image = example[0]
    return image.width * image.height


def measure_step(trainer, batch: list, budget: int, limit: int) -> dict:
    """One optimizer step over `batch` (one micro-batch), measured."""
    device = trainer.device
    trainer.optimizer = None  # each size starts with fresh optimizer states
    release_cached(device)
    weights = _bytes(trainer.model.parameters())
    row = {"phase": "train", "batch_size": len(batch), "weights": weights, "limit": limit}
    started = time.perf_counter()
    try:
        with StepMemory(device) as memory:
            trainer.model.train()
            optimizer = trainer._optimizer()
            optimizer.zero_grad(set_to_none=True)
            loss = trainer.loss(batch)
            loss.backward()
            gradients = _bytes(p.grad for p in trainer.trainable() if p.grad is not None)
            optimizer.step()
    except torch.OutOfMemoryError:
        release_cached(device)
        full = {"peak_allocated": budget, "peak_reserved": budget}
        return {**row, **full, "oom": True, "fits": False}
    seconds = time.perf_counter() - started
    states = _optimizer_bytes(optimizer)
    held = weights + gradients + states
    row.update(
        {
            "gradients": gradients,
            "optimizer": states,
            # What the step's peak adds beyond the tensors that outlive it.
            "activations": max(0, memory.peak_allocated - held - trainer_baseline(trainer)),
            "peak_allocated": memory.peak_allocated,
            "peak_reserved": memory.peak_reserved,
            "step_s": round(seconds, 4),
            "items_per_s": round(len(batch) / seconds, 2) if seconds else None,
            "oom": False,
        }
    )
    row["fits"] = row["peak_reserved"] <= limit
    trainer.optimizer = None
    optimizer.zero_grad(set_to_none=True)
    return row


def trainer_baseline(trainer) -> int:
    """What the process holds besides the model (CPU: the interpreter, torch, data)."""
    return getattr(trainer, "_baseline", 0)


def _doubling(limit: int) -> list[int]:
    sizes, size = [], 1
    while size <= limit:
        sizes.append(size)
        size *= 2
    return sizes


def sweep(
    trainer, examples: list, *, budget: int, margin: float, max_batch: int, on_step=None
) -> tuple:
    """(steps, chosen size): doubling on the heaviest examples, then a binary
    search between the last size that kept the margin and the first that did not.
    `on_step(steps)` after each one (the report page shows them as they come)."""
    limit = int((1 - margin) * budget)
    heaviest = sorted(examples, key=_weight, reverse=True)
    trainer._baseline = allocated_now(trainer.device) - _bytes(trainer.model.parameters())
    steps: list[dict] = []

    def batch_of(size: int) -> list:
        return [heaviest[i % len(heaviest)] for i in range(size)]

    def fits(size: int) -> bool:
        step = measure_step(trainer, batch_of(size), budget, limit)
        steps.append(step)
        if on_step is not None:
            on_step(steps)
        return step["fits"]

    good, bad = 0, None
    for size in _doubling(max_batch):
        if fits(size):
            good = size
        else:
            bad = size
            break
    if bad is not None and good:
        lo, hi = good, bad
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if fits(mid):
                lo = mid
            else:
                hi = mid
        good = lo
    return steps, good


def leak_check(trainer, examples: list, size: int, budget: int, limit: int) -> dict:
    """The chosen size three more times: what is allocated after each step must not grow."""
    heaviest = sorted(examples, key=_weight, reverse=True)
    batch = [heaviest[i % len(heaviest)] for i in range(size)]
    baseline = allocated_now(trainer.device)
    after = []
    for _ in range(3):
        measure_step(trainer, batch, budget, limit)
        after.append(allocated_now(trainer.device))
    growth = (after[-1] - after[0]) / max(1, len(after) - 1)
    leak = growth > 16 * MiB
    return {
        "baseline": baseline,
        "after": after,
        "growth_per_batch": growth,
        "leak": leak,
        "message": (
            f"allocated memory grows by {growth / MiB:.1f} MiB per step: something keeps "
            "tensors (a loss, a graph) alive between steps"
            if leak
            else "allocated memory comes back to its baseline after each step"
        ),
    }


def measure(profile: Profile) -> None:
    """Fill a training campaign's profile: steps, chosen size, leak check."""
    from gpuworker.training_tasks import TRAINERS, read_examples

    campaign, params = profile.campaign, profile.version.params
    from gpuworker.profiler import record_device

    trainer, parse, _base = TRAINERS[campaign.processor](params)
    budget = record_device(profile, trainer.device)
    # The device and its budget on the page while the steps come in.
    profile.save(update_fields=["memory_budget", "runtime", "device"])
    units = list(Unit.objects.filter(pk__in=profile.sample).order_by("pk"))
    train, _heldout, _rows = read_examples(campaign, parse, units, params=params, fail=False)
    if not train:
        raise ValueError("no example of the sample could be read: nothing to measure")
    steps, chosen = sweep(
        trainer,
        train,
        budget=budget,
        margin=profile.margin,
        max_batch=profile.max_batch_size,
        on_step=lambda steps: Profile.objects.filter(pk=profile.pk).update(steps=steps),
    )
    profile.steps = steps
    if not chosen:
        profile.chosen_batch_size = None
        profile.error = (
            "even one example does not train within "
            f"{(1 - profile.margin) * budget / MiB:.0f} MiB: a smaller max_tokens or image "
            "size, train: head, or a larger card"
        )
        return
    chosen_step = max(
        (s for s in steps if s["batch_size"] == chosen and s["fits"]),
        key=lambda s: s["peak_reserved"],
    )
    profile.chosen_batch_size = chosen
    profile.chosen_peak_reserved = chosen_step["peak_reserved"]
    profile.leak = leak_check(trainer, train, chosen, budget, int((1 - profile.margin) * budget))


def estimate_build(profile: Profile) -> Estimate:
    """Epochs × steps × seconds per step at the chosen size, the checkpoint
    writes and held-out evaluations on top, and the rental it needs."""
    campaign = profile.campaign
    params = TrainParams.from_params(profile.version.params)
    usable = Unit.objects.filter(campaign=campaign).exclude(state="failed")
    examples = usable.filter(holdout=False).count()
    size = profile.chosen_batch_size
    step = next(s for s in profile.steps if s["batch_size"] == size and s.get("step_s") is not None)
    steps = params.epochs * math.ceil(examples / (size * params.accumulate))
    seconds = steps * step["step_s"] * params.accumulate
    overhead = training_overhead(
        campaign=campaign,
        steps=steps,
        checkpoint_every=params.checkpoint_every,
        heldout=usable.filter(holdout=True).count(),
        step=step,
    )
    total = seconds + overhead.write_seconds + overhead.eval_seconds
    return estimate_from_hours(
        profile=profile,
        units=examples,
        hours=total / 3600,
        # The writes go at the disk's pace on any card; the evaluations are compute.
        io_hours=overhead.write_seconds / 3600,
        hours_naive=seconds / 3600,
        reason=f"{params.epochs} epoch(s) × {steps // max(1, params.epochs)} steps of "
        f"{size} × {params.accumulate} examples at {step['step_s']:.3f} s per micro-batch, "
        "checkpoint writes and held-out evaluations included",
        assumed=overhead.reasons,
    )
