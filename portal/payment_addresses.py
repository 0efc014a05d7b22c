"""Where a quote's payment address comes from, and what staff see of it.

Without BTCPay a BTC quote gets the next receive address derived from the
merchant's watch-only extended public key (BTC_XPUB) when one is set, so
addresses never run out; otherwise, and for other currencies, a free address
of the pool staff load in the admin, with a warning as the pool runs low.
With BTCPay configured the invoice brings its own address (order_services).

An address is given to one order only, ever, derived or pooled: a payment
that arrives after its quote expired is then still the expired order's, never
a newer customer's (docs/ordering.md, "Payment addresses").
"""

from __future__ import annotations

import functools
import hashlib
import logging
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.db.models import F, Max, Min, Q, QuerySet, Window
from django.db.models.functions import Lag
from django.urls import reverse
from embit import script as btc_script
from embit.base import EmbitError
from embit.bip32 import HDKey
from embit.networks import NETWORKS

from portal.emails import failure_class
from portal.models import CryptoCurrency, DerivationChain, Order, PaymentAddress
from portal.order_states import Status
from portal.pricing import QuoteRefused

log = logging.getLogger(__name__)

SCRIPTS = ("p2wpkh", "p2sh-p2wpkh", "p2pkh")
# SLIP-132: the prefix of a single-signature account key names its script type.
_VERSIONS: dict[bytes, tuple[str, str]] = {}
for _network in ("main", "test"):
    for _prefix, _script in (("xpub", "p2pkh"), ("ypub", "p2sh-p2wpkh"), ("zpub", "p2wpkh")):
        _VERSIONS[NETWORKS[_network][_prefix]] = (_network, _script)
_MULTISIG = {NETWORKS[n][p] for n in ("main", "test") for p in ("Ypub", "Zpub")}
# BIP-32: indexes from 2**31 are hardened, which a public key cannot derive.
_LAST_INDEX = 2**31 - 1
# Derived addresses that are already in the address list (a pool loaded from
# the same wallet) are skipped; this many in a row means something else is wrong.
_MAX_SKIPS = 100
# States in which money reached the address: what a wallet sees as "used".
PAID_STATES = frozenset(
    {
        Status.PAYMENT_SEEN,
        Status.CONFIRMED,
        Status.PROVISIONING,
        Status.ACTIVE,
        Status.COMPLETED,
        Status.AWAITING_CAPACITY,
        Status.REFUNDED,
        Status.UNDERPAID,
    }
)


class KeyRefused(ValueError):
    """BTC_XPUB or BTC_XPUB_SCRIPT cannot be used; the text never repeats the key."""


@dataclass(frozen=True)
class WatchKey:
    """A watch-only account key and the receive addresses derived from it."""

    hdkey: HDKey
    network: str  # "main" or "test" (embit's NETWORKS)
    script: str  # one of SCRIPTS
    key_id: str
    fingerprint: str
    depth: int

    def address(self, index: int) -> str:
        """The receive address <key>/0/<index>, as BIP-44/49/84 wallets number them."""
        if not 0 <= index <= _LAST_INDEX:
            raise ValueError(f"receive index {index} is outside 0..{_LAST_INDEX}")
        public = self.hdkey.derive([0, index]).key
        if self.script == "p2wpkh":
            out = btc_script.p2wpkh(public)
        elif self.script == "p2sh-p2wpkh":
            out = btc_script.p2sh(btc_script.p2wpkh(public))
        else:
            out = btc_script.p2pkh(public)
        return str(out.address(NETWORKS[self.network]))


@functools.lru_cache(maxsize=8)
def parse_watch_key(text: str, script: str = "") -> WatchKey:
    """The account key in `text` (xpub/ypub/zpub or tpub/upub/vpub), or KeyRefused."""
    text = text.strip()
    try:
        key = HDKey.from_string(text)
    except (EmbitError, ValueError, IndexError, TypeError) as exc:
        raise KeyRefused(
            "is not an extended public key (xpub, ypub or zpub; tpub, upub or vpub on "
            "testnet): its checksum or length is wrong"
        ) from exc
    if key.is_private:
        raise KeyRefused(
            "holds a PRIVATE key: the portal needs only the watch-only public key "
            "(xpub/ypub/zpub). Remove it from the environment and treat that wallet as exposed"
        )
    if key.version in _MULTISIG:
        raise KeyRefused(
            "is a multisig key (Ypub/Zpub); only single-signature accounts are supported"
        )
    if key.version not in _VERSIONS:
        raise KeyRefused("has an unknown version prefix (not xpub, ypub, zpub, tpub, upub or vpub)")
    network, prefix_script = _VERSIONS[key.version]
    if script and script not in SCRIPTS:
        raise KeyRefused(f"script {script!r} is not one of {', '.join(SCRIPTS)}")
    chosen = script or prefix_script
    identity = f"{network}|{chosen}|".encode() + key.chain_code + key.sec()
    return WatchKey(
        hdkey=key,
        network=network,
        script=chosen,
        key_id=hashlib.sha256(identity).hexdigest(),
        fingerprint=key.my_fingerprint.hex(),
        depth=key.depth,
    )


def configured_key(currency_code: str) -> WatchKey | None:
    """The currency's configured key; None when it has none (the pool serves it).

    Only BTC: the key prefixes and address formats are Bitcoin's.
    """
    if currency_code != "BTC" or not settings.BTC_XPUB:
        return None
    return parse_watch_key(settings.BTC_XPUB, settings.BTC_XPUB_SCRIPT)


def assign(*, order: Order, now: datetime) -> None:
    """Give the new order its payment address, or raise QuoteRefused.

    Runs inside the order's creation transaction: a refusal creates nothing.
    """
    try:
        key = configured_key(order.currency.code)
    except KeyRefused as exc:
        log.error("BTC_XPUB %s; BTC quotes are refused", exc)
        raise QuoteRefused(
            f"{order.currency.code} payments cannot be quoted right now. Nothing was ordered; "
            "choose another currency or try again later."
        ) from exc
    if key is None:
        _assign_from_pool(order=order, now=now)
    else:
        _assign_derived(order=order, key=key, now=now)


def _assign_derived(*, order: Order, key: WatchKey, now: datetime) -> None:
    chain, _ = DerivationChain.objects.get_or_create(
        key_id=key.key_id,
        defaults={"currency": order.currency, "fingerprint": key.fingerprint, "script": key.script},
    )
    for _ in range(_MAX_SKIPS):
        # Read and advance under the row's lock (PostgreSQL, MySQL) or the write
        # lock SQLite's IMMEDIATE transaction took at BEGIN: two concurrent
        # quotes never read the same index, and a rolled-back quote gives its
        # index back with the rest of its transaction.
        locked = DerivationChain.objects.select_for_update().get(pk=chain.pk)
        index = max(locked.next_index, settings.BTC_XPUB_FIRST_INDEX)
        if index > _LAST_INDEX:
            log.error("key %s has no receive index left", key.fingerprint)
            raise QuoteRefused(_NO_ADDRESS.format(code=order.currency.code))
        DerivationChain.objects.filter(pk=chain.pk).update(next_index=index + 1)
        address = key.address(index)
        try:
            with transaction.atomic():
                PaymentAddress.objects.create(
                    currency=order.currency,
                    address=address,
                    order=order,
                    assigned_at=now,
                    chain=locked,
                    derivation_index=index,
                )
            return
        except IntegrityError:
            # Already in the list: a pool address of the same wallet, never given twice.
            log.warning(
                "key %s: receive index %d is already a listed address; skipped",
                key.fingerprint,
                index,
            )
    raise QuoteRefused(_NO_ADDRESS.format(code=order.currency.code))


_NO_ADDRESS = (
    "No {code} payment address is free right now. Choose another currency or try again later."
)


def _assign_from_pool(*, order: Order, now: datetime) -> None:
    # Claim by update: the row is taken only if still free, so two concurrent
    # orders never get the same address (SQLite and PostgreSQL alike).
    for _ in range(5):
        candidate = _free_pool(order.currency).order_by("pk").values_list("pk", flat=True).first()
        if candidate is None:
            log.error("payment address pool for %s is empty", order.currency.code)
            raise QuoteRefused(_NO_ADDRESS.format(code=order.currency.code))
        if PaymentAddress.objects.filter(pk=candidate, order__isnull=True).update(
            order=order, assigned_at=now
        ):
            _warn_if_low(order.currency)
            return
    raise QuoteRefused("Payment addresses are busy; please submit again.")


def _free_pool(currency: CryptoCurrency) -> QuerySet[PaymentAddress]:
    return PaymentAddress.objects.filter(currency=currency, order__isnull=True)


def _warn_if_low(currency: CryptoCurrency) -> None:
    low = settings.PAYMENT_ADDRESS_LOW_WATER
    free = _free_pool(currency).count()
    if free >= low:
        return
    log.warning(
        "payment address pool for %s: %d free, below the low-water mark %d",
        currency.code,
        free,
        low,
    )
    # One e-mail as the pool crosses the mark and one as it empties, not one per quote.
    if free in (low - 1, 0):
        code = currency.code
        transaction.on_commit(lambda: alert_staff_pool_low(code=code, free=free))


def alert_staff_pool_low(*, code: str, free: int) -> bool:
    """E-mail STAFF_ALERT_EMAILS that the pool runs low; False when none is set or it failed."""
    if not settings.STAFF_ALERT_EMAILS:
        return False
    state = "is empty" if free == 0 else f"has {free} free address(es) left"
    body = (
        f"The {code} payment address pool {state} (low-water mark "
        f"{settings.PAYMENT_ADDRESS_LOW_WATER}). When none is left, every {code} quote is "
        "refused.\n\n"
        "Add addresses in the admin (Payment addresses)"
        + (", or set BTC_XPUB so each quote gets a derived address" if code == "BTC" else "")
        + " (docs/ordering.md, 'Payment addresses').\n\n"
        f"Staff queue: {settings.SITE_URL.rstrip('/')}{reverse('staff_queue')}\n"
    )
    try:
        send_mail(
            f"BriefGPU: {code} payment address pool {state}",
            body,
            None,
            settings.STAFF_ALERT_EMAILS,
        )
    except Exception as exc:  # noqa: BLE001 — an alert failure never undoes a quote
        # The class only: a refusal's text names the staff's addresses.
        log.warning("staff alert about the %s address pool not sent (%s)", code, failure_class(exc))
        return False
    return True


# --- what staff see ---------------------------------------------------------


@dataclass(frozen=True)
class SourceStatus:
    currency: str
    text: str
    warning: str = ""


def sources() -> list[SourceStatus]:
    """One line per active currency: where its next address comes from, how many are left."""
    if settings.BTCPAY_URL or settings.BTCPAY_STORE_ID or settings.BTCPAY_API_KEY:
        return [SourceStatus(currency="all", text="BTCPay Server gives each invoice its address.")]
    return [_source(currency) for currency in CryptoCurrency.objects.filter(active=True)]


def _source(currency: CryptoCurrency) -> SourceStatus:
    try:
        key = configured_key(currency.code)
    except KeyRefused as exc:
        return SourceStatus(
            currency=currency.code,
            text="BTC_XPUB is set but unusable.",
            warning=f"BTC_XPUB {exc}. Every {currency.code} quote is refused.",
        )
    if key is not None:
        return _derived_source(currency, key)
    free = _free_pool(currency).count()
    total = PaymentAddress.objects.filter(currency=currency, chain__isnull=True).count()
    low = settings.PAYMENT_ADDRESS_LOW_WATER
    text = f"Address pool: {free} free of {total} (low-water mark {low})."
    warning = ""
    if free < low:
        warning = (
            f"{'No' if free == 0 else f'Only {free}'} free {currency.code} address"
            f"{'' if free == 1 else 'es'} left: when none is left every {currency.code} "
            "quote is refused. Add addresses in the admin"
            + (" or set BTC_XPUB" if currency.code == "BTC" else "")
            + "."
        )
    return SourceStatus(currency=currency.code, text=text, warning=warning)


def _derived_source(currency: CryptoCurrency, key: WatchKey) -> SourceStatus:
    chain = DerivationChain.objects.filter(key_id=key.key_id).first()
    next_index = max(chain.next_index if chain else 0, settings.BTC_XPUB_FIRST_INDEX)
    gaps = unpaid_runs(chain) if chain else UnpaidRuns(given=0, paid=0, tip=0, largest=0)
    text = (
        f"Derived from extended public key {key.fingerprint} ({key.script}, "
        f"{'mainnet' if key.network == 'main' else 'testnet'}): next receive index "
        f"{next_index} ({_next_address(key, next_index)}); {gaps.given} given to quotes, "
        f"{gaps.paid} paid; "
        f"{gaps.tip} unpaid since the last paid one, at most {gaps.largest} unpaid in a row "
        "between paid ones."
    )
    warning = ""
    limit = settings.WALLET_GAP_LIMIT
    run = max(gaps.tip, gaps.largest)
    if run >= limit:
        warning = (
            f"{run} unpaid addresses in a row: a wallet whose gap limit is {run} or less "
            "does not see a payment after them. Raise the wallet's gap limit "
            "(docs/ordering.md) and WALLET_GAP_LIMIT with it."
        )
    if key.depth != 3:
        warning = " ".join(filter(None, [warning, _depth_warning(key.depth)]))
    return SourceStatus(currency=currency.code, text=text, warning=warning)


def _next_address(key: WatchKey, index: int) -> str:
    # What staff compare with the wallet's receive address of the same index.
    return key.address(index) if index <= _LAST_INDEX else "none left"


def _depth_warning(depth: int) -> str:
    return (
        f"The key is at depth {depth}, not an account key (depth 3, such as m/84'/0'/0'): "
        "check that the wallet shows the same first receive address."
    )


@dataclass(frozen=True)
class UnpaidRuns:
    given: int  # addresses given to quotes
    paid: int  # of them, paid
    tip: int  # given after the last paid one (all, when none is paid)
    largest: int  # the longest run of unpaid indexes before a paid one


def unpaid_runs(chain: DerivationChain) -> UnpaidRuns:
    """Runs of unpaid addresses, in the database: a wallet stops looking for
    payments after as many unused addresses in a row as its gap limit."""
    given = chain.addresses.all()
    first_index = given.aggregate(first=Min("derivation_index"))["first"] or 0
    paid = given.filter(Q(order__status__in=PAID_STATES) | Q(order__paid_late=True))
    last_paid = paid.aggregate(last=Max("derivation_index"))["last"]
    tip = (
        given.filter(derivation_index__gt=last_paid).count()
        if last_paid is not None
        else (given.count())
    )
    # Unpaid indexes before each paid one: its index minus the previous paid
    # index (or the first given) minus one, the largest in one query.
    runs = paid.annotate(
        previous=Window(
            Lag("derivation_index", default=first_index - 1), order_by=F("derivation_index").asc()
        )
    ).annotate(run=F("derivation_index") - F("previous") - 1)
    largest = runs.aggregate(largest=Max("run"))["largest"] or 0
    return UnpaidRuns(given=given.count(), paid=paid.count(), tip=tip, largest=largest)
