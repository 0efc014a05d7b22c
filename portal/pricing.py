"""Prices and quotes, computed on the server only: nothing posted by a browser is a price."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_CEILING, ROUND_HALF_UP, Decimal

from django.conf import settings
from django.db.models import Sum
from django.utils import timezone

from portal.models import CryptoCurrency, ExchangeRate, GpuModel, Order
from portal.order_states import holding

CENT = Decimal("0.01")


class QuoteRefused(Exception):
    """A reason the customer reads on the form; nothing was created."""


@dataclass(frozen=True)
class Price:
    price_per_day: Decimal
    quantity: int
    days: int

    @property
    def total(self) -> Decimal:
        return (self.price_per_day * self.quantity * self.days).quantize(CENT, ROUND_HALF_UP)


def plan_price(*, gpu: GpuModel, quantity: int, days: int) -> Price:
    return Price(price_per_day=gpu.price_per_day, quantity=quantity, days=days)


def cards_available(*, gpu: GpuModel, now: datetime | None = None) -> int:
    """Stock less the cards held at `now` (one aggregate query): an unpaid
    order past its hold counts as free even before the sweep comes by."""
    now = now or timezone.now()
    held = Order.objects.filter(holding(now), gpu=gpu).aggregate(n=Sum("quantity"))["n"]
    return max(0, gpu.stock - (held or 0))


def fresh_rate(*, currency: CryptoCurrency, now: datetime) -> ExchangeRate:
    rate = ExchangeRate.objects.filter(currency=currency).order_by("-recorded_at").first()
    max_age = timedelta(minutes=settings.EXCHANGE_RATE_MAX_AGE_MINUTES)
    if rate is None or now - rate.recorded_at > max_age:
        raise QuoteRefused(
            f"No current {currency.code} rate: quotes in {currency.code} are paused until staff "
            "record one. Choose another currency or try again later."
        )
    return rate


def crypto_amount(*, fiat: Decimal, rate: ExchangeRate, decimals: int) -> Decimal:
    """Rounded up to the currency's smallest unit, so the quote never falls short."""
    return (fiat / rate.fiat_per_unit).quantize(Decimal(1).scaleb(-decimals), ROUND_CEILING)
