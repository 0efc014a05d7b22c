"""Quotes from BTCPay Server invoices, against a small Greenfield server on 127.0.0.1.

The server implements the endpoints a quote and a payment check use as BTCPay
documents them (docs.btcpayserver.org/API/Greenfield/v1: Invoices_CreateInvoice,
Invoices_GetInvoice and Invoices_GetInvoicePaymentMethods) and records every
request it got; `pay` is a customer's payment arriving on an invoice.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
import threading
import time
import uuid
from datetime import UTC, datetime
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from portal import btcpay, order_services
from portal.models import Order, OrderEvent, PaymentAddress
from portal.pricing import QuoteRefused
from tests.portal.test_order_views import _post_data

STORE = "St0reID"
API_KEY = "greenfield-api-key-0123"
WEBHOOK_SECRET = "store-webhook-secret"
INVOICES = re.compile(r"^/api/v1/stores/(?P<store>[^/]+)/invoices$")
INVOICE = re.compile(r"^/api/v1/stores/(?P<store>[^/]+)/invoices/(?P<invoice>[^/]+)$")
METHODS = re.compile(
    r"^/api/v1/stores/(?P<store>[^/]+)/invoices/(?P<invoice>[^/]+)/payment-methods$"
)
RATE = Decimal("60000.00")


class FakeBTCPay(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.requests: list[dict] = []
        self.invoices: dict[str, dict] = {}
        # What the test makes it do: a status to answer with, a delay, a shape.
        self.fail_with: int | None = None
        self.delay = 0.0
        self.legacy_shape = False  # BTCPay 1.x: paymentMethod / cryptoCode
        self.destination = "bc1qcustomerpaysbtcpayhere0000000000000000"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def pay(self, invoice_id: str, amount: Decimal) -> None:
        """A payment of `amount` BTC arrives on the invoice (added to earlier ones)."""
        invoice = self.invoices[invoice_id]
        invoice["paid"] = str(Decimal(invoice.get("paid", "0")) + amount)


class _Handler(BaseHTTPRequestHandler):
    server: FakeBTCPay

    def log_message(self, format, *args):  # quiet: pytest shows failures
        pass

    def do_POST(self):
        self._handle("POST")

    def do_GET(self):
        self._handle("GET")

    def _handle(self, method: str) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        srv = self.server
        srv.requests.append(
            {"method": method, "path": self.path, "headers": dict(self.headers), "body": raw}
        )
        if srv.delay:
            time.sleep(srv.delay)
        if self.headers.get("Authorization") != f"token {API_KEY}":
            return self._json(
                401, {"code": "unauthenticated", "message": "Authentication is required"}
            )
        if srv.fail_with:
            return self._json(
                srv.fail_with, {"code": "generic-error", "message": "store is broken"}
            )
        if method == "POST" and (match := INVOICES.match(self.path)):
            return self._create(match["store"], json.loads(raw))
        if method == "GET" and (match := METHODS.match(self.path)):
            return self._methods(match["store"], match["invoice"])
        if method == "GET" and (match := INVOICE.match(self.path)):
            invoice = srv.invoices.get(match["invoice"])
            if match["store"] != STORE or invoice is None:
                return self._json(404, {"code": "invoice-not-found", "message": "no such invoice"})
            return self._json(200, {k: v for k, v in invoice.items() if k != "paid"})
        return self._json(404, {"code": "not-found", "message": "no such endpoint"})

    def _create(self, store: str, body: dict) -> None:
        if store != STORE:
            return self._json(403, {"code": "forbidden", "message": "not your store"})
        invoice_id = uuid.uuid4().hex[:22]
        now = int(time.time())
        invoice = {
            "id": invoice_id,
            "storeId": store,
            "amount": body["amount"],
            "currency": body["currency"],
            "type": "Standard",
            "checkoutLink": f"{self.server.url}/i/{invoice_id}",
            "status": "New",
            "additionalStatus": "None",
            "createdTime": now,
            "expirationTime": now + 60 * body["checkout"]["expirationMinutes"],
            "monitoringExpiration": now + 86400,
            "archived": False,
            "metadata": body["metadata"],
            "checkout": body["checkout"],
        }
        self.server.invoices[invoice_id] = invoice
        self._json(200, invoice)

    def _methods(self, store: str, invoice_id: str) -> None:
        invoice = self.server.invoices.get(invoice_id)
        if store != STORE or invoice is None:
            return self._json(404, {"code": "invoice-not-found", "message": "no such invoice"})
        rate = RATE
        amount = (Decimal(invoice["amount"]) / rate).quantize(Decimal("0.00000001"))
        paid = Decimal(invoice.get("paid", "0")).quantize(Decimal("0.00000001"))
        due = max(Decimal(0), amount - paid)
        address = self.server.destination
        on_chain = {
            "destination": address,
            "paymentLink": f"bitcoin:{address}?amount={due}&pj=https://btcpay.test/BTC/pj",
            "rate": f"{rate}",
            "paymentMethodPaid": f"{paid}",
            "totalPaid": f"{paid}",
            "due": f"{due}",
            "amount": f"{amount}",
            "networkFee": "0.00000000",
            "payments": [],
            "activated": True,
            "additionalData": {},
        }
        lightning = {
            **on_chain,
            "destination": "lnbcrt560u1pjlightninginvoice",
            "paymentLink": "lightning:lnbcrt560u1pjlightninginvoice",
        }
        if self.server.legacy_shape:
            on_chain.update(paymentMethod="BTC", cryptoCode="BTC")
            lightning.update(paymentMethod="BTC-LightningNetwork", cryptoCode="BTC")
        else:
            on_chain.update(paymentMethodId="BTC-CHAIN", currency="BTC")
            lightning.update(paymentMethodId="BTC-LN", currency="BTC")
        self._json(200, [lightning, on_chain])  # on-chain second: the client must choose

    def _json(self, status: int, payload) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def btcpay_server(settings):
    server = FakeBTCPay()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    settings.BTCPAY_URL = server.url
    settings.BTCPAY_STORE_ID = STORE
    settings.BTCPAY_API_KEY = API_KEY
    settings.BTCPAY_WEBHOOK_SECRET = WEBHOOK_SECRET
    settings.BTCPAY_TIMEOUT_SECONDS = 2.0
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


@pytest.fixture
def no_staff_rates(catalog):
    """With BTCPay the rate is BTCPay's: no staff rate, and no pool, is needed."""


def _make(**fields) -> Order:
    from portal.models import CryptoCurrency, Environment, GpuModel

    plan = order_services.Plan(
        gpu=GpuModel.objects.get(name="L40S"),
        quantity=2,
        days=7,
        environment=Environment.objects.first(),
        currency=CryptoCurrency.objects.get(code="BTC"),
    )
    contact = {"first_name": "Grace", "last_name": "Hopper", "email": "grace@example.org"}
    return order_services.order_create(plan=plan, **{**contact, **fields})


# --- the quote -------------------------------------------------------------------------


def test_a_quote_is_a_btcpay_invoice_and_the_order_takes_its_address_and_amount(
    btcpay_server, no_staff_rates, address_pool
):
    order = _make()

    order.refresh_from_db()
    [invoice] = btcpay_server.invoices.values()
    assert order.btcpay_invoice_id == invoice["id"]
    assert order.payment_address.address == btcpay_server.destination
    assert order.crypto_amount == Decimal("0.0056")  # 336.00 EUR at BTCPay's 60000
    assert order.rate == Decimal("60000")
    assert order.quote_expires_at == datetime.fromtimestamp(invoice["expirationTime"], UTC)
    # BTCPay's own link (with its payjoin endpoint), not one we build.
    assert order.payment_uri() == (
        f"bitcoin:{btcpay_server.destination}?amount=0.00560000&pj=https://btcpay.test/BTC/pj"
    )
    # The pool is left alone: BTCPay's address is the order's only assigned one.
    assert list(PaymentAddress.objects.filter(order__isnull=False)) == [order.payment_address]
    [created] = OrderEvent.objects.filter(order=order)
    assert f"BTCPay invoice {invoice['id']}" in created.note


def test_the_requests_are_shaped_as_greenfield_documents_them(btcpay_server, no_staff_rates):
    order = _make()

    create, methods = btcpay_server.requests
    assert (create["method"], create["path"]) == ("POST", f"/api/v1/stores/{STORE}/invoices")
    assert create["headers"]["Authorization"] == f"token {API_KEY}"
    assert create["headers"]["Content-Type"] == "application/json"
    body = json.loads(create["body"])
    assert body["amount"] == "336.00" and body["currency"] == "EUR"
    assert body["metadata"]["orderId"] == order.reference
    assert body["checkout"] == {"expirationMinutes": 60, "lazyPaymentMethods": False}
    # No personal data leaves for BTCPay: no name, no e-mail, no tracking token.
    for private in ("Grace", "Hopper", "grace@example.org", order.tracking_token):
        assert private not in create["body"].decode()
    assert (methods["method"], methods["path"]) == (
        "GET",
        f"/api/v1/stores/{STORE}/invoices/{order.btcpay_invoice_id}/payment-methods",
    )
    assert methods["headers"]["Authorization"] == f"token {API_KEY}"


def test_a_btcpay_1x_payment_method_shape_works_too(btcpay_server, no_staff_rates):
    btcpay_server.legacy_shape = True
    order = _make()
    assert order.payment_address.address == btcpay_server.destination


def test_without_btcpay_the_pool_and_the_staff_rate_still_quote(make_order, settings):
    settings.BTCPAY_URL = settings.BTCPAY_STORE_ID = settings.BTCPAY_API_KEY = ""
    order = make_order()
    assert order.payment_address.address == "BTC-addr-0"
    assert order.btcpay_invoice_id == "" and order.payment_link == ""


# --- BTCPay failing refuses the quote and creates nothing ---------------------------------


def _nothing_created() -> bool:
    return not (
        Order.objects.exists() or PaymentAddress.objects.exists() or OrderEvent.objects.exists()
    )


@pytest.mark.parametrize("status", [400, 403, 500, 503])
def test_an_error_answer_refuses_the_quote_and_creates_nothing(
    btcpay_server, no_staff_rates, status, caplog
):
    btcpay_server.fail_with = status
    with pytest.raises(QuoteRefused, match="payment processor is not answering"):
        _make()
    assert _nothing_created()
    assert f"HTTP {status} store is broken" in caplog.text  # the operator sees why


def test_a_wrong_api_key_refuses_the_quote(btcpay_server, no_staff_rates, settings, caplog):
    settings.BTCPAY_API_KEY = "revoked"
    with pytest.raises(QuoteRefused):
        _make()
    assert _nothing_created()
    assert "HTTP 401 Authentication is required" in caplog.text


def test_a_timeout_refuses_the_quote_and_creates_nothing(btcpay_server, no_staff_rates, settings):
    settings.BTCPAY_TIMEOUT_SECONDS = 0.3
    btcpay_server.delay = 1.5
    started = time.monotonic()
    with pytest.raises(QuoteRefused):
        _make()
    assert time.monotonic() - started < 1.4  # the customer waited the timeout, not BTCPay
    assert _nothing_created()


def test_an_unreachable_server_refuses_the_quote(no_staff_rates, settings):
    server = FakeBTCPay()
    url = server.url
    server.server_close()  # nothing listens there any more
    settings.BTCPAY_URL, settings.BTCPAY_STORE_ID, settings.BTCPAY_API_KEY = url, STORE, API_KEY
    with pytest.raises(QuoteRefused):
        _make()
    assert _nothing_created()


def test_an_invoice_without_an_on_chain_address_refuses_the_quote(btcpay_server, no_staff_rates):
    btcpay_server.destination = ""  # lazy payment methods: no address yet
    with pytest.raises(QuoteRefused):
        _make()
    assert _nothing_created()


def test_an_address_btcpay_gives_twice_refuses_the_second_quote(btcpay_server, no_staff_rates):
    first = _make()
    with pytest.raises(QuoteRefused, match="address already in use"):
        _make(email="ada@example.org")  # another customer: within the caps
    assert list(Order.objects.all()) == [first]


def test_a_partial_configuration_refuses_quotes_rather_than_using_the_pool(make_order, settings):
    settings.BTCPAY_URL = "https://btcpay.example.org"
    settings.BTCPAY_STORE_ID = settings.BTCPAY_API_KEY = ""
    with pytest.raises(QuoteRefused):
        make_order()
    assert not Order.objects.exists()


def test_the_form_shows_the_refusal_and_creates_nothing(client, btcpay_server, no_staff_rates):
    btcpay_server.fail_with = 500
    response = client.post("/order/", _post_data())
    assert response.status_code == 200
    assert "Our payment processor is not answering right now" in response.content.decode()
    assert _nothing_created()


# --- the webhook finds the order by its invoice ---------------------------------------------


def _deliver(payload: dict):
    body = json.dumps(payload).encode()
    signature = "sha256=" + hmac.new(WEBHOOK_SECRET.encode(), body, hashlib.sha256).hexdigest()
    return btcpay.handle_delivery(body=body, signature_header=signature)


def _settled(invoice_id: str, metadata: dict | None = None) -> dict:
    return {
        "deliveryId": uuid.uuid4().hex,
        "webhookId": "wh-1",
        "originalDeliveryId": None,
        "isRedelivery": False,
        "type": "InvoiceSettled",
        "timestamp": 1700000000,
        "storeId": STORE,
        "invoiceId": invoice_id,
        "metadata": metadata or {},
    }


def test_the_webhook_maps_the_invoice_to_its_order(btcpay_server, no_staff_rates):
    order = _make()
    btcpay_server.pay(order.btcpay_invoice_id, order.crypto_amount)
    # By the invoice id alone: BTCPay's metadata is the store's, ours is the id.
    result = _deliver(_settled(order.btcpay_invoice_id))
    order.refresh_from_db()
    assert (result.status, result.message) == (200, "applied: payment confirmed")
    assert order.status == "confirmed"


def test_another_invoice_naming_the_order_does_not_move_it(btcpay_server, no_staff_rates):
    order = _make()
    result = _deliver(_settled("some-other-invoice", {"orderId": order.reference}))
    order.refresh_from_db()
    assert result.message == "no such order"
    assert order.status == "awaiting_payment"
