"""Weighing units for batching: each unit's cost (tokens, pixels), measured
before a run groups it by cost and before a profile samples the corpus."""

from __future__ import annotations

from pathlib import Path

from django.db import transaction
from django.db.models import Q

from campaigns.db.row_updates import update_rows
from campaigns.models import Campaign, Unit, UnitState
from campaigns.specs.processors import get_spec

#: Units weighed per query and per update statement.
COST_CHUNK = 1000


def measure_costs(
    *, campaign: Campaign, params: dict, pending_only: bool = True, within: Q | None = None
) -> int:
    """Fill Unit.cost (tokens, pixels) for units that have none yet (pending ones,
    or all of them for a profile, which weighs the whole corpus; `within`: only
    those units)."""
    spec = get_spec(campaign.processor)
    if spec.cost is None and spec.costs is None:
        return 0
    basis = spec.cost_basis(params)
    if campaign.cost_basis != basis:
        # Weighed under other parameters (another tokenizer, another token
        # cap), or never: those costs would mislead the batch planner.
        with transaction.atomic():
            Unit.objects.filter(campaign=campaign, cost__isnull=False).update(cost=None)
            Campaign.objects.filter(pk=campaign.pk).update(cost_basis=basis)
        campaign.cost_basis = basis
    root = Path(campaign.input_root)
    todo = Unit.objects.filter(campaign=campaign, cost__isnull=True)
    if pending_only:
        todo = todo.filter(state=UnitState.PENDING)
    if within is not None:
        todo = todo.filter(within)
    measured, after = 0, 0
    # By id from the last chunk's end: skipping the units already weighed
    # would make each chunk's query longer than the last (bench/RESULTS.md,
    # "Weighing every unit before a token-budget run (2026-12-01)").
    while chunk := list(
        todo.filter(pk__gt=after).order_by("pk").values_list("pk", "source_path")[:COST_CHUNK]
    ):
        after = chunk[-1][0]
        # One statement a chunk (campaigns/db/row_updates.py): bulk_update's
        # CASE expressions cost half of this function's time.
        weights = spec.weigh(root, [path for _, path in chunk], params)
        # Unreadable, or outside the corpus: the worker classifies it; it weighs nothing.
        update_rows(
            Unit,
            ["cost"],
            [(pk, 1 if w is None else w) for (pk, _), w in zip(chunk, weights, strict=True)],
        )
        measured += len(chunk)
    return measured
