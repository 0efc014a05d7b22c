from __future__ import annotations

from django.core.management import call_command

from portal.models import PaymentAddress


def test_demo_lets_a_visitor_get_a_quote_in_every_currency(client, db, catalog):
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
            },
        )
        assert response.status_code == 302, response.content.decode()[:500]
    assert client.login(username="staff", password="staff-briefgpu")
    assert client.get("/order/staff/").status_code == 200
