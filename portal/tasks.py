"""Order sweeps run by Celery beat; they call services and return what they did."""

from __future__ import annotations

import logging

from celery import shared_task

from portal.order_services import orders_expire_unpaid, orders_rental_end_sweep

log = logging.getLogger(__name__)


@shared_task(name="portal.tasks.expire_unpaid_quotes")
def expire_unpaid_quotes() -> list[int]:
    expired = orders_expire_unpaid()
    if expired:
        log.info("expired %d unpaid quote(s)", len(expired))
    return expired


@shared_task(name="portal.tasks.rental_end_sweep")
def rental_end_sweep() -> dict[str, list[int]]:
    return orders_rental_end_sweep()
