"""The rental advice a profile's estimate and page ask for, as an interface.

Cards, prices, stock, rental durations and environments are the catalog's,
in portal, which depends on campaigns; so campaigns names what it needs here
(`Advisor`) and portal registers its implementation in PortalConfig.ready()
(portal/apps.py). Django loads portal in the web process, in the workers and
in management commands alike, so every process that builds an estimate or
shows a profile has the same advisor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from campaigns.models import Estimate

#: Hours of the whole corpus on the measured device at a batch size, and the
#: part of them spent reading, decoding, writing and checking; None when no
#: batch size is given or it cannot be priced.
HoursAt = Callable[[int | None], tuple[float, float] | None]


@dataclass(frozen=True)
class RentalAdvice:
    """The measured hours projected onto the catalog's cards, and the plan chosen."""

    projections: list[dict[str, Any]]  # one row per active card: tier, batch size, hours
    speed_source: str  # where the measured device's speed relative to the cards comes from
    plan: (
        dict[str, Any] | None
    )  # the cheapest rental that holds its batch and finishes; None if none
    reasons: list[str]  # why that plan, or why none


class Advisor(Protocol):
    def rental_advise(
        self, *, device: str, tier_batch: Mapping[int, int | None], hours_at: HoursAt
    ) -> RentalAdvice:
        """Every card's hours from the measured device's, and the cheapest plan.

        `tier_batch` is the largest measured batch per memory tier (GB), None
        where none keeps the margin; `hours_at` prices a batch size on the
        measured device.
        """
        ...

    def rental_plan(
        self, *, projections: list[dict[str, Any]]
    ) -> tuple[dict[str, Any] | None, list[str]]:
        """The cheapest rental for these projections (rental_advise's rows,
        their hours scaled to another corpus, say), and why; None if none fits."""
        ...

    def environment_match(self, runtime: dict[str, Any]) -> tuple[object | None, str]:
        """The catalog environment with the profile's torch and CUDA, and a sentence why."""
        ...

    def order_link(self, *, estimate: Estimate) -> str:
        """The order form's URL, pre-filled with the estimate's plan."""
        ...


_advisor: Advisor | None = None


def advisor_register(implementation: Advisor) -> None:
    global _advisor
    _advisor = implementation


def advisor() -> Advisor:
    if _advisor is None:
        raise RuntimeError(
            "no rental advisor registered: portal registers one in PortalConfig.ready(); "
            "is portal in INSTALLED_APPS?"
        )
    return _advisor
