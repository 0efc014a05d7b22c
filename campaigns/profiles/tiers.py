"""Memory tiers: the card memory sizes (24 / 48 / 80 GB) a profile's measured
peaks are summarised against, with the margin kept free on each.

Sizes, not cards: which cards of the catalog fall in a tier, and what they
cost, is portal's (portal/advice.py).
"""

from __future__ import annotations

from campaigns.models import Profile

TIERS_GB = (24, 48, 80)
GiB = 1024**3


def memory_tier(peak: int, margin: float) -> int | None:
    """The smallest tier whose memory, less the margin, holds this peak; None when
    even the largest does not (no card tier fits at that batch)."""
    needed = peak / (1 - margin) / GiB
    return next((tier for tier in TIERS_GB if needed <= tier), None)


# Steps measured on the hard inputs: the ones whose memory a tier must hold.
HARD_PHASES = ("heaviest", "unusual", "train")


def tier_batches(profile: Profile) -> list[dict]:
    """Per memory tier, the largest measured batch that keeps the margin on it.

    For each tier (24 / 48 / 80 GB): the largest batch size measured on the
    hard inputs whose peak reserved memory stays under tier × (1 − margin),
    never above the chosen size (sizes above it were neither leak-checked nor
    tried on the unusual inputs: profile on the larger card to go further).
    A size that ran out of memory on any hard input does not count. So a
    small load is not pushed onto a larger card because the measuring device
    allowed a huge batch, and a batch no tier holds is said plainly.
    """
    chosen = profile.chosen_batch_size or 0
    peaks: dict[int, int] = {}
    broken: set[int] = set()
    for step in profile.steps:
        if step.get("phase") not in HARD_PHASES or not step.get("batch_size"):
            continue
        size = step["batch_size"]
        if step.get("oom") or step.get("error") or step.get("peak_reserved") is None:
            broken.add(size)
        else:
            peaks[size] = max(peaks.get(size, 0), step["peak_reserved"])
    rows = []
    for tier in TIERS_GB:
        limit = int(tier * GiB * (1 - profile.margin))
        fitting = [
            s for s, peak in peaks.items() if s <= chosen and s not in broken and peak <= limit
        ]
        size = max(fitting, default=None)
        rows.append(
            {
                "tier_gb": tier,
                "limit": limit,
                "batch_size": size,
                "peak_reserved": peaks.get(size) if size else None,
            }
        )
    return rows


def memory_reasons(profile: Profile, tiers: list[dict]) -> list[str]:
    """The estimate's reasoning on memory: the chosen batch's tier, then each tier's batch."""
    chosen, peak = profile.chosen_batch_size, profile.chosen_peak_reserved or 0
    margin = f"{profile.margin:.0%}"
    needed = peak / (1 - profile.margin) / GiB
    tier = memory_tier(peak, profile.margin)
    if tier is not None:
        lines = [
            f"memory: at batch {chosen} the heaviest inputs peak at {peak / GiB:.1f} GB "
            f"reserved; with the {margin} margin, cards of {tier} GB or more"
        ]
    else:
        lines = [
            f"memory: at batch {chosen} the heaviest inputs need {needed:.0f} GB with the "
            f"{margin} margin, more than the largest tier ({TIERS_GB[-1]} GB): no card tier "
            "fits at this batch; a smaller batch is recommended"
        ]
    for row in tiers:
        if row["batch_size"]:
            lines.append(
                f"{row['tier_gb']} GB cards: batch {row['batch_size']} (peak "
                f"{row['peak_reserved'] / GiB:.1f} GB, under {row['limit'] / GiB:.1f} GB "
                f"with the margin)"
            )
        else:
            lines.append(
                f"{row['tier_gb']} GB cards: no measured batch keeps the margin "
                f"(under {row['limit'] / GiB:.1f} GB)"
            )
    return lines
