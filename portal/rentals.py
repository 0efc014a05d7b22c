"""The rentals campaigns' watch asks about (campaigns/watch/rentals.py): the
active orders that run a campaign, as their `campaign` (the one the order was
sized on) or one of their `campaigns`."""

from __future__ import annotations

import datetime as dt

from django.db.models import Q

from campaigns.watch.rentals import Rental
from portal.models import Order
from portal.order_states import Status


def _rental(order: Order) -> Rental:
    assert order.starts_at is not None and order.ends_at is not None
    return Rental(
        key=f"order-{order.pk}",
        label=(
            f"Rental {order.reference} ({order.quantity} × {order.gpu.name}, "
            f"{order.duration_days} days)"
        ),
        starts_at=order.starts_at,
        ends_at=order.ends_at,
    )


def _active():
    return Order.objects.filter(
        status=Status.ACTIVE, starts_at__isnull=False, ends_at__isnull=False
    ).select_related("gpu")


class PortalRentals:
    def rental_of(self, campaign_id: int) -> Rental | None:
        order = (
            _active()
            .filter(Q(campaign_id=campaign_id) | Q(campaigns=campaign_id))
            .order_by("-ends_at")
            .first()
        )
        return _rental(order) if order is not None else None

    def ending(self, *, now: dt.datetime, within: dt.timedelta) -> list[tuple[int, Rental]]:
        found = []
        for order in (
            _active()
            .filter(ends_at__gt=now, ends_at__lte=now + within)
            .prefetch_related("campaigns")
        ):
            rental = _rental(order)
            ids = {c.pk for c in order.campaigns.all()}
            if order.campaign_id is not None:
                ids.add(order.campaign_id)
            found += [(pk, rental) for pk in sorted(ids)]
        return found
