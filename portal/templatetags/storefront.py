"""How the storefront writes money and time, the same on every page.

Amounts carry their unit (the catalog's currency, or the crypto currency's
code) and never an exponent: `Decimal.normalize()` writes 60000 as `6E+4`.
Times are UTC on the server; portal/static/portal/site.js adds the viewer's
local time beside each `<time>` and ticks the countdowns.
"""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

from django import template
from django.conf import settings
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from portal.models import CryptoCurrency, format_amount

register = template.Library()


@register.filter
def plain(value) -> str:
    """A decimal in positional notation, without trailing zeros."""
    if value is None or value == "":
        return ""
    return f"{Decimal(value).normalize():f}"


@register.filter
def crypto(amount, currency: CryptoCurrency) -> str:
    """`0.024 BTC`: to the currency's smallest unit, with its code."""
    if amount is None:
        return ""
    return f"{format_amount(Decimal(amount), currency.decimals)} {currency.code}"


@register.filter
def fiat(amount, code: str = "") -> str:
    """`1440.00 EUR`: two decimals and the currency (the catalog's by default)."""
    if amount is None:
        return ""
    return f"{Decimal(amount):.2f} {code or settings.FIAT_CURRENCY}"


def _iso(moment: datetime) -> str:
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@register.simple_tag
def utc(moment: datetime | None, element_id: str = ""):
    """`<time datetime="…">2026-12-03 14:05 UTC</time>`: the script adds local time."""
    if moment is None:
        return ""
    return format_html(
        '<time{} datetime="{}">{} UTC</time>',
        format_html(' id="{}"', element_id) if element_id else "",
        _iso(moment),
        moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M"),
    )


def remaining(seconds: float) -> str:
    """What is left, as site.js's countdown writes it: `59 min 30 s`,
    `1 h 02 min 09 s`, `3 d 4 h 12 min`; `0 s` once over."""
    total = max(0, int(seconds))
    days, rest = divmod(total, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days} d {hours} h {minutes:02d} min"
    if hours:
        return f"{hours} h {minutes:02d} min {secs:02d} s"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


@register.simple_tag
def countdown(
    until: datetime | None, now: datetime | None = None, element_id: str = "", over: str = "over"
):
    """The time left until `until`, rendered by the server; site.js ticks it
    and writes `over` once it is reached."""
    if until is None:
        return ""
    now = now or timezone.now()
    left = max(0, int((until - now).total_seconds()))
    return format_html(
        '<span class="countdown"{} data-left="{}" data-over="{}"{}>{}</span>',
        format_html(' id="{}"', element_id) if element_id else "",
        left,
        over,
        "" if left else mark_safe(' data-done="1"'),  # noqa: S308 — a constant
        f"{remaining(left)} left" if left else over,
    )
