"""Why a unit ran out of device memory, and what to try before another card.

The worker records, on the failed unit's attempt (`Attempt.metrics["oom"]`),
torch's own message and the figures at the failure: allocated, reserved, free
and the device's total (parsed from the message, or measured by torch on
CUDA), the batch sizes the unit was tried at, and whether it failed alone at
batch 1. The batch keeps its splits (`Batch.metrics["oom_splits"]`, the sizes
that were halved, and `oom_alone`, the units that failed alone).

This module turns those into what the unit page, the campaign page's failures
and batches, and batches.csv show (campaigns/selectors.py reads the rows): the
one place that says what the figures mean and what to try, in order. It is
plain Python, no models: the worker imports it too.

A larger card comes last, and only for a unit that fails alone at batch 1:
until then a smaller batch fits the device, so a card with more memory buys
nothing the batch size does not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from campaigns.runs.batching import batch_policy

# --- torch's message -----------------------------------------------------------

_FACTORS = {"bytes": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
_SIZE = r"([\d.]+)\s*(bytes|KiB|MiB|GiB|TiB)"

# The CUDA caching allocator's message, torch ≥ 2.1 ("… GPU 0 has a total
# capacity of 79.15 GiB of which 1.20 GiB is free. …") and before ("(GPU 0;
# 15.78 GiB total capacity; 14.56 GiB already allocated; 3.44 MiB free; 14.58
# GiB reserved in total by PyTorch)"); XPU's reads like the first.
_PATTERNS = {
    "requested": rf"Tried to allocate {_SIZE}",
    "total": rf"total capacity of {_SIZE}|{_SIZE} total capacity",
    "free": rf"of which {_SIZE} is free|{_SIZE} free\b",
    "in_use": rf"this process has {_SIZE} memory in use",
    "allowed": rf"{_SIZE} allowed",
    "allocated": rf"{_SIZE} is allocated by PyTorch|{_SIZE} already allocated",
    "unallocated": rf"{_SIZE} is reserved by PyTorch but unallocated",
    "reserved": rf"{_SIZE} reserved in total by PyTorch",
}

#: The figures an attempt may hold, in the order the unit page lists them.
FIGURES = (
    ("requested", "Tried to allocate"),
    ("allocated", "Allocated by PyTorch"),
    ("reserved", "Reserved by PyTorch"),
    ("free", "Free on the device"),
    ("total", "Device total"),
    ("allowed", "This process's share"),
)


def parse_message(text: str) -> dict[str, int]:
    """The byte counts an out-of-memory message gives (a key only where it
    gives that figure); reserved = allocated + reserved-but-unallocated."""
    found: dict[str, int] = {}
    for name, pattern in _PATTERNS.items():
        match = re.search(pattern, text)
        if match:
            number, unit = (g for g in match.groups() if g is not None)
            found[name] = int(float(number) * _FACTORS[unit])
    unallocated = found.pop("unallocated", None)
    if unallocated is not None and "allocated" in found and "reserved" not in found:
        found["reserved"] = found["allocated"] + unallocated
    return found


def facts_at_failure(
    error: str,
    measured: Mapping[str, int | None],
    *,
    tried: Iterable[int] = (),
    alone: bool = False,
    workers_per_device: int = 1,
    alloc_conf: str = "",
) -> dict[str, Any]:
    """What the worker keeps on the attempt (`metrics["oom"]`): the message,
    its figures (those it lacks from `measured`: torch's counters on CUDA),
    the batch sizes tried and whether the unit failed alone at batch 1."""
    figures = {k: v for k, v in measured.items() if v is not None}
    figures.update(parse_message(error))
    return {
        "error": error,
        **figures,
        "tried": list(tried),
        "alone": alone,
        "workers_per_device": workers_per_device,
        "alloc_conf": alloc_conf,
    }


def alone_message(error: str, tried: Iterable[int]) -> str:
    """The unit's reason when it failed alone: the chain, then torch's own text."""
    return (
        "does not fit in device memory even alone at batch 1 (batch sizes tried: "
        f"{chain_text(tried)}): {error}"
    )


# --- splits --------------------------------------------------------------------


def batch_sizes_tried(splits: Iterable[int] | None, alone: int | None = 0) -> list[int]:
    """Every batch size a split batch ran at, largest first, from the sizes
    it halved: 64 halved, then 32, then 16 → 64, 32, 16, 8."""
    splits = list(splits or [])
    if not splits:
        return [1] if alone else []
    sizes = {splits[0]}
    for n in splits:
        sizes |= {n // 2, n - n // 2}
    return sorted(sizes, reverse=True)


def chain_text(sizes: Iterable[int], sep: str = " → ") -> str:
    return sep.join(str(n) for n in sizes)


def splits_text(splits: Iterable[int] | None, alone: int | None, *, sep: str = " → ") -> str:
    """A batch's splits as the batches table and batches.csv show them; "" if none."""
    sizes = batch_sizes_tried(splits, alone)
    if not sizes:
        return ""
    text = chain_text(sizes, sep)
    if alone:
        text += f" ({alone} failed alone)"
    return text


def size_text(n: int) -> str:
    """Bytes as torch's messages write them (binary units)."""
    for unit in ("TiB", "GiB", "MiB", "KiB"):
        if n >= _FACTORS[unit]:
            return f"{n / _FACTORS[unit]:.2f} {unit}"
    return f"{n} bytes"


# --- the advice ----------------------------------------------------------------


@dataclass(frozen=True)
class Advice:
    key: str  # stable, for tests and the page's markup
    text: str


@dataclass
class MemoryFailure:
    """One out-of-memory failure explained: torch's text, the figures, the
    unit's cost, the batch sizes tried, and what to try in order."""

    error: str
    figures: list[tuple[str, str]]  # (label, size as text)
    tried: list[int]
    alone: bool
    cost: int | None
    cost_unit: str
    advice: list[Advice] = field(default_factory=list)

    @property
    def chain(self) -> str:
        return chain_text(self.tried)


@dataclass(frozen=True)
class ProfileBatch:
    """The batch a profile measured as fitting, and where."""

    pk: int
    batch_size: int
    device: str


def _profile_is_smaller(
    profile: ProfileBatch, params: Mapping[str, Any], largest: int, by_budget: bool
) -> bool:
    """Whether the profile's batch is below what ran out of memory: in texts,
    or under a token budget in tokens (a batch of short texts holds more texts
    than the profile's, and a budget may still be the smaller one)."""
    if by_budget:
        budget = params.get("token_budget")
        return budget is None or profile.batch_size * int(params["max_tokens"]) < int(budget)
    return profile.batch_size < largest


def advise(
    facts: Mapping[str, Any],
    *,
    params: Mapping[str, Any],
    profile: ProfileBatch | None,
    cost: int | None,
    unit: str = "tokens",
) -> list[Advice]:
    """What to try, in this order: each step costs less than the next, and a
    larger card only where the unit failed alone at batch 1, after the rest."""
    tried = list(facts.get("tried") or [])
    alone = bool(facts.get("alone")) and tried[-1:] == [1]
    largest = tried[0] if tried else int(params.get("batch_size") or 0)
    advice: list[Advice] = []
    # batch_size plans nothing under the token_budget policy: the profile's
    # batch of texts at the cap is the budget that fits.
    by_budget = batch_policy(params) == "token_budget" and "max_tokens" in params
    if largest > 1:
        if profile is not None and _profile_is_smaller(profile, params, largest, by_budget):
            where = f"profile {profile.pk}, on {profile.device or 'its device'}"
            if by_budget:
                cap = int(params["max_tokens"])
                setting = (
                    f"token_budget {profile.batch_size * cap} ({profile.batch_size} texts of "
                    f"{cap} tokens, {where}) instead of {params.get('token_budget')}"
                )
            else:
                setting = f"batch_size {profile.batch_size} ({where}) instead of {largest}"
            advice.append(
                Advice(
                    "profile-batch",
                    f"Use the profile's measured batch: {setting}; a new parameter version, "
                    "then Run.",
                )
            )
        elif profile is None:
            advice.append(
                Advice(
                    "profile-batch",
                    "Profile the campaign (Profile on its page): it measures the largest "
                    f"batch that fits this device; this unit's batch ran out of memory at "
                    f"{largest}.",
                )
            )
    if "max_tokens" in params:
        reach = ""
        if cost is not None and cost >= int(params["max_tokens"]):
            reach = f"; this unit reaches the cap ({cost:,} {unit})"
        elif cost is not None:
            reach = f"; this unit has {cost:,} {unit}"
        cut = (
            "longer texts are cut (or refused, with truncation=refuse)"
            if "truncation" in params
            else "longer texts are cut"
        )
        advice.append(
            Advice(
                "max-tokens",
                f"Lower max_tokens (now {params['max_tokens']}{reach}): a text's activations "
                f"grow with its tokens, and {cut}.",
            )
        )
    if params.get("batch_policy") == "token_budget" and "token_budget" in params:
        advice.append(
            Advice(
                "token-budget",
                f"Lower token_budget (now {params['token_budget']}): fewer padded tokens "
                "go into one batch.",
            )
        )
    if params.get("dtype") == "float32":
        advice.append(
            Advice(
                "half-precision",
                "dtype bfloat16 (or float16): the weights and activations take half the "
                "memory (a CUDA worker; compare a few outputs with float32's first).",
            )
        )
    if "expandable_segments:True" not in str(facts.get("alloc_conf") or ""):
        slack = ""
        if facts.get("reserved") is not None and facts.get("allocated") is not None:
            unused = max(0, int(facts["reserved"]) - int(facts["allocated"]))
            slack = f" ({size_text(unused)} was reserved but unallocated)"
        advice.append(
            Advice(
                "expandable-segments",
                "Start the workers with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: "
                f"the allocator then fragments less{slack}.",
            )
        )
    workers = int(facts.get("workers_per_device") or 1)
    others = _others(facts)
    if workers > 1 or others:
        held = f"; other processes held {size_text(others)} of it" if others else ""
        advice.append(
            Advice(
                "fewer-processes",
                f"Fewer processes per device: WORKERS_PER_DEVICE={workers} gives each "
                f"process 1/{workers} of the device's memory{held}.",
            )
        )
    if alone:
        total = facts.get("total")
        on = f" a device of {size_text(int(total))}" if total else ""
        advice.append(
            Advice(
                "larger-card",
                f"A card with more memory: this unit does not fit{on} even alone at batch 1. "
                "Try the steps above first (a lower max_tokens makes most texts fit).",
            )
        )
    return advice


def _others(facts: Mapping[str, Any]) -> int:
    """Memory other processes held on the device (total − free − this process), if told."""
    total, free, mine = facts.get("total"), facts.get("free"), facts.get("in_use")
    if total is None or free is None or mine is None:
        return 0
    others = int(total) - int(free) - int(mine)
    return others if others > 256 << 20 else 0  # below that: the driver's own


def explain(
    *,
    error_message: str,
    facts: Mapping[str, Any] | None,
    params: Mapping[str, Any],
    profile: ProfileBatch | None,
    cost: int | None,
    unit: str = "tokens",
) -> MemoryFailure:
    """One failure explained; without recorded facts (an attempt older than
    them), the figures of the message alone, and no batch sizes."""
    facts = dict(facts or {})
    error = str(facts.get("error") or error_message)
    if "error" not in facts:
        facts.update(parse_message(error))
    figures = [
        (label, size_text(int(facts[name])))
        for name, label in FIGURES
        if facts.get(name) is not None
    ]
    return MemoryFailure(
        error=error,
        figures=figures,
        tried=list(facts.get("tried") or []),
        alone=bool(facts.get("alone")),
        cost=cost,
        cost_unit=unit,
        advice=advise(facts, params=params, profile=profile, cost=cost, unit=unit),
    )
