"""The admin, as staff use it: an assigned payment address is part of an order's record."""

from __future__ import annotations

import pytest

from portal.models import CryptoCurrency, PaymentAddress
from tests.conftest import UserFactory

ADMIN = "/admin/portal/paymentaddress/"


@pytest.fixture
def admin_client(client, db):
    client.force_login(UserFactory(username="admin", is_staff=True, is_superuser=True))
    return client


def _change_form(row: PaymentAddress, **fields) -> dict:
    return {"currency": row.currency_id, "address": row.address, **fields}


def test_an_assigned_address_is_shown_read_only(admin_client, make_order):
    order = make_order()
    assigned = order.payment_address
    page = admin_client.get(f"{ADMIN}{assigned.pk}/change/").content.decode()
    assert 'name="address"' not in page and 'name="currency"' not in page
    assert assigned.address in page


def test_posting_a_new_value_for_an_assigned_address_changes_nothing(admin_client, make_order):
    order = make_order()
    assigned = order.payment_address
    admin_client.post(
        f"{ADMIN}{assigned.pk}/change/", _change_form(assigned, address="bc1-swapped-by-staff")
    )
    assigned.refresh_from_db()
    assert assigned.address == "BTC-addr-0"
    assert assigned.order == order


def test_a_free_address_can_still_be_corrected(admin_client, address_pool):
    free = PaymentAddress.objects.filter(order__isnull=True).order_by("pk").first()
    response = admin_client.post(
        f"{ADMIN}{free.pk}/change/", _change_form(free, address="bc1-fixed-typo")
    )
    assert response.status_code == 302
    free.refresh_from_db()
    assert free.address == "bc1-fixed-typo"


def test_an_assigned_address_cannot_be_deleted(admin_client, make_order):
    assigned = make_order().payment_address
    assert admin_client.get(f"{ADMIN}{assigned.pk}/delete/").status_code == 403
    assert admin_client.post(f"{ADMIN}{assigned.pk}/delete/", {"post": "yes"}).status_code == 403
    assert PaymentAddress.objects.filter(pk=assigned.pk).exists()


def test_the_bulk_delete_refuses_a_selection_with_an_assigned_address(admin_client, make_order):
    assigned = make_order().payment_address
    free = PaymentAddress.objects.filter(order__isnull=True).order_by("pk").first()
    selection = {"action": "delete_selected", "_selected_action": [assigned.pk, free.pk]}
    # The confirmation page says why, and confirming anyway is refused.
    assert "permission to delete" in admin_client.post(ADMIN, selection).content.decode()
    assert admin_client.post(ADMIN, {**selection, "post": "yes"}).status_code == 403
    assert PaymentAddress.objects.filter(pk__in=[assigned.pk, free.pk]).count() == 2


def test_a_free_address_can_be_deleted(admin_client, catalog):
    free = PaymentAddress.objects.create(
        currency=CryptoCurrency.objects.get(code="BTC"), address="bc1-never-used"
    )
    response = admin_client.post(f"{ADMIN}{free.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not PaymentAddress.objects.filter(pk=free.pk).exists()
