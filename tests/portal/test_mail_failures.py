"""A mail server that refuses a customer's address: the order goes on, and the
log names the order and the failure, never the address."""

from __future__ import annotations

import logging
import smtplib

from django.core.mail.backends.base import BaseEmailBackend

from portal.models import Order, OrderEvent
from portal.order_states import Status
from tests.portal.test_order_views import _post_data

REFUSED = "ada@example.org"


class RefusingBackend(BaseEmailBackend):
    """What Django's SMTP backend raises when the server answers 550 to RCPT TO."""

    def send_messages(self, email_messages):
        raise smtplib.SMTPRecipientsRefused({REFUSED: (550, b"5.1.1 <ada@example.org>: no")})


def test_a_refused_order_e_mail_logs_no_address_and_the_order_goes_on(
    client, fresh_rates, address_pool, settings, caplog, django_capture_on_commit_callbacks
):
    settings.EMAIL_BACKEND = f"{__name__}.RefusingBackend"
    caplog.set_level(logging.INFO)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post("/order/", _post_data(email=REFUSED))

    # the order is made and its page shows, as with a mail that went out
    assert response.status_code == 302
    order = Order.objects.get(email=REFUSED)
    assert client.get(response["Location"]).status_code == 200
    # the log says which order's mail failed and how, and never to whom
    assert f"order {order.reference}: created e-mail not sent (SMTPRecipientsRefused)" in (
        caplog.text
    )
    assert "ada@example.org" not in caplog.text
    assert all(record.exc_info is None for record in caplog.records)


def test_a_refused_status_e_mail_does_not_undo_the_move(
    make_order, settings, caplog, django_capture_on_commit_callbacks
):
    from portal.order_services import order_reject

    order = make_order(email=REFUSED)
    settings.EMAIL_BACKEND = f"{__name__}.RefusingBackend"
    with django_capture_on_commit_callbacks(execute=True):
        order_reject(order=order, actor="staff:someone", note="no payment arrived")

    order.refresh_from_db()
    assert order.status == Status.REJECTED
    assert OrderEvent.objects.filter(order=order, to_status=Status.REJECTED).exists()
    assert "rejected e-mail not sent (SMTPRecipientsRefused)" in caplog.text
    assert "ada@example.org" not in caplog.text


def test_a_refused_recovery_e_mail_logs_no_address(
    client, make_order, settings, caplog, sent_tasks
):
    make_order(email=REFUSED)
    settings.EMAIL_BACKEND = f"{__name__}.RefusingBackend"

    response = client.post("/order/recover/", {"email": REFUSED})
    sent_tasks.run()  # the portal worker sends it, after the page answered

    assert response.status_code == 200
    assert "If orders were placed with that address" in response.content.decode()
    assert "tracking links e-mail not sent (1 order(s), SMTPRecipientsRefused)" in caplog.text
    assert "ada@example.org" not in caplog.text


def test_a_refused_staff_alert_logs_no_address(db, settings, caplog):
    from portal.payment_addresses import alert_staff_pool_low

    settings.STAFF_ALERT_EMAILS = [REFUSED]
    settings.EMAIL_BACKEND = f"{__name__}.RefusingBackend"

    assert alert_staff_pool_low(code="BTC", free=0) is False
    assert "staff alert about the BTC address pool not sent (SMTPRecipientsRefused)" in (
        caplog.text
    )
    assert "ada@example.org" not in caplog.text


def test_a_failed_login_logs_its_path_never_the_username(client, db, caplog):
    # A username is often an e-mail address, and a password typed into the
    # username field is a password: neither reaches the log (django-axes masks
    # its AXES_SENSITIVE_PARAMETERS; a guard, should the settings change).
    caplog.set_level(logging.INFO)
    for _ in range(6):
        client.post("/accounts/login/", {"username": REFUSED, "password": "hunter2"})

    assert "Locking out" in caplog.text  # the lock is still logged, with its path
    assert "/accounts/login/" in caplog.text
    assert "ada@example.org" not in caplog.text
    assert "hunter2" not in caplog.text
