"""The rental a campaign runs on, as an interface: orders are portal's, which
depends on campaigns, so campaigns names what it needs here and portal
registers where it comes from in PortalConfig.ready() (portal/apps.py), as
for the rental advisor (campaigns/profiles/advice.py)."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Rental:
    """An active rental that runs a campaign."""

    key: str  # stable: what makes its "ending" one event ("order-12")
    label: str  # "order 12: 1 x H200, 7 days"
    starts_at: dt.datetime
    ends_at: dt.datetime


class Rentals(Protocol):
    def rental_of(self, campaign_id: int) -> Rental | None:
        """The active rental running that campaign (the one ending last), or None."""
        ...

    def ending(self, *, now: dt.datetime, within: dt.timedelta) -> list[tuple[int, Rental]]:
        """(campaign id, rental) for every campaign of an active rental that
        ends between `now` and `now + within`."""
        ...


_source: list[Rentals] = []


def rentals_register(source: Rentals) -> None:
    _source[:] = [source]


def rental_of(campaign_id: int) -> Rental | None:
    return _source[0].rental_of(campaign_id) if _source else None


def rentals_ending(*, now: dt.datetime, within: dt.timedelta) -> list[tuple[int, Rental]]:
    return _source[0].ending(now=now, within=within) if _source else []
