"""The units a profile measures: ordinary ones at random plus the hard ones.

The hard ones are the heaviest by cost, those a run already failed on for
memory, time or a model error, the unusual shapes and sizes the cost misses,
and a few that failed validation before (they must fail cleanly).
"""

from __future__ import annotations

import heapq
import random
from pathlib import Path

from django.db.models import QuerySet

from campaigns.models import INPUT_ERRORS, Campaign, ErrorClass, ParameterVersion, Unit, UnitState
from campaigns.runs.costs import measure_costs
from campaigns.storage.paths import resolve_input

#: Failures of a run, not of the input: the input reads, but the batch it was
#: in ran out of memory or time, or the model raised. Heaviest candidates.
RUN_FAILURES = (ErrorClass.OUT_OF_MEMORY, ErrorClass.TIMEOUT, ErrorClass.PROCESSING_ERROR)
IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".webp", ".gif", ".bmp", ".tif", ".tiff"})
# Wider than 2:1 or taller than 1:2: a shape worth its own step (a classifier
# that resizes the shorter side makes a long strip of a panorama).
UNUSUAL_ASPECT = 2.0
# Image headers read at sample time, at most: a campaign of millions of images
# is scanned on a seeded random subset of this many (a manifest's width and
# height columns, when it has them, are read for every unit at no cost).
DIMENSION_SCAN_LIMIT = 20_000
SHAPE_KINDS = ("widest", "tallest")


def sample_build(
    *,
    campaign: Campaign,
    size: int = 48,
    heavy: int = 12,
    failed: int = 4,
    unusual: int = 2,
    seed: int = 0,
    version: ParameterVersion | None = None,
) -> tuple[list[int], list[int]]:
    """Unit ids of the sample and, among them, of the heaviest.

    Ordinary units at random, plus the hard ones: the heaviest by cost (the
    inputs that set the memory a batch needs) and those a run already failed
    for memory, time or a model error (whatever their cost); the unusual ones
    (`unusual_units`); and a few that failed validation before (they must fail
    cleanly, not take the profile down). Costs are measured first for units
    that have none, whatever their state.
    """
    version = version or campaign.current_version
    measure_costs(campaign=campaign, params=version.params, pending_only=False)
    # The holdout stays out of profiling and tuning: it judges them afterwards.
    units = Unit.objects.filter(campaign=campaign, holdout=False)
    readable = units.exclude(state=UnitState.FAILED, error_class__in=INPUT_ERRORS)
    heaviest = list(readable.order_by("-cost", "pk").values_list("pk", flat=True)[:heavy])
    failed_in_run = readable.filter(state=UnitState.FAILED, error_class__in=RUN_FAILURES)
    for pk in failed_in_run.order_by("-cost", "pk").values_list("pk", flat=True)[:failed]:
        if pk not in heaviest:
            heaviest.append(pk)
    failed_before = list(
        units.filter(state=UnitState.FAILED, error_class__in=INPUT_ERRORS)
        .order_by("pk")
        .values_list("pk", flat=True)[:failed]
    )
    odd = unusual_units(campaign=campaign, units=readable, each=unusual, seed=seed)
    taken = set(heaviest) | set(failed_before) | {pk for ids in odd.values() for pk in ids}
    # Ids only, in one query: a campaign may hold millions of units.
    ordinary = [pk for pk in readable.values_list("pk", flat=True) if pk not in taken]
    picked = random.Random(seed).sample(ordinary, min(size, len(ordinary)))
    return sorted(taken.union(picked)), heaviest


def unusual_units(
    *, campaign: Campaign, units: QuerySet[Unit], each: int = 2, seed: int = 0
) -> dict[str, list[int]]:
    """Units at the extremes the heaviest-by-cost list misses, by kind.

    widest / tallest: the most extreme aspect ratios (wider than 2:1, taller
    than 1:2), from the unit's metadata (width and height columns of a
    manifest) or the image header; lightest: the lowest cost; longest /
    shortest: the largest and smallest files (texts capped at max_tokens tie
    in cost; their length in bytes does not). A unit is listed under the
    first kind that claims it, in that order.
    """
    if each <= 0:
        return {}
    kinds: dict[str, list[int]] = {}
    kinds["widest"], kinds["tallest"] = _shape_extremes(
        campaign=campaign, units=units, each=each, seed=seed
    )
    kinds["lightest"] = list(units.order_by("cost", "pk").values_list("pk", flat=True)[:each])
    sized = units.filter(size__isnull=False)
    kinds["longest"] = list(sized.order_by("-size", "pk").values_list("pk", flat=True)[:each])
    kinds["shortest"] = list(sized.order_by("size", "pk").values_list("pk", flat=True)[:each])
    claimed: set[int] = set()
    found = {}
    for kind, ids in kinds.items():
        ids = [pk for pk in ids if pk not in claimed]
        claimed.update(ids)
        if ids:
            found[kind] = ids
    return found


def unit_dimensions(root: Path, source_path: str, metadata: dict | None) -> tuple[int, int] | None:
    """Width and height from the unit's metadata, else from an image's header."""
    dims = _metadata_dimensions(metadata)
    if dims is not None or Path(source_path).suffix.lower() not in IMAGE_SUFFIXES:
        return dims
    from campaigns.intake.images import open_image  # Pillow, only where images are measured

    try:
        with open_image(resolve_input(root, source_path), None) as image:
            width, height = image.size  # the header only: no pixel is decoded
    except (OSError, ValueError, SyntaxError):
        return None  # the worker classifies it; it has no shape to offer here
    return (width, height) if width > 0 and height > 0 else None


def _metadata_dimensions(metadata: dict | None) -> tuple[int, int] | None:
    if not metadata:
        return None
    try:
        width, height = int(float(metadata["width"])), int(float(metadata["height"]))
    except (KeyError, TypeError, ValueError, OverflowError):
        return None
    return (width, height) if width > 0 and height > 0 else None


def _shape_extremes(
    *, campaign: Campaign, units: QuerySet[Unit], each: int, seed: int
) -> tuple[list[int], list[int]]:
    root = Path(campaign.input_root)
    wide: list[tuple[float, int]] = []  # bounded min-heaps of (ratio, -pk)
    tall: list[tuple[float, int]] = []

    def offer(pk: int, dims: tuple[int, int] | None) -> None:
        if dims is None:
            return
        width, height = dims
        for heap, ratio in ((wide, width / height), (tall, height / width)):
            if ratio >= UNUSUAL_ASPECT:
                heapq.heappush(heap, (ratio, -pk))
                if len(heap) > each:
                    heapq.heappop(heap)  # ties keep the smaller pk: deterministic

    # Reservoir sampling (seeded) bounds the header reads on a large corpus.
    rng, seen, to_read = random.Random(seed), 0, []
    rows = units.order_by("pk").values_list("pk", "source_path", "metadata")
    for pk, source_path, metadata in rows.iterator(chunk_size=10_000):
        dims = _metadata_dimensions(metadata)
        if dims is not None:
            offer(pk, dims)
        elif Path(source_path).suffix.lower() in IMAGE_SUFFIXES:
            seen += 1
            if len(to_read) < DIMENSION_SCAN_LIMIT:
                to_read.append((pk, source_path))
            elif (slot := rng.randrange(seen)) < DIMENSION_SCAN_LIMIT:
                to_read[slot] = (pk, source_path)
    for pk, source_path in to_read:
        offer(pk, unit_dimensions(root, source_path, None))
    return (
        [-pk for _, pk in sorted(wide, reverse=True)],
        [-pk for _, pk in sorted(tall, reverse=True)],
    )
