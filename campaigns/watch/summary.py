"""The watch's figures as a person reads them (pages) and as JSON
(`campaign status --json`): one wording everywhere."""

from __future__ import annotations

import datetime as dt

from campaigns.watch.eta import Eta, Rate, RentalFit, duration
from campaigns.watch.rentals import Rental


def rate_text(rate: Rate | None, cost_unit: str) -> str:
    if rate is None:
        return "measuring: fewer than 3 batches finished"
    text = f"{rate.units_per_s:,.1f} units/s"
    if rate.cost_per_s is not None:
        text += f", {rate.cost_per_s:,.0f} {cost_unit}/s"
    return text + f" over the last {rate.batches} batches"


def eta_text(eta: Eta | None, *, left_units: int, running: bool = True) -> str:
    if not left_units:
        return "nothing left to run"
    if eta is None:
        return "measuring: an estimate follows the first batches"
    if not running:
        # Paused, at a checkpoint, idle: no end to promise, only the work left.
        return (
            f"not running: about {duration(eta.seconds)} of work left at the recent rate, "
            "from when it runs again"
        )
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


def fit_text(fit: RentalFit | None, rental: Rental | None, *, now: dt.datetime) -> str:
    if fit is None or rental is None:
        return ""
    used = f"{fit.used_share:.0%} of the rental used"
    if fit.margin_seconds is None:
        left = max(0.0, (rental.ends_at - now).total_seconds())
        return (
            f"{rental.label} ends {rental.ends_at:%Y-%m-%d %H:%M} UTC, in {duration(left)}; "
            f"{used}, its clock running whether the run does or not"
        )
    when = "before" if fit.margin_seconds >= 0 else "after"
    return (
        f"done ~{duration(fit.margin_seconds)} {when} {rental.label} ends "
        f"({rental.ends_at:%Y-%m-%d %H:%M} UTC); {used}"
    )


def _iso(at: dt.datetime | None) -> str | None:
    return at.isoformat() if at is not None else None


def _rate_json(rate: Rate | None) -> dict | None:
    if rate is None:
        return None
    return {
        "units_per_s": round(rate.units_per_s, 3),
        "cost_per_s": round(rate.cost_per_s, 3) if rate.cost_per_s is not None else None,
        "batches": rate.batches,
    }


def _eta_json(eta: Eta | None, *, running: bool) -> dict | None:
    """None while measuring; without times to finish while it does not run."""
    if eta is None:
        return None
    return {
        "seconds": round(eta.seconds),
        "low_seconds": round(eta.low_seconds),
        "high_seconds": round(eta.high_seconds),
        "finishes_at": _iso(eta.finishes_at) if running else None,
        "earliest": _iso(eta.earliest) if running else None,
        "latest": _iso(eta.latest) if running else None,
        "by_cost": eta.by_cost,
    }


def watch_json(watch) -> dict:
    """`campaign status --json`'s "watch" from state.campaign_watch's Watch."""
    fit, rental, stall = watch.fit, watch.rental, watch.stall
    return {
        "running": watch.active,
        "left": {
            "units": watch.left.units,
            "cost": watch.left.cost,
            "cost_exact": watch.left.exact,
            "cost_unit": watch.cost_unit,
        },
        "rate": _rate_json(watch.rate),
        "eta": _eta_json(watch.eta, running=watch.active),
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
        "versions": [
            {
                "version": v.version.label,
                "current": v.current,
                "left": {"units": v.left.units, "cost": v.left.cost},
                "rate": _rate_json(v.rate),
                "eta": _eta_json(v.eta, running=watch.active),
            }
            for v in watch.versions
        ],
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
    if found and found["finishes_at"]:
        lines.append(
            f"ETA: {found['finishes_at']} (in {duration(found['seconds'])}, between "
            f"{duration(found['low_seconds'])} and {duration(found['high_seconds'])})"
        )
    elif found:
        lines.append(f"not running: about {duration(found['seconds'])} of work left")
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
