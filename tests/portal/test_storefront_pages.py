"""What earns a customer's trust before they send crypto: who the operator is, how
to reach them, their terms and refund policy, and prices that say their currency."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from portal import checks
from portal import order_services as svc

OPERATOR = {
    "OPERATOR_NAME": "Nordlicht Compute GmbH",
    "OPERATOR_EMAIL": "orders@nordlicht.example",
    "OPERATOR_ADDRESS": "Hafenstraße 12, 20457 Hamburg, Germany",
    "OPERATOR_REGISTRATION": "HRB 123456, VAT DE123456789",
}


@pytest.fixture
def operator(settings, tmp_path):
    for name, value in OPERATOR.items():
        setattr(settings, name, value)
    terms = tmp_path / "terms.txt"
    terms.write_text("# Our terms\nWe rent cards by the day.\n\nThat is all.\n", encoding="utf-8")
    refunds = tmp_path / "refunds.txt"
    refunds.write_text("# Refunds\nUnused days are refunded.\n", encoding="utf-8")
    settings.OPERATOR_TERMS_FILE = str(terms)
    settings.OPERATOR_REFUNDS_FILE = str(refunds)
    return settings


def test_the_terms_page_shows_the_operator_s_own_text(client, db, operator):
    html = client.get("/terms/").content.decode()
    assert "<h2>Our terms</h2>" in html
    assert "<p>We rent cards by the day.</p>" in html and "<p>That is all.</p>" in html
    assert "Nordlicht Compute GmbH, Hafenstraße 12, 20457 Hamburg, Germany" in html


def test_the_refund_page_shows_the_operator_s_own_policy(client, db, operator):
    html = client.get("/refunds/").content.decode()
    assert "<h2>Refunds</h2>" in html and "Unused days are refunded." in html


def test_the_contact_page_names_the_operator_and_how_to_reach_them(client, db, operator):
    html = client.get("/contact/").content.decode()
    for value in OPERATOR.values():
        assert value in html
    assert 'href="mailto:orders@nordlicht.example"' in html
    assert 'href="/order/recover/"' in html


def test_a_policy_file_is_text_never_markup(client, db, operator, tmp_path):
    evil = tmp_path / "evil.txt"
    evil.write_text("<script>alert(1)</script>", encoding="utf-8")
    operator.OPERATOR_TERMS_FILE = str(evil)
    html = client.get("/terms/").content.decode()
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html


def test_an_unreadable_policy_says_whom_to_write_to(client, db, operator, tmp_path):
    operator.OPERATOR_REFUNDS_FILE = str(tmp_path / "missing.txt")
    response = client.get("/refunds/")
    assert response.status_code == 200
    html = response.content.decode()
    assert 'id="policy-missing"' in html and "orders@nordlicht.example" in html


@pytest.mark.parametrize(
    "path", ["/order/", "/order/recover/", "/accounts/login/", "/terms/", "/contact/"]
)
def test_every_page_s_footer_names_the_operator_and_links_the_policies(
    client, catalog, operator, path
):
    html = client.get(path).content.decode()
    footer = html[html.index('<footer class="site"') :]
    for href in ("/terms/", "/refunds/", "/contact/", "/order/recover/"):
        assert f'href="{href}"' in footer, (path, href)
    assert "Nordlicht Compute GmbH" in footer and "orders@nordlicht.example" in footer


def test_the_tracking_page_and_the_dashboard_have_the_footer_too(client, owner, make_order):
    order = make_order()
    tracking = client.get(f"/order/t/{order.tracking_token}/").content.decode()
    client.force_login(owner)
    dashboard = client.get("/campaigns/").content.decode()
    for html in (tracking, dashboard):
        assert 'href="/terms/"' in html and 'href="/contact/"' in html


def test_the_pages_need_no_inline_style_or_script(client, make_order):
    order = make_order()
    for path in ("/order/", f"/order/t/{order.tracking_token}/", "/terms/", "/contact/"):
        html = client.get(path).content.decode()
        assert " style=" not in html, path
        assert not re.search(r"<script(?![^>]*\bsrc=)", html), path
        assert "/static/portal/site.css" in html and "/static/portal/site.js" in html


# --- prices -----------------------------------------------------------------------


def test_every_card_s_price_on_the_form_carries_the_currency(client, catalog, settings):
    settings.FIAT_CURRENCY = "CHF"
    html = client.get("/order/").content.decode()
    options = re.findall(r"<option value=\"\d+\"[^>]*>([^<]*GB[^<]*)</option>", html)
    assert options and all(re.search(r"\d+\.\d\d CHF per day", o) for o in options), options


def test_the_tracking_page_writes_amounts_with_their_unit_and_no_exponent(client, make_order):
    order = make_order()  # the rate is 60000 EUR per BTC (tests/conftest.py)
    html = client.get(f"/order/t/{order.tracking_token}/").content.decode()
    assert "1 BTC = 60000 EUR" in html  # never 6E+4
    assert re.search(r'id="total">\d+\.\d\d EUR<', html)
    assert re.search(r'id="amount">[\d.]+ BTC<', html)


def test_the_underpaid_e_mail_says_what_is_missing_and_whom_to_write_to(
    make_order, operator, django_capture_on_commit_callbacks, mailoutbox
):
    order = make_order()
    paid = (order.crypto_amount / 2).quantize(Decimal("0.00000001"))
    with django_capture_on_commit_callbacks(execute=True):
        svc.order_mark_underpaid(order=order, actor="staff:t", note="half", paid_amount=paid)
    body = mailoutbox[-1].body
    assert f"Missing: {(order.crypto_amount - paid).normalize():f} BTC" in body
    assert "orders@nordlicht.example" in body
    assert "contact us" not in body


# --- the check --------------------------------------------------------------------


def test_production_with_the_placeholder_operator_is_warned(settings):
    settings.DEBUG = False
    warned = checks.check_operator(None)
    assert [w.id for w in warned] == ["portal.W008"]
    assert "OPERATOR_NAME" in warned[0].msg and "OPERATOR_TERMS_FILE" in warned[0].msg


def test_the_operator_s_own_values_are_not_warned(operator):
    operator.DEBUG = False
    assert checks.check_operator(None) == []


def test_development_keeps_the_placeholders_quietly(settings):
    settings.DEBUG = True
    assert checks.check_operator(None) == []


def test_a_policy_file_that_cannot_be_read_is_an_error(operator, tmp_path):
    operator.OPERATOR_TERMS_FILE = str(tmp_path / "nope.txt")
    found = checks.check_operator(None)
    assert [e.id for e in found] == ["portal.E008"] and "OPERATOR_TERMS_FILE" in found[0].msg
