"""Payment addresses that never run out: derived from the merchant's watch-only key,
the pool as a fallback that warns staff before it is empty."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.db import connections
from django.utils import timezone
from embit import bip39
from embit.bip32 import HDKey
from embit.networks import NETWORKS

from portal import order_services as svc
from portal import payment_addresses
from portal.checks import watch_key_problems
from portal.models import CryptoCurrency, Environment, GpuModel, Order, PaymentAddress
from portal.order_states import Status
from portal.pricing import QuoteRefused

STAFF = "staff:tester"

# BIP-84's test vector (bitcoin/bips, bip-0084.mediawiki): the account key
# m/84'/0'/0' of "abandon × 11 about" and its receive addresses m/84'/0'/0'/0/0 and /1.
BIP84_ZPUB = (
    "zpub6rFR7y4Q2AijBEqTUquhVz398htDFrtymD9xYYfG1m4wAcvPhXNf"
    "E3EfH1r1ADqtfSdVCToUG868RvUUkgDKf31mGDtKsAYz2oz2AGutZYs"
)
BIP84_RECEIVE = [
    "bc1qcr8te4kr609gcawutmrza0j4xv80jy8z306fyu",
    "bc1qnjg0jd8228aq7egyzacy8cys3knf9xvrerkf9g",
]
# Its private counterpart (the same text's account xpriv): never accepted.
BIP84_ZPRV = (
    "zprvAdG4iTXWBoARxkkzNpNh8r6Qag3irQB8PzEMkAFeTRXxHpbF9z4Q"
    "gEvBRmfvqWvGp42t42nvgGpNgYSJA9iefm1yYNZKEm7z6qUWCroSQnE"
)
# BIP-49's test vector (bip-0049.mediawiki, testnet): account m/49'/1'/0' and its
# first receive address.
BIP49_UPUB = (
    "upub5EFU65HtV5TeiSHmZZm7FUffBGy8UKeqp7vw43jYbvZPpoVsgU93"
    "oac7Wk3u6moKegAEWtGNF8DehrnHtv21XXEMYRUocHqguyjknFHYfgY"
)
BIP49_RECEIVE_0 = "2Mww8dCYPUpKHofjgcXcBCEGmniw9CoaiD2"
# BIP-44 has no vector of its own: the account m/44'/0'/0' of the same mnemonic
# (checked below from the mnemonic) and its receive addresses as other wallets' tests give them.
BIP44_XPUB = (
    "xpub6BosfCnifzxcFwrSzQiqu2DBVTshkCXacvNsWGYJVVhhawA7d4R5"
    "WSWGFNbi8Aw6ZRc1brxMyWMzG3DSSSSoekkudhUd9yLb6qx39T9nMdj"
)
BIP44_RECEIVE = ["1LqBGSKuX5yYUonjxT5qGfpUsXKYYWeabA", "1Ak8PffB2meyfYnbXZR9EGfLfFZVpzJvQP"]


@pytest.fixture
def xpub(settings):
    settings.BTC_XPUB = BIP84_ZPUB
    settings.BTC_XPUB_SCRIPT = ""
    settings.BTC_XPUB_FIRST_INDEX = 0
    return settings


# --- derivation against the published vectors -----------------------------------


def test_the_account_keys_are_those_of_the_bip_mnemonic():
    """The keys above are the BIPs' mnemonic's accounts, derived here with its private key."""
    seed = bip39.mnemonic_to_seed("abandon " * 11 + "about")
    main = HDKey.from_seed(seed)
    test = HDKey.from_seed(seed, version=NETWORKS["test"]["xprv"])
    assert main.derive("m/84h/0h/0h").to_string(NETWORKS["main"]["zprv"]) == BIP84_ZPRV
    assert main.derive("m/84h/0h/0h").to_public().to_string(NETWORKS["main"]["zpub"]) == BIP84_ZPUB
    assert main.derive("m/44h/0h/0h").to_public().to_string() == BIP44_XPUB
    assert test.derive("m/49h/1h/0h").to_public().to_string(NETWORKS["test"]["ypub"]) == BIP49_UPUB


def test_bip84_zpub_derives_the_published_receive_addresses():
    key = payment_addresses.parse_watch_key(BIP84_ZPUB)
    assert key.script == "p2wpkh" and key.network == "main" and key.depth == 3
    assert [key.address(i) for i in (0, 1)] == BIP84_RECEIVE


def test_bip49_upub_derives_the_published_testnet_address():
    key = payment_addresses.parse_watch_key(BIP49_UPUB)
    assert (key.script, key.network) == ("p2sh-p2wpkh", "test")
    assert key.address(0) == BIP49_RECEIVE_0


def test_bip44_xpub_derives_legacy_addresses():
    key = payment_addresses.parse_watch_key(BIP44_XPUB)
    assert key.script == "p2pkh"
    assert [key.address(i) for i in (0, 1)] == BIP44_RECEIVE


def test_a_private_key_is_refused_without_repeating_it():
    with pytest.raises(payment_addresses.KeyRefused, match="PRIVATE key") as refused:
        payment_addresses.parse_watch_key(BIP84_ZPRV)
    assert BIP84_ZPRV not in str(refused.value)
    problems = watch_key_problems(key=BIP84_ZPRV, script="")
    assert [p.id for p in problems] == ["portal.E007"]
    assert BIP84_ZPRV[:20] not in problems[0].msg


def test_a_mistyped_key_is_a_readable_check_error():
    typo = BIP84_ZPUB[:-1] + ("a" if BIP84_ZPUB[-1] != "a" else "b")
    problems = watch_key_problems(key=typo, script="")
    assert [p.id for p in problems] == ["portal.E007"]
    assert "checksum" in problems[0].msg
    assert watch_key_problems(key=BIP84_ZPUB, script="p2tr")[0].id == "portal.E007"
    assert watch_key_problems(key=BIP84_ZPUB, script="") == []
    assert watch_key_problems(key="", script="") == []


# --- quotes with a key: addresses never run out ---------------------------------


def test_quotes_in_a_row_never_run_out_of_addresses(xpub, make_order):
    """25 BTC quotes, each expiring unpaid: every one gets its own fresh address."""
    orders = []
    for _ in range(25):
        order = make_order()
        orders.append(order)
        # The quote lapses unpaid and gives its card back; its address stays its own.
        Order.objects.filter(pk=order.pk).update(
            quote_expires_at=timezone.now() - timedelta(minutes=1)
        )
        svc.orders_expire_unpaid()
    addresses = [o.payment_address.address for o in orders]
    assert len(set(addresses)) == 25
    assert addresses[:2] == BIP84_RECEIVE
    assert [o.payment_address.derivation_index for o in orders] == list(range(25))
    # The pool (5 BTC addresses in the fixture) is left for when no key is set.
    assert PaymentAddress.objects.filter(currency__code="BTC", order__isnull=True).count() == 5
    assert orders[0].payment_uri().startswith(f"bitcoin:{BIP84_RECEIVE[0]}?amount=")


def test_first_index_skips_addresses_the_wallet_used_elsewhere(xpub, make_order):
    xpub.BTC_XPUB_FIRST_INDEX = 1
    order = make_order()
    assert order.payment_address.address == BIP84_RECEIVE[1]


def test_a_derived_address_already_in_the_pool_is_skipped(xpub, make_order):
    btc = CryptoCurrency.objects.get(code="BTC")
    PaymentAddress.objects.create(currency=btc, address=BIP84_RECEIVE[0])
    order = make_order()
    assert order.payment_address.address == BIP84_RECEIVE[1]
    assert order.payment_address.derivation_index == 1


def test_other_currencies_still_use_the_pool(xpub, make_order):
    order = make_order(currency="LTC")
    assert order.payment_address.address.startswith("LTC-addr-")
    assert order.payment_address.chain is None


def test_a_refused_quote_gives_its_index_back(xpub, make_order):
    a100 = GpuModel.objects.get(name="A100 SXM")  # 2 in stock
    with pytest.raises(QuoteRefused):
        make_order(gpu=a100.name, quantity=3)
    assert make_order().payment_address.address == BIP84_RECEIVE[0]


def test_an_unusable_key_refuses_btc_quotes_readably(xpub, make_order, client, staff):
    xpub.BTC_XPUB = BIP84_ZPRV
    with pytest.raises(QuoteRefused, match="BTC payments cannot be quoted right now"):
        make_order()
    assert not Order.objects.exists()
    client.force_login(staff)
    html = client.get("/order/staff/").content.decode()
    assert "BTC_XPUB holds a PRIVATE key" in html
    assert BIP84_ZPRV[:20] not in html


@pytest.mark.django_db(transaction=True)
def test_concurrent_quotes_never_share_an_index(xpub, catalog, fresh_rates):
    """Quotes from several threads at once (their own database connections), each
    for another card, get distinct, consecutive indexes: the key's counter is read
    and advanced under its own lock (quotes are serialised by the cards' row locks
    too, so this holds twice over)."""
    cards = ["L4", "RTX 4090", "A40", "RTX A6000"]  # 3 or more in stock each
    start = threading.Barrier(len(cards))
    made: list[int] = []
    errors: list[BaseException] = []

    def quote(card: str) -> None:
        try:
            plan = svc.Plan(
                gpu=GpuModel.objects.get(name=card),
                quantity=1,
                days=7,
                environment=Environment.objects.first(),
                currency=CryptoCurrency.objects.get(code="BTC"),
            )
            start.wait(timeout=10)
            for i in range(3):
                # One address per order: the open-order cap per e-mail is not under test.
                email = f"ada-{card.replace(' ', '-')}-{i}@example.org"
                order = svc.order_create(
                    plan=plan, first_name="Ada", last_name="Lovelace", email=email
                )
                made.append(order.pk)
        except BaseException as exc:  # noqa: BLE001 — reported by the assertion below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=quote, args=(card,)) for card in cards]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    indexes = sorted(
        PaymentAddress.objects.filter(order__in=made).values_list("derivation_index", flat=True)
    )
    assert indexes == list(range(12))


# --- the pool's low-water warning -----------------------------------------------


def test_pool_low_water_warns_staff_once_by_mail_and_in_the_log(
    make_order, settings, caplog, django_capture_on_commit_callbacks, mailoutbox
):
    settings.PAYMENT_ADDRESS_LOW_WATER = 3
    settings.STAFF_ALERT_EMAILS = ["ops@example.org"]

    def quote() -> None:
        with django_capture_on_commit_callbacks(execute=True):
            make_order(currency="LTC")

    def staff_mails() -> list[str]:
        return [m.subject for m in mailoutbox if m.to == ["ops@example.org"]]

    with caplog.at_level("WARNING", logger="portal.payment_addresses"):
        quote()
        quote()  # 5 → 3 free: at the mark, no warning yet
        assert not caplog.records and not staff_mails()
        quote()  # 2 free: below the mark
        quote()  # 1 free: logged again, no second mail
    assert [r.getMessage() for r in caplog.records] == [
        "payment address pool for LTC: 2 free, below the low-water mark 3",
        "payment address pool for LTC: 1 free, below the low-water mark 3",
    ]
    assert staff_mails() == ["BriefGPU: LTC payment address pool has 2 free address(es) left"]
    quote()  # the last one
    assert staff_mails()[-1] == "BriefGPU: LTC payment address pool is empty"
    assert len(staff_mails()) == 2


def test_staff_queue_shows_the_pool_and_its_low_water_warning(client, staff, make_order, settings):
    settings.PAYMENT_ADDRESS_LOW_WATER = 3
    for _ in range(3):
        make_order(currency="LTC")
    client.force_login(staff)
    html = client.get("/order/staff/").content.decode()
    assert "Address pool: 2 free of 5" in html
    assert "Only 2 free LTC addresses left" in html
    assert "Address pool: 5 free of 5" in html  # BTC, still full


def test_staff_queue_shows_the_key_index_and_unpaid_runs(client, staff, xpub, make_order):
    xpub.WALLET_GAP_LIMIT = 3
    orders = [make_order() for _ in range(5)]
    svc.order_confirm_payment(order=orders[1], actor=STAFF, note="arrived")
    client.force_login(staff)
    html = client.get("/order/staff/").content.decode()
    key = payment_addresses.parse_watch_key(BIP84_ZPUB)
    assert f"Derived from extended public key {key.fingerprint} (p2wpkh, mainnet)" in html
    assert f"next receive index 5 ({key.address(5)}); 5 given to quotes, 1 paid" in html
    assert "3 unpaid since the last paid one, at most 1 unpaid in a row" in html
    assert "3 unpaid addresses in a row: a wallet whose gap limit is 3 or less" in html


def test_unpaid_runs_count_gaps_between_paid_addresses(xpub, make_order):
    GpuModel.objects.filter(name="A40").update(stock=20)
    orders = [make_order() for _ in range(8)]
    for i in (2, 6):
        svc.order_confirm_payment(order=orders[i], actor=STAFF, note="arrived")
    svc.order_expire(order=orders[7])
    chain = orders[0].payment_address.chain
    runs = payment_addresses.unpaid_runs(chain)
    assert (runs.given, runs.paid, runs.tip, runs.largest) == (8, 2, 1, 3)
    assert Order.objects.get(pk=orders[6].pk).status == Status.CONFIRMED


def test_btcpay_mode_says_btcpay_gives_the_addresses(client, staff, settings, catalog):
    settings.BTCPAY_URL = "https://btcpay.example.org"
    settings.BTCPAY_STORE_ID = "store"
    settings.BTCPAY_API_KEY = "key"
    client.force_login(staff)
    html = client.get("/order/staff/").content.decode()
    assert "BTCPay Server gives each invoice its address." in html
    assert "Address pool" not in html
