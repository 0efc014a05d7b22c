"""Order sweeps run by Celery beat; they call services and return what they did."""

from __future__ import annotations

import logging

from celery import shared_task

from portal import emails
from portal.order_services import (
    orders_expire_unpaid,
    orders_release_lapsed_holds,
    orders_rental_end_sweep,
)

log = logging.getLogger(__name__)


@shared_task(name="portal.tasks.expire_unpaid_quotes")
def expire_unpaid_quotes() -> dict[str, list[int]]:
    """Every card an unpaid order holds goes back on sale when its hold ends:
    quotes past their expiry, and notices with no payment seen in their window."""
    expired = orders_expire_unpaid()
    released = orders_release_lapsed_holds()
    if expired or released:
        log.info(
            "expired %d unpaid quote(s), released the cards of %d unverified notice(s)",
            len(expired),
            len(released),
        )
    return {"expired": expired, "released": released}


@shared_task(name="portal.tasks.rental_end_sweep")
def rental_end_sweep() -> dict[str, list[int]]:
    return orders_rental_end_sweep()


@shared_task(name="portal.tasks.send_tracking_links")
def send_tracking_links(email: str) -> None:
    """The lost-link page's e-mail, sent here rather than in its request: how
    long the page takes to answer says nothing about whether `email` ordered
    (portal/recovery_views.py). Nothing is returned, so no address or outcome
    reaches the worker's log."""
    emails.send_tracking_links(email=email)
