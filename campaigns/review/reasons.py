"""A campaign's reject reasons: the list a reviewer picks from when rejecting an
output, with free text beside it. The correction effort counts rejections per
reason from this list (campaigns/review/effort.py)."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from campaigns.models import Campaign

# Reasons that fit any processor: what was wrong, not which rule flagged it.
DEFAULT_REJECT_REASONS = (
    "wrong result",
    "poor quality",
    "input unusable",
    "duplicate",
    "out of scope",
)
MAX_REASONS = 20
MAX_LENGTH = 100


def reject_reasons(campaign: Campaign) -> list[str]:
    """The campaign's list, or the default one while it has none of its own."""
    if campaign.reject_reasons is None:
        return list(DEFAULT_REJECT_REASONS)
    return list(campaign.reject_reasons)


def reject_reasons_clean(text: str) -> list[str] | None:
    """One reason a line, trimmed, each once, in the order given; no line at
    all is None (the default list)."""
    reasons: list[str] = []
    for line in text.splitlines():
        reason = " ".join(line.split())
        if reason and reason not in reasons:
            reasons.append(reason)
    if not reasons:
        return None
    if len(reasons) > MAX_REASONS:
        raise ValidationError(f"at most {MAX_REASONS} reject reasons, one a line")
    long = [r for r in reasons if len(r) > MAX_LENGTH]
    if long:
        raise ValidationError(f"a reason has at most {MAX_LENGTH} characters: {long[0][:40]}…")
    return reasons


def reject_reasons_set(*, campaign: Campaign, text: str) -> list[str]:
    """Save the campaign's list (one reason a line; empty: the default list).

    Rejections already recorded keep the reason they were given, so a renamed
    reason counts apart from its old name.
    """
    campaign.reject_reasons = reject_reasons_clean(text)
    campaign.save(update_fields=["reject_reasons"])
    return reject_reasons(campaign)


def reject_reason_check(*, campaign: Campaign, reason: str) -> str:
    """The reason as recorded: blank, or one of the campaign's list."""
    reason = reason.strip()
    if reason and reason not in reject_reasons(campaign):
        raise ValidationError(
            f"{reason!r} is not one of this campaign's reject reasons "
            f"({', '.join(reject_reasons(campaign))}): pick one, or say why in the note"
        )
    return reason
