"""BTCPay Server's Greenfield API, the calls a quote and a payment need (docs/btcpay.md).

`POST /api/v1/stores/{store}/invoices` creates the invoice for the order's
fiat total, with the order's reference as `metadata.orderId`; `GET
…/invoices/{id}/payment-methods` gives, per payment method, the address BTCPay
watches, the amount due in that currency, the rate and a payment link. The
customer pays that address, so BTCPay sees the payment and its webhook moves
the order (portal/btcpay.py). A webhook names an invoice but carries no amount,
so before a payment moves an order `GET …/invoices/{id}` and its payment
methods say what the invoice asks and what arrived (`invoice_payment`).

Standard library only (urllib): two JSON requests do not need a dependency.
"""

from __future__ import annotations

import http.client
import json
import logging
import urllib.error
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from urllib.parse import quote

from django.conf import settings

log = logging.getLogger(__name__)

# A store's invoice response is a few kB; anything much larger is not BTCPay.
_MAX_RESPONSE_BYTES = 1_000_000
# Payment method ids of on-chain payments: BTCPay 2.x says "BTC-CHAIN", 1.x
# said "BTC" (and "BTC-OnChain" in places). Lightning and LNURL are not an
# address the customer can send a plain transaction to.
_ON_CHAIN_SUFFIXES = ("", "-CHAIN", "-ONCHAIN")


class BTCPayError(Exception):
    """BTCPay did not give a usable invoice; what went wrong, for the operator's log."""


@dataclass(frozen=True)
class Invoice:
    invoice_id: str
    destination: str
    amount_due: Decimal
    rate: Decimal | None
    payment_link: str
    expires_at: datetime | None


@dataclass(frozen=True)
class InvoicePayment:
    """An invoice's price and what arrived on it, as BTCPay sees them now."""

    invoice_id: str
    order_id: str  # metadata.orderId
    amount: Decimal | None  # the invoice's price, in `currency`
    currency: str
    crypto_code: str
    # Received, in `crypto_code`: every payment of the invoice counted
    # (Greenfield's totalPaid); None when the invoice has no such method.
    paid: Decimal | None


@dataclass(frozen=True)
class GreenfieldClient:
    url: str
    store_id: str
    api_key: str
    timeout: float

    def invoice_create(
        self,
        *,
        amount: Decimal,
        currency: str,
        order_id: str,
        crypto_code: str,
        description: str,
        expiration_minutes: int,
    ) -> Invoice:
        """An invoice for `amount` `currency` and its `crypto_code` payment details."""
        store = quote(self.store_id, safe="")
        created = self._request(
            "POST",
            f"/api/v1/stores/{store}/invoices",
            {
                "amount": f"{amount:f}",
                "currency": currency,
                # Our reference, never the customer's name or address: no KYC,
                # and the invoice list in BTCPay is read by staff only.
                "metadata": {"orderId": order_id, "itemDesc": description},
                "checkout": {
                    "expirationMinutes": expiration_minutes,
                    # The address must exist now, not when someone opens
                    # BTCPay's checkout page: our page shows it at once.
                    "lazyPaymentMethods": False,
                },
            },
        )
        invoice_id = created.get("id") if isinstance(created, dict) else None
        if not isinstance(invoice_id, str) or not 0 < len(invoice_id) <= 100:
            raise BTCPayError("the created invoice has no usable id")
        methods = self._request(
            "GET", f"/api/v1/stores/{store}/invoices/{quote(invoice_id, safe='')}/payment-methods"
        )
        method = _on_chain_method(methods, crypto_code)
        if method is None:
            raise BTCPayError(
                f"invoice {invoice_id} offers no activated on-chain {crypto_code} payment method "
                "with an address (is the store's wallet for that currency set up?)"
            )
        amount_due = _decimal(method.get("due")) or _decimal(method.get("amount"))
        if amount_due is None or amount_due <= 0:
            raise BTCPayError(f"invoice {invoice_id} gives no amount due in {crypto_code}")
        link = method.get("paymentLink")
        return Invoice(
            invoice_id=invoice_id,
            destination=method["destination"],
            amount_due=amount_due,
            rate=_decimal(method.get("rate")),
            payment_link=link if isinstance(link, str) else "",
            expires_at=_time(created.get("expirationTime")),
        )

    def invoice_payment(self, *, invoice_id: str, crypto_code: str) -> InvoicePayment:
        """What invoice `invoice_id` asks and what arrived on it in `crypto_code`."""
        path = (
            f"/api/v1/stores/{quote(self.store_id, safe='')}/invoices/{quote(invoice_id, safe='')}"
        )
        invoice = self._request("GET", path)
        if not isinstance(invoice, dict) or invoice.get("id") != invoice_id:
            raise BTCPayError(f"GET {path}: the answer is not invoice {invoice_id}")
        metadata = invoice.get("metadata")
        order_id = metadata.get("orderId") if isinstance(metadata, dict) else None
        method = _on_chain_method(self._request("GET", f"{path}/payment-methods"), crypto_code)
        paid = None
        if method is not None:
            paid = _decimal(method.get("totalPaid"))
            if paid is None:
                paid = _decimal(method.get("paymentMethodPaid"))
        return InvoicePayment(
            invoice_id=invoice_id,
            order_id=order_id if isinstance(order_id, str) else "",
            amount=_decimal(invoice.get("amount")),
            currency=str(invoice.get("currency") or ""),
            crypto_code=crypto_code,
            paid=paid,
        )

    def _request(self, method: str, path: str, body: dict | None = None):
        request = urllib.request.Request(
            self.url + path,
            method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={
                "Authorization": f"token {self.api_key}",
                "Accept": "application/json",
                **({"Content-Type": "application/json"} if body is not None else {}),
            },
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                raw = response.read(_MAX_RESPONSE_BYTES + 1)
        except urllib.error.HTTPError as exc:
            # BTCPay answers errors as JSON ProblemDetails: {"code", "message"}.
            raise BTCPayError(f"{method} {path}: HTTP {exc.code} {_problem(exc)}") from exc
        except (OSError, http.client.HTTPException) as exc:
            # Refused, unreachable, timed out (TimeoutError), cut off mid-answer.
            reason = getattr(exc, "reason", None) or exc
            raise BTCPayError(f"{method} {path}: {reason!s} ({type(reason).__name__})") from exc
        if len(raw) > _MAX_RESPONSE_BYTES:
            raise BTCPayError(f"{method} {path}: response larger than {_MAX_RESPONSE_BYTES} bytes")
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise BTCPayError(f"{method} {path}: the response is not JSON") from exc


def client_from_settings() -> GreenfieldClient | None:
    """The configured client; None when BTCPay is not configured at all.

    A partial configuration raises BTCPayError rather than falling back on the
    pool: quotes the store never sees would be paid where nobody watches.
    """
    parts = {
        "BTCPAY_URL": settings.BTCPAY_URL,
        "BTCPAY_STORE_ID": settings.BTCPAY_STORE_ID,
        "BTCPAY_API_KEY": settings.BTCPAY_API_KEY,
    }
    if not any(parts.values()):
        return None
    missing = [name for name, value in parts.items() if not value]
    if missing:
        raise BTCPayError(f"BTCPay is partly configured: {', '.join(missing)} not set")
    if not settings.BTCPAY_URL.startswith(("https://", "http://")):
        raise BTCPayError("BTCPAY_URL is not an http(s) URL")
    return GreenfieldClient(
        url=settings.BTCPAY_URL.rstrip("/"),
        store_id=settings.BTCPAY_STORE_ID,
        api_key=settings.BTCPAY_API_KEY,
        timeout=settings.BTCPAY_TIMEOUT_SECONDS,
    )


def _on_chain_method(methods, crypto_code: str) -> dict | None:
    if not isinstance(methods, list):
        return None
    code = crypto_code.upper()
    for method in methods:
        if not isinstance(method, dict):
            continue
        method_id = str(method.get("paymentMethodId") or method.get("paymentMethod") or "")
        currency = str(method.get("currency") or method.get("cryptoCode") or "")
        on_chain = method_id.upper() in {code + suffix for suffix in _ON_CHAIN_SUFFIXES}
        destination = method.get("destination")
        if (
            on_chain
            and currency.upper() == code
            and method.get("activated", True) is not False
            and isinstance(destination, str)
            and 0 < len(destination) <= 200
        ):
            return method
    return None


def _decimal(value) -> Decimal | None:
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        return None
    try:
        number = Decimal(str(value))
    except InvalidOperation:
        return None
    return number if number.is_finite() else None


def _time(value) -> datetime | None:
    # Greenfield times are Unix seconds.
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return datetime.fromtimestamp(value, UTC)
    return None


def _problem(exc: urllib.error.HTTPError) -> str:
    try:
        detail = json.loads(exc.read(10_000) or b"null")
    except (ValueError, OSError):
        return ""
    if isinstance(detail, dict) and isinstance(detail.get("message"), str):
        return detail["message"][:200]
    if isinstance(detail, list):  # ValidationProblemDetails: [{"path", "message"}]
        return "; ".join(
            f"{d.get('path')}: {d.get('message')}" for d in detail[:5] if isinstance(d, dict)
        )[:300]
    return ""
