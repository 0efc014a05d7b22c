from __future__ import annotations

from django.core.management import call_command
from django.http import HttpRequest  # django-axes checks logins against a request

from portal.models import PaymentAddress
from tests.conftest import SSH_KEY


def test_demo_lets_a_visitor_get_a_quote_in_every_currency(client, db, catalog, settings):
    settings.DEBUG = True  # the development database it is made for
    call_command("demo", "--no-run")
    call_command("demo", "--no-run")  # idempotent: the pools stay at 20 free
    for code in ("BTC", "LTC", "XMR"):
        assert PaymentAddress.objects.filter(currency__code=code, order=None).count() == 20
    from portal.models import CryptoCurrency, Environment, GpuModel, RentalDuration

    for currency in CryptoCurrency.objects.all():
        response = client.post(
            "/order/",
            {
                "gpu": GpuModel.objects.get(name="A40").pk,
                "quantity": 1,
                "duration": RentalDuration.objects.get(days=3).pk,
                "environment": Environment.objects.first().pk,
                "first_name": "Demo",
                "last_name": "Visitor",
                # One visitor per currency: an address has two unpaid orders at most.
                "email": f"demo.{currency.code.lower()}@example.org",
                "currency": currency.pk,
                "ssh_keys": SSH_KEY,
            },
        )
        assert response.status_code == 302, response.content.decode()[:500]
    assert client.login(request=HttpRequest(), username="staff", password="staff-briefgpu")
    assert client.get("/order/staff/").status_code == 200


def test_the_demo_staff_account_can_do_the_documented_staff_tasks(client, db, catalog, settings):
    from decimal import Decimal

    from portal.models import CryptoCurrency, ExchangeRate

    settings.DEBUG = True
    call_command("demo", "--no-run")
    assert client.login(request=HttpRequest(), username="staff", password="staff-briefgpu")
    # rates go stale after EXCHANGE_RATE_MAX_AGE_MINUTES: staff record a new one
    btc = CryptoCurrency.objects.get(code="BTC")
    assert client.get("/admin/portal/exchangerate/add/").status_code == 200
    response = client.post(
        "/admin/portal/exchangerate/add/", {"currency": btc.pk, "fiat_per_unit": "61000"}
    )
    assert response.status_code == 302
    assert ExchangeRate.objects.filter(currency=btc, fiat_per_unit=Decimal("61000")).exists()
    # the address pool and the orders, in the admin and on the verification pages
    for url in (
        "/admin/portal/paymentaddress/",
        "/admin/portal/paymentaddress/add/",
        "/admin/portal/order/",
        "/order/staff/",
    ):
        assert client.get(url).status_code == 200, url
    # and nothing beyond them: the catalog and the accounts stay the owner's
    assert client.get("/admin/portal/gpumodel/1/change/").status_code == 403
    assert client.get("/admin/auth/user/").status_code == 403


def test_demo_refuses_to_run_with_debug_off_unless_forced(db, catalog, settings):
    import pytest
    from django.contrib.auth import get_user_model
    from django.core.management.base import CommandError

    settings.DEBUG = False
    with pytest.raises(CommandError, match="DEBUG is off"):
        call_command("demo", "--no-run")
    assert not get_user_model().objects.filter(username="staff").exists()
    assert not PaymentAddress.objects.exists()
    call_command("demo", "--no-run", "--force")
    assert PaymentAddress.objects.filter(order=None).count() == 60
