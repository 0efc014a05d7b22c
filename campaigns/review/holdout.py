"""The holdout: a deterministic share of units kept out of profiling and tuning.

Chosen by a hash of the unit id, so the same units are held out on every
import and every machine. Part of every parameter version's first group
(processed again under each new version, its earlier outputs kept in their
version's folder), reported at the checkpoint and at the end.
"""

from __future__ import annotations

import hashlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from django.conf import settings
from django.core.exceptions import ValidationError

from campaigns.models import Attempt, Campaign, ParameterVersion, ReviewItem, Unit
from campaigns.specs.processors import get_spec
from campaigns.storage.outputs import InvalidOutput, load_npz
from campaigns.storage.vector_shards import VectorReader

_CHUNK = 2000


def is_holdout(uid: str, share: float) -> bool:
    if share <= 0:
        return False
    bucket = int.from_bytes(hashlib.sha256(uid.encode("utf-8")).digest()[:4], "big")
    return bucket / 2**32 < share


def holdout_report(
    *, campaign: Campaign, version: ParameterVersion | None = None
) -> dict[str, Any]:
    """What the holdout says about a parameter version (default: the current one),
    as plain data (JSON: a checkpoint keeps snapshots of it).

    Read from the attempts, not from the units: a holdout unit is processed
    again under each new version (setup.version_create), so its row shows
    only its latest output while every version's attempt keeps its own.

    Labelled classification: top-1 accuracy and a confusion table. Embeddings:
    how far the vectors moved since the previous parameter version. Anything
    else: counts only.
    """
    version = version or campaign.current_version
    holdout = Unit.objects.filter(campaign=campaign, holdout=True)
    report: dict[str, Any] = {
        "share": campaign.holdout_share,
        "units": holdout.count(),
        "processed": 0,
        "version": version.label if version else None,
        "notes": [],
    }
    if version is None:
        report["notes"].append("no parameter version yet")
        return report
    report["processed"] = (
        _succeeded(campaign, version).order_by().values("unit_id").distinct().count()
    )
    if not report["units"]:
        report["notes"].append("no unit is held out")

    try:
        suffix = get_spec(campaign.processor).output_suffix
    except ValidationError:
        suffix = ""  # a plugin no longer installed: its outputs cannot be read here
    if campaign.processor == "image-classification":
        report.update(_classification(campaign, version, report["notes"]))
    elif suffix == ".npy":
        report["stability"] = _stability(campaign, version, report["notes"])
    else:
        report["notes"].append(f"{campaign.processor}: the holdout is counted, not scored")
    return report


def _succeeded(campaign: Campaign, version: ParameterVersion):
    """Successful attempts of holdout units under a version, less outputs a
    reviewer rejected (they do not count)."""
    rejected = ReviewItem.objects.filter(
        campaign=campaign, version=version, state=ReviewItem.State.REJECTED
    ).values("unit_id")
    return (
        Attempt.objects.filter(
            unit__campaign=campaign,
            unit__holdout=True,
            version=version,
            outcome=Attempt.Outcome.SUCCEEDED,
        )
        .exclude(output_path="")
        .exclude(unit_id__in=rejected)
    )


def _holdout_outputs(
    campaign: Campaign, version: ParameterVersion
) -> Iterator[tuple[str, str, str]]:
    """(uid, category, output path) of each holdout unit's last successful
    attempt under a version."""
    rows = (
        _succeeded(campaign, version)
        .order_by("unit_id", "finished_at", "pk")
        .values_list("unit_id", "unit__uid", "unit__category", "output_path")
        .iterator(chunk_size=_CHUNK)
    )
    current: tuple[int, str, str, str] | None = None
    for row in rows:
        if current is not None and row[0] != current[0]:
            yield current[1], current[2], current[3]
        current = row
    if current is not None:
        yield current[1], current[2], current[3]


# --- labelled classification ---------------------------------------------------


def _classification(
    campaign: Campaign, version: ParameterVersion, notes: list[str]
) -> dict[str, Any]:
    output_root = Path(settings.OUTPUT_ROOT)
    confusion: dict[str, Counter] = defaultdict(Counter)
    labelled = correct = unreadable = not_labels = 0
    labels = _model_labels(version)
    for _uid, truth, rel in _holdout_outputs(campaign, version):
        if not truth:
            continue
        if labels is not None and truth not in labels:
            # A category that is no label of the model (a folder named for a
            # year, say, as a folder import's categories are) is not a truth.
            not_labels += 1
            continue
        try:
            predicted = str(load_npz(output_root / rel)["top_labels"][0])
        except (OSError, KeyError, IndexError, InvalidOutput):
            # Gone or damaged since it was recorded: verify reports it; a guess here would not.
            unreadable += 1
            continue
        labelled += 1
        correct += predicted == truth
        confusion[truth][predicted] += 1
    if not_labels:
        notes.append(
            f"{not_labels} holdout unit(s) have a category that is not one of the model's "
            "labels: not scored"
        )
    if not labelled and not unreadable:
        notes.append(
            "no processed holdout unit carries a label (a manifest's category column, or "
            "a top folder named as a label): no accuracy"
        )
    if unreadable:
        notes.append(f"{unreadable} holdout output(s) could not be read; run verify")
    return {
        "labelled": labelled,
        "accuracy": correct / labelled if labelled else None,
        "confusion": {t: dict(sorted(p.items())) for t, p in sorted(confusion.items())},
        "unreadable": unreadable,
    }


def _model_labels(version: ParameterVersion) -> set[str] | None:
    """The labels file of the version's classifier, as the worker reads it;
    None when it cannot be read (every category is then taken for a label)."""
    path = version.params.get("labels")
    if not path:
        return None
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return {line.strip() for line in text.splitlines() if line.strip()}


# --- embedding stability ------------------------------------------------------


def unit_vector(reader: VectorReader, rel: str) -> np.ndarray | None:
    """The unit's output vector at unit length, or None when it cannot be compared."""
    try:
        vector = np.asarray(reader.vector(rel), dtype=np.float64).ravel()
    except (OSError, ValueError, InvalidOutput):
        return None
    norm = np.linalg.norm(vector)
    # A zero or non-finite vector has no direction to compare.
    return vector / norm if np.isfinite(norm) and norm > 0 else None


def _stability(
    campaign: Campaign, version: ParameterVersion, notes: list[str]
) -> dict[str, Any] | None:
    previous = campaign.versions.filter(number__lt=version.number).order_by("-number").first()
    if previous is None:
        notes.append("no earlier parameter version to compare")
        return None
    # One reader a version: each walks its own shards in unit order.
    read_before, read_now = VectorReader(settings.OUTPUT_ROOT), VectorReader(settings.OUTPUT_ROOT)
    # Only the holdout's paths are held in memory: about 5% of the campaign.
    before = {uid: rel for uid, _category, rel in _holdout_outputs(campaign, previous)}
    compared = unreadable = 0
    total = 0.0
    worst: tuple[float, str] | None = None
    for uid, _category, rel in _holdout_outputs(campaign, version):
        if uid not in before:
            continue
        a = unit_vector(read_before, before[uid])
        b = unit_vector(read_now, rel)
        if a is None or b is None or a.shape != b.shape:
            unreadable += 1
            continue
        cosine = float(np.dot(a, b))
        compared += 1
        total += cosine
        if worst is None or cosine < worst[0]:
            worst = (cosine, uid)
    if not compared:
        notes.append(f"no holdout unit succeeded under both {previous.label} and {version.label}")
    if unreadable:
        notes.append(
            f"{unreadable} holdout vector pair(s) missing, unreadable or of different "
            "dimensions; not compared"
        )
    return {
        "previous_version": previous.label,
        "compared": compared,
        "mean_cosine": total / compared if compared else None,
        "worst_cosine": worst[0] if worst else None,
        "worst_unit": worst[1] if worst else None,
        "unreadable": unreadable,
    }
