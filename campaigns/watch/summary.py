"""The watch's figures as a person reads them (pages) and as JSON
(`campaign status --json`): one wording everywhere."""

from __future__ import annotations

import datetime as dt

from campaigns.watch.eta import Eta, Rate, RentalFit, duration
from campaigns.watch.rentals import Rental
from campaigns.watch.stall import Stall


def rate_text(rate: Rate | None, cost_unit: str) -> str:
    if rate is None:
        return "measuring: fewer than 3 batches finished"
    text = f"{rate.units_per_s:,.1f} units/s"
    if rate.cost_per_s is not None:
        text += f", {rate.cost_per_s:,.0f} {cost_unit}/s"
    return text + f" over the last {rate.batches} batches"


def eta_text(eta: Eta | None, *, left_units: int) -> str:
    if not left_units:
        return "nothing left to run"
    if eta is None:
        return "measuring: an estimate follows the first batches"
    text = f"~{eta.finishes_at:%Y-%m-%d %H:%M} UTC, in {duration(eta.seconds)}"
    low, high = duration(eta.low_seconds), duration(eta.high_seconds)
    if low != high:
        text += f" (between {low} and {high})"
    if not eta.by_cost:
        text += ", counted in units: costs not weighed"
    return text


def eta_short(eta: Eta | None, *, left_units: int) -> str:
    """For the campaign list: when, in a few words."""
    if not left_units:
        return ""
    if eta is None:
        return "ETA: measuring"
    return f"ETA ~{eta.finishes_at:%m-%d %H:%M} UTC (in {duration(eta.seconds)})"


def fit_text(fit: RentalFit | None, rental: Rental | None) -> str:
    if fit is None or rental is None:
        return ""
    used = f"{fit.used_share:.0%} of the rental used"
    if fit.margin_seconds is None:
        return f"{rental.label} ends {rental.ends_at:%Y-%m-%d %H:%M} UTC; {used}"
    when = "before" if fit.margin_seconds >= 0 else "after"
    return (
        f"done ~{duration(fit.margin_seconds)} {when} {rental.label} ends "
        f"({rental.ends_at:%Y-%m-%d %H:%M} UTC); {used}"
    )


def _iso(at: dt.datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def eta_json(
    *,
    eta: Eta | None,
    rate: Rate | None,
    left_units: int,
    left_cost: int | None,
    cost_unit: str,
    fit: RentalFit | None = None,
    rental: Rental | None = None,
    stall: Stall | None = None,
) -> dict:
    return {
        "left": {"units": left_units, "cost": left_cost, "cost_unit": cost_unit},
        "rate": None
        if rate is None
        else {
            "units_per_s": round(rate.units_per_s, 3),
            "cost_per_s": round(rate.cost_per_s, 3) if rate.cost_per_s is not None else None,
            "batches": rate.batches,
        },
        "eta": None
        if eta is None
        else {
            "seconds": round(eta.seconds),
            "low_seconds": round(eta.low_seconds),
            "high_seconds": round(eta.high_seconds),
            "finishes_at": _iso(eta.finishes_at),
            "earliest": _iso(eta.earliest),
            "latest": _iso(eta.latest),
            "by_cost": eta.by_cost,
        },
        "rental": None
        if rental is None or fit is None
        else {
            "label": rental.label,
            "ends_at": _iso(rental.ends_at),
            "used_share": round(fit.used_share, 4),
            "margin_seconds": round(fit.margin_seconds) if fit.margin_seconds is not None else None,
        },
        "stall": None
        if stall is None
        else {
            "cause": stall.cause,
            "title": stall.title,
            "advice": stall.advice,
            "since": _iso(stall.since),
            "waited_seconds": round(stall.waited),
        },
    }


def status_lines(watch: dict) -> list[str]:
    """`campaign status`'s lines from eta_json's dict."""
    lines = []
    if watch["stall"]:
        stall = watch["stall"]
        lines.append(f"STALLED: {stall['title']} — {stall['advice']}")
    rate, found = watch["rate"], watch["eta"]
    if rate:
        cost = (
            f", {rate['cost_per_s']:,.0f} {watch['left']['cost_unit']}/s"
            if rate["cost_per_s"] is not None
            else ""
        )
        lines.append(
            f"rate: {rate['units_per_s']:,.1f} units/s{cost} (last {rate['batches']} batches)"
        )
    if found:
        lines.append(
            f"ETA: {found['finishes_at']} (in {duration(found['seconds'])}, between "
            f"{duration(found['low_seconds'])} and {duration(found['high_seconds'])})"
        )
    if watch["rental"]:
        rental = watch["rental"]
        margin = rental["margin_seconds"]
        fits = (
            ""
            if margin is None
            else f"; done ~{duration(margin)} {'before' if margin >= 0 else 'after'} it ends"
        )
        lines.append(
            f"rental: {rental['label']} ends {rental['ends_at']}, "
            f"{rental['used_share']:.0%} used{fits}"
        )
    return lines
