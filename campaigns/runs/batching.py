"""How pending units are grouped into batches: the version's batch_policy.

- original: import order, batch_size at a time (padding follows the corpus);
- length_grouped: sorted by cost (tokens), batch_size at a time, so a batch's
  texts have similar lengths and little padding;
- token_budget: sorted by cost, as many units as keep units × the longest one
  within token_budget, so short texts travel in large batches and long ones in
  small batches at the same memory.

A version's params are its processor spec's cleaned ones (ProcessorSpec.clean,
called by campaigns/runs/setup.py's version_create): a processor that declares
batch_policy has it in every version, given or filled with the spec's default,
which is the only default it has. A processor that declares none (an
adaptation processor, a plugin without the parameter) keeps import order.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

#: The policy of a processor whose spec declares no batch_policy parameter.
UNDECLARED_POLICY = "original"

#: A record campaign's run sorts its units by cost within each stretch of this
#: many ids (id // RECORD_WINDOW_IDS; `plan_batches(window=...)`). Ids follow
#: the import, so a window is a stretch of the records: a batch's rows then come
#: from one or two Parquet row groups (or gzip stretches), each decoded once for
#: the window. Sorted across a cross-section of the whole file — the first group
#: before the checkpoint — each batch's rows lay across the file and a batch
#: decoded three row groups on average, 30 times the host work a unit
#: (bench/RESULTS.md, "The first group of a large record file (2026-12-03)").
#: A run's slices (runs/start.py, RUN_SLICE_UNITS) are stretches already.
RECORD_WINDOW_IDS = 65_536


def batch_policy(params: Mapping[str, Any]) -> str:
    """The batch policy a version's params (or a plan's) ask for."""
    return params.get("batch_policy", UNDECLARED_POLICY)


def plan_batches(
    pending: list[tuple[int, int | None]], params: dict, *, window: int | None = None
) -> Iterator[list[int]]:
    """Batches of unit ids from (id, cost) pairs in import order. `window`: a
    sorting policy orders the units of each stretch of that many ids (id //
    window, RECORD_WINDOW_IDS) among themselves, and no batch spans two."""
    policy = batch_policy(params)
    if policy not in ("original", "length_grouped", "token_budget"):
        raise ValueError(f"unknown batch policy {policy!r}")
    if policy == "original" or window is None:
        yield from _planned(pending, params)
        return
    for _, stretch in itertools.groupby(sorted(pending), key=lambda row: row[0] // window):
        yield from _planned(list(stretch), params)


def _planned(pending: Iterable[tuple[int, int | None]], params: dict) -> Iterator[list[int]]:
    policy = batch_policy(params)
    size = int(params.get("batch_size", 16))
    if policy == "original":
        ids = [pk for pk, _ in pending]
        for start in range(0, len(ids), size):
            yield ids[start : start + size]
        return
    ordered = sorted(pending, key=lambda row: (row[1] or 0, row[0]))
    if policy == "length_grouped":
        for start in range(0, len(ordered), size):
            yield [pk for pk, _ in ordered[start : start + size]]
        return
    budget = int(params["token_budget"])
    batch: list[int] = []
    for pk, cost in ordered:
        cost = cost or 1
        # Ascending order: this unit is the longest so far, so padded = n × cost.
        if batch and (len(batch) + 1) * cost > budget:
            yield batch
            batch = []
        batch.append(pk)
    if batch:
        yield batch
