from __future__ import annotations

from decimal import Decimal


def test_an_order_gets_a_locked_quote_and_an_address_of_its_own(make_order):
    first, second = make_order(), make_order()
    assert first.status == "awaiting_payment"
    assert first.fiat_total == Decimal("98.00")  # 14.00 × 1 × 7
    assert first.crypto_amount == Decimal("0.00163334")  # rounded up, never short
    assert first.payment_address.address != second.payment_address.address
    assert first.payment_uri() == f"bitcoin:{first.payment_address.address}?amount=0.00163334"
    assert len(first.tracking_token) >= 32
