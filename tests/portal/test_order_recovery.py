"""A lost tracking link, mailed again to the address that ordered: the page says
the same whether or not that address ordered anything, and does the same work
(the e-mail is a task's, sent after the answer)."""

from __future__ import annotations

import logging
import re
from unittest import mock

from kombu.exceptions import OperationalError

from campaigns.runs import start

URL = "/order/recover/"


def _answer(response) -> str:
    # The page less its CSRF tokens (the form's and htmx's header), new on every response.
    html = response.content.decode()
    html = re.sub(r'name="csrfmiddlewaretoken" value="[^"]+"', "", html)
    return re.sub(r'"X-CSRFToken": "[^"]+"', "", html)


def test_the_links_go_to_the_address_and_the_page_says_the_same_either_way(
    client, make_order, mailoutbox, sent_tasks
):
    mine = [make_order(email="ada@example.org") for _ in range(2)]
    theirs = make_order(email="grace@example.org")
    mailoutbox.clear()

    known = client.post(URL, {"email": "Ada@Example.org"})
    unknown = client.post(URL, {"email": "nobody@example.org"})

    assert known.status_code == unknown.status_code == 200
    assert _answer(known) == _answer(unknown)
    assert "If orders were placed with that address" in known.content.decode()
    # The requests did the same work: no e-mail yet, one message each.
    assert mailoutbox == []
    assert sent_tasks == [
        ("portal.tasks.send_tracking_links", ["ada@example.org"]),
        ("portal.tasks.send_tracking_links", ["nobody@example.org"]),
    ]
    sent_tasks.run()
    (mail,) = mailoutbox
    assert mail.to == ["ada@example.org"]
    for order in mine:
        assert order.tracking_token in mail.body and order.reference in mail.body
    assert theirs.tracking_token not in mail.body
    # nothing of the orders on the page itself
    assert mine[0].tracking_token not in known.content.decode()


def test_one_address_gets_a_few_e_mails_a_day_whoever_asks(
    client, make_order, mailoutbox, settings, sent_tasks
):
    settings.ORDER_RECOVER_EMAIL_RATE = "2/d"
    make_order(email="ada@example.org")
    mailoutbox.clear()
    answers = {
        _answer(client.post(URL, {"email": "ada@example.org"}, REMOTE_ADDR=f"192.0.2.{i}"))
        for i in range(5)
    }
    assert len(answers) == 1  # the same page, limited or not
    sent_tasks.run()
    assert len(mailoutbox) == 2


def test_one_client_is_rate_limited(client, db, settings):
    settings.ORDER_RECOVER_RATE = "3/m"
    for i in range(3):
        assert client.post(URL, {"email": f"a{i}@example.org"}).status_code == 200
    blocked = client.post(URL, {"email": "a9@example.org"})
    assert blocked.status_code == 429
    assert "Too many requests" in blocked.content.decode()


def test_a_malformed_address_is_explained(client, db, mailoutbox, sent_tasks):
    response = client.post(URL, {"email": "not an address"})
    assert 'id="error-email"' in response.content.decode()
    assert "If orders were placed" not in response.content.decode()
    assert sent_tasks == [] and mailoutbox == []


def test_a_broker_that_does_not_answer_changes_nothing_on_the_page(
    client, make_order, mailoutbox, caplog
):
    make_order(email="ada@example.org")
    mailoutbox.clear()
    down = OperationalError("[Errno 111] Connection refused")
    with mock.patch.object(start.celery_app, "send_task", side_effect=down):
        known = client.post(URL, {"email": "ada@example.org"})
        unknown = client.post(URL, {"email": "nobody@example.org"})
    assert known.status_code == unknown.status_code == 200
    assert _answer(known) == _answer(unknown)
    assert mailoutbox == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("portal.tasks.send_tracking_links not sent" in w for w in warnings)
    assert not any("example.org" in w for w in warnings)
