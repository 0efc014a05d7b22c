"""Two parameter versions of one campaign side by side, over every unit both
made a valid output for (not only the holdout): per-unit cosine between
their vectors (embeddings, a `.npy` plugin, a classifier's image features)
and, for a classifier, whether their top labels agree.

Both versions' outputs are walked together in unit order a chunk at a time;
what is kept is running sums, a 200-bin histogram of the cosines (for the
percentiles) and the few units that moved most, so a million units compare
in constant memory.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np

from campaigns.exports.matrices import RowReader, chunks, kind_of
from campaigns.models import Campaign, ParameterVersion
from campaigns.runs.versions import VersionOutput, outputs_count, outputs_of

#: Units listed as those that moved most (lowest cosine) or disagree.
WORST = 10
_BINS = 200  # cosine histogram over [-1, 1]: percentiles to 0.01


def _pairs(
    campaign: Campaign, a: ParameterVersion, b: ParameterVersion, every: int
) -> Iterator[tuple[VersionOutput, VersionOutput]]:
    """Units with a valid output under both, in unit order (a merge of two
    walks in unit order)."""
    left = outputs_of(campaign=campaign, version=a, every=every)
    right = outputs_of(campaign=campaign, version=b, every=every)
    x, y = next(left, None), next(right, None)
    while x is not None and y is not None:
        if x.unit_id == y.unit_id:
            yield x, y
            x, y = next(left, None), next(right, None)
        elif x.unit_id < y.unit_id:
            x = next(left, None)
        else:
            y = next(right, None)


def _unit_length(vector: np.ndarray | None) -> np.ndarray | None:
    if vector is None:
        return None
    v = vector.astype(np.float64)
    norm = np.linalg.norm(v)
    return v / norm if np.isfinite(norm) and norm > 0 else None


def compare_versions(
    *,
    campaign: Campaign,
    a: ParameterVersion,
    b: ParameterVersion,
    at_most: int | None = None,
) -> dict[str, Any]:
    """What changed from version `a` to version `b`, as plain data.

    `at_most`: compare about that many units, one in `every` by id across the
    whole corpus, rather than all (the page answers within its request; the
    command compares all)."""
    kind = kind_of(campaign)
    every = 1
    if at_most:
        smaller = min(outputs_count(campaign=campaign, version=v) for v in (a, b))
        every = max(1, math.ceil(smaller / at_most))
    report: dict[str, Any] = {
        "a": a.label,
        "b": b.label,
        "kind": kind,
        "both": 0,
        "compared": 0,
        "unreadable": 0,
        "every": every,
        "notes": [],
    }
    if every > 1:
        report["notes"].append(
            f"a sample: one unit in {every} by id, across the corpus "
            f"(campaign compare {campaign.name} {a.number} {b.number} compares every unit)"
        )
    if kind is None:
        report["notes"].append(
            f"{campaign.processor}: outputs are not vectors; only counts compare"
        )
    reader_a, reader_b = RowReader(campaign), RowReader(campaign)
    histogram = np.zeros(_BINS, dtype=np.int64)
    total = 0.0
    worst: list[tuple[float, str]] = []  # a max-heap of -cosine: the lowest cosines
    agree = labelled = 0
    changes: Counter[tuple[str, str]] = Counter()
    for chunk in chunks(p for pair in _pairs(campaign, a, b, every) for p in pair):
        report["both"] += len(chunk) // 2
        if kind is None:
            continue
        rows_a = reader_a.read_chunk(chunk[0::2])
        rows_b = reader_b.read_chunk(chunk[1::2])
        for out, (va, la, _), (vb, lb, _) in zip(chunk[0::2], rows_a, rows_b, strict=True):
            if kind == "features" and la and lb:
                labelled += 1
                agree += la == lb
                if la != lb:
                    changes[(la, lb)] += 1
            ua, ub = _unit_length(va), _unit_length(vb)
            if ua is None or ub is None or ua.shape != ub.shape:
                report["unreadable"] += 1
                continue
            cosine = float(np.clip(np.dot(ua, ub), -1.0, 1.0))
            report["compared"] += 1
            total += cosine
            histogram[min(_BINS - 1, int((cosine + 1) / 2 * _BINS))] += 1
            heapq.heappush(worst, (-cosine, out.uid))
            if len(worst) > WORST:
                heapq.heappop(worst)
    compared = report["compared"]
    report["mean_cosine"] = total / compared if compared else None
    report["percentiles"] = _percentiles(histogram, compared)
    report["lowest"] = [
        {"unit": uid, "cosine": -negative} for negative, uid in sorted(worst, reverse=True)
    ]
    if kind == "features":
        report["labelled"] = labelled
        report["label_agreement"] = agree / labelled if labelled else None
        report["label_changes"] = [
            {"from": f, "to": t, "units": n} for (f, t), n in changes.most_common(WORST)
        ]
    if not report["both"]:
        report["notes"].append(f"no unit has a valid output under both {a.label} and {b.label}")
    if report["unreadable"]:
        report["notes"].append(
            f"{report['unreadable']} pair(s) missing, unreadable or of different dimensions; "
            "not compared (campaign verify says which)"
        )
    return report


def _percentiles(histogram: np.ndarray, n: int) -> dict[str, float]:
    """p1, p5, p50 of the cosines, to the histogram's bin (0.01): each the
    lower edge of the bin that holds it."""
    if not n:
        return {}
    cumulative = np.cumsum(histogram)
    out = {}
    for name, q in (("p1", 0.01), ("p5", 0.05), ("p50", 0.5)):
        index = int(np.searchsorted(cumulative, max(1, int(np.ceil(q * n)))))
        out[name] = round(-1 + 2 * index / _BINS, 2)
    return out
