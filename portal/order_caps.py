"""What one visitor's unpaid orders may hold: a quote is free, so these caps
are what keep one visitor from taking the cards off sale.

Two caps, each per e-mail address (case-insensitive) and per client
(portal/client_ip.py, `client_key`: an IPv6 client by its /64):

- the number of open unpaid orders (ORDER_OPEN_PER_EMAIL, ORDER_OPEN_PER_CLIENT);
- the cards of one model those orders hold: at most ORDER_MAX_HELD_SHARE of
  the model's stock (rounded down, at least one card).

"Open unpaid" is an order not fully paid whose hold has not ended
(order_states.HOLDS_STOCK_UNTIL before `held_until`): a paid order holds its
cards for good and counts toward neither cap. Called by order_services under
the lock on every card's row, so two quotes cannot both pass a cap.
"""

from __future__ import annotations

import math
from datetime import datetime

from django.conf import settings
from django.db.models import QuerySet, Sum

from portal.models import GpuModel, Order
from portal.order_states import HOLDS_STOCK_UNTIL
from portal.pricing import QuoteRefused

_WAIT = (
    "Pay one of them, or wait until its quote expires, then order again; "
    "each order's link is in the e-mail we sent when you ordered it."
)


def open_unpaid(now: datetime) -> QuerySet[Order]:
    return Order.objects.filter(status__in=HOLDS_STOCK_UNTIL, held_until__gt=now)


def held_share_limit(gpu: GpuModel) -> int:
    """The most cards of `gpu` one visitor's unpaid orders may hold."""
    return max(1, math.floor(gpu.stock * settings.ORDER_MAX_HELD_SHARE))


def check_open_orders(
    *, email: str, client_key: str, gpu: GpuModel, quantity: int, now: datetime
) -> None:
    """QuoteRefused when this order would pass a cap of the e-mail or the client."""
    unpaid = open_unpaid(now)
    limit = settings.ORDER_OPEN_PER_EMAIL
    if unpaid.filter(email__iexact=email).count() >= limit:
        raise QuoteRefused(
            f"This e-mail address already has {limit} unpaid order(s), the most we hold "
            f"at once. {_WAIT}"
        )
    limit = settings.ORDER_OPEN_PER_CLIENT
    if client_key and unpaid.filter(client_key=client_key).count() >= limit:
        raise QuoteRefused(
            f"Your connection already has {limit} unpaid order(s), the most we hold at once. "
            f"{_WAIT}"
        )
    of_gpu = unpaid.filter(gpu=gpu)
    held = _cards(of_gpu.filter(email__iexact=email))
    if client_key:
        held = max(held, _cards(of_gpu.filter(client_key=client_key)))
    limit = held_share_limit(gpu)
    if held + quantity > limit:
        raise QuoteRefused(_share_refusal(gpu=gpu, limit=limit, held=held))


def _cards(orders: QuerySet[Order]) -> int:
    return orders.aggregate(n=Sum("quantity"))["n"] or 0


def _share_refusal(*, gpu: GpuModel, limit: int, held: int) -> str:
    room = max(0, limit - held)
    why = (
        f"Until they are paid, one customer's orders hold at most {limit} of our "
        f"{gpu.stock} {gpu.name} cards, so that no one can take them all off sale"
    )
    if held:
        why += f"; your unpaid orders hold {held} already"
    if room:
        then = f"Choose {room} or fewer, or pay an open order first and then order the rest."
    else:
        then = "Pay your open order first, then order the rest; or wait until its quote expires."
    return f"You can order {room} more {gpu.name} card(s) right now. {why}. {then}"
