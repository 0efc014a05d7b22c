"""Privacy and abuse on the ordering pages: what travels, what counts, what is mailed."""

from __future__ import annotations

from portal.models import GpuModel, Order
from tests.portal.test_order_views import _post_data


def test_invalid_submissions_do_not_use_up_the_order_limit(
    client, fresh_rates, address_pool, settings
):
    settings.ORDER_CREATE_RATE = "2/m"
    # a customer who gets the form wrong five times...
    for _ in range(5):
        response = client.post("/order/", _post_data(email="not-an-address"))
        assert response.status_code == 200
        assert "Enter a valid email address" in response.content.decode()
    # ...still places their orders, and the limit still holds after them
    assert client.post("/order/", _post_data(quantity=1)).status_code == 302
    assert client.post("/order/", _post_data(quantity=1)).status_code == 302
    assert client.post("/order/", _post_data(quantity=1)).status_code == 429
    assert Order.objects.count() == 2


def test_the_live_total_refuses_more_cards_than_are_free(client, catalog):
    l40s = GpuModel.objects.get(name="L40S")
    l40s.stock = 4
    l40s.save(update_fields=["stock"])
    html = client.get("/order/price/", {**_plan(), "quantity": 30}).content.decode()
    assert "Only 4 L40S card(s) are free; choose 4 or fewer." in html
    assert 'id="total"' not in html
    html = client.get("/order/price/", {**_plan(), "quantity": 4}).content.decode()
    assert "672.00 EUR" in html  # 24.00 × 4 × 7: the quantity typed, not another


def test_update_price_without_javascript_orders_nothing_and_counts_nothing(
    client, fresh_rates, address_pool, settings
):
    settings.ORDER_CREATE_RATE = "1/m"
    for _ in range(3):
        response = client.post("/order/", {**_post_data(), "update_price": "1"})
        assert response.status_code == 200
        assert "336.00 EUR" in response.content.decode()  # 24.00 × 2 × 7
    assert Order.objects.count() == 0
    assert client.post("/order/", _post_data()).status_code == 302


def _plan() -> dict:
    data = _post_data()
    return {k: data[k] for k in ("gpu", "quantity", "duration", "environment")}


def test_names_are_one_short_line(client, fresh_rates, address_pool, mailoutbox):
    for name in ("Grace\r\nBcc: victim@example.org", "Grace\tHopper", "Grace\u202eepoh", "G" * 61):
        response = client.post("/order/", _post_data(first_name=name))
        assert response.status_code == 200, repr(name)
        assert 'id="error-first_name"' in response.content.decode()
    response = client.post("/order/", _post_data(last_name="Hopper\nClick http://spam.example"))
    assert 'id="error-last_name"' in response.content.decode()
    assert Order.objects.count() == 0 and mailoutbox == []
    # a real name with accents and a hyphen is fine
    assert client.post("/order/", _post_data(first_name="Zoë-Ana María")).status_code == 302


def test_the_first_e_mail_echoes_nothing_the_form_writer_typed(
    client, fresh_rates, address_pool, mailoutbox, django_capture_on_commit_callbacks
):
    spam = "Win a prize at spam.example"
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/order/", _post_data(first_name=spam, last_name=spam))
    assert response.status_code == 302
    (mail,) = mailoutbox
    assert spam not in mail.body and spam not in mail.subject
    assert Order.objects.get().reference in mail.body


def test_i_paid_mails_the_first_few_notices_only(
    make_order, mailoutbox, django_capture_on_commit_callbacks, settings
):
    from portal import order_services

    settings.ORDER_NOTICE_EMAILS_MAX = 3
    order = make_order()
    mailoutbox.clear()
    for i in range(20):
        with django_capture_on_commit_callbacks(execute=True):
            order_services.order_record_notice(order=order, transaction_id=f"tx{i}")
    assert order.notices.count() == 20  # every notice is still recorded for staff
    notices = [m for m in mailoutbox if "payment notice" in m.subject]
    assert len(notices) == 3


def test_the_staff_note_field_says_the_customer_reads_it(client, staff, make_order):
    order = make_order()
    client.force_login(staff)
    page = client.get(f"/order/staff/{order.pk}/").content.decode()
    assert "shown to the customer" in page


def test_the_rejection_e_mail_carries_the_note_it_promises(
    client, staff, make_order, mailoutbox, django_capture_on_commit_callbacks
):
    order = make_order()
    client.force_login(staff)
    mailoutbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(
            f"/order/staff/{order.pk}/action/",
            {"action": "reject", "note": "the payment came from a sanctioned address"},
        )
    (mail,) = mailoutbox
    assert "rejected" in mail.subject
    assert "The note below says why." in mail.body
    assert "the payment came from a sanctioned address" in mail.body


def test_tracking_page_and_dossier_are_never_kept_by_a_cache(client, make_order):
    order = make_order()
    base = f"/order/t/{order.tracking_token}/"
    for url in (base, f"{base}dossier.zip"):
        response = client.get(url)
        assert response.status_code == 200
        cache_control = response["Cache-Control"]
        assert "private" in cache_control and "no-store" in cache_control, url


def test_an_oversized_webhook_body_is_a_413_and_one_warning(client, db, settings, caplog):
    import logging

    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    with caplog.at_level(logging.INFO):
        response = client.post(
            "/order/btcpay/webhook/", b"x" * 5000, content_type="application/json"
        )
    assert response.status_code == 413
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not [r for r in caplog.records if r.exc_info]
    # ours says why; Django's request line ("Content Too Large: …") is the other
    ours = [r for r in caplog.records if r.name.startswith("portal")]
    assert len(ours) == 1 and ours[0].levelno == logging.WARNING
    assert "413" in ours[0].getMessage()


def test_production_with_a_per_process_cache_is_not_silent(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    env = {
        **os.environ,
        "DEBUG": "false",
        "SECRET_KEY": "x" * 50,
        "VAR_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
    }
    env.pop("CACHE_URL", None)
    repo = Path(__file__).resolve().parents[2]
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy"],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "django_ratelimit.E003" in result.stderr + result.stdout
    assert result.returncode != 0
