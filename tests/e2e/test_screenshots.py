"""The pictures of docs/ordering.md: the configurator, a quote, an active rental
and the staff order page, as Chromium renders them.

Run with DOCS_SCREENSHOTS=1 to write docs/img/*.png (each kept under 200 KB);
without it the same pages are walked and checked, and nothing is written.
"""

from __future__ import annotations

import io
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from portal import order_services as svc
from portal.models import GpuModel, Order, PaymentAddress
from portal.order_states import Status

pytestmark = pytest.mark.e2e

IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
MAX_BYTES = 200_000
DESKTOP = {"width": 1100, "height": 900}
# BIP-173's P2WPKH example: what a real quote's address looks like.
ADDRESS = "bc1qw508d6qejxtdg4y5r3zarvary0c5xw7kv8f3t4"
RENTAL_ADDRESS = "bc1qrp33g0q5c5txsp9arysrx4k6zdkfs4nce4xj0gdcccefvpysxf3qccfmv3"


def shoot(page, name: str) -> None:
    """Write docs/img/<name>.png when asked to; a full page, palette-reduced
    if that is what keeps it under MAX_BYTES."""
    if os.environ.get("DOCS_SCREENSHOTS") != "1":
        return
    from PIL import Image

    png = page.screenshot(full_page=True)
    if len(png) > MAX_BYTES:
        image = Image.open(io.BytesIO(png)).convert("RGB")
        out = io.BytesIO()
        image.quantize(colors=64).save(out, format="PNG", optimize=True)
        png = out.getvalue()
    assert len(png) <= MAX_BYTES, f"{name}.png is {len(png)} bytes"
    IMG.mkdir(parents=True, exist_ok=True)
    (IMG / f"{name}.png").write_bytes(png)


@pytest.fixture
def shop(settings):
    settings.OPERATOR_NAME = "Example Compute Ltd"
    settings.OPERATOR_EMAIL = "orders@compute.example"
    settings.OPERATOR_ADDRESS = "1 Harbour Road, Example City"


def test_the_pictures_of_the_ordering_guide(
    new_page, live_server, staff, make_order, shop, transactional_db
):
    page = new_page(viewport=DESKTOP, timezone_id="Europe/Berlin")

    # the configurator
    page.goto(f"{live_server.url}/order/")
    page.select_option("select[name=gpu]", str(GpuModel.objects.get(name="L40S").pk))
    page.fill("input[name=quantity]", "2")
    page.locator("label.duration", has_text="7 days").click()
    page.wait_for_function(
        "() => (document.querySelector('#total')?.innerText || '').startsWith('336.00 EUR')"
    )
    shoot(page, "order-form")

    # a quote
    quote = make_order(gpu="L40S", quantity=2, days=7)
    PaymentAddress.objects.filter(order=quote).update(address=ADDRESS)
    page.goto(f"{live_server.url}/order/t/{quote.tracking_token}/")
    assert page.locator("#qr svg").count() == 1
    page.wait_for_selector("#expiry + .local-time")
    shoot(page, "quote")

    # an active rental
    rental = make_order(gpu="A100 SXM", quantity=1, days=7)
    PaymentAddress.objects.filter(order=rental).update(address=RENTAL_ADDRESS)
    svc.order_record_notice(order=rental, transaction_id="9f2c4e1a")
    svc.order_confirm_payment(order=rental, actor="staff:ops", note="seen in block 871203")
    svc.order_start_provisioning(order=rental, actor="staff:ops", note="")
    svc.order_mark_provisioned(order=rental, actor="staff:ops", note="machines ready")
    Order.objects.filter(pk=rental.pk).update(ends_at=timezone.now() + timedelta(days=7))
    page.goto(f"{live_server.url}/order/t/{rental.tracking_token}/")
    assert page.locator("[data-status]").inner_text() == "Active"
    assert page.locator("#rental-countdown").count() == 1
    shoot(page, "rental-active")

    # the staff order page
    page.goto(f"{live_server.url}/order/staff/{quote.pk}/")
    page.fill("input[name=username]", "staff")
    page.fill("input[name=password]", "pw-for-tests")
    page.click("[type=submit]")
    page.wait_for_url(f"**/order/staff/{quote.pk}/")
    assert page.locator("#staff-action").count() == 1
    assert Order.objects.get(pk=quote.pk).status == Status.AWAITING_PAYMENT
    shoot(page, "staff-order")
