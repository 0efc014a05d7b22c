"""The ordering portal: catalog, rates, payment addresses, orders and their history."""

from __future__ import annotations

import secrets
from decimal import Decimal

from django.conf import settings
from django.db import models

from portal.order_states import PaymentException, Status

# --- catalog (admin-editable, seeded by a data migration) --------------------


class GpuModel(models.Model):
    name = models.CharField(max_length=100, unique=True)
    architecture = models.CharField(max_length=50)
    memory_gb = models.PositiveIntegerField()
    price_per_day = models.DecimalField(max_digits=10, decimal_places=2)
    # Throughput relative to an A40 (1.0): what an estimate divides a measured
    # rate by when it compares cards.
    relative_throughput = models.DecimalField(max_digits=5, decimal_places=2)
    stock = models.PositiveIntegerField(help_text="cards that can be rented at once")
    active = models.BooleanField(default=True)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["position", "name"]
        verbose_name = "GPU model"

    def __str__(self) -> str:
        return f"{self.name} ({self.memory_gb} GB, {self.architecture})"


class Environment(models.Model):
    name = models.CharField(max_length=100, unique=True)
    framework = models.CharField(max_length=50)
    framework_version = models.CharField(max_length=30)
    cuda_version = models.CharField(max_length=20)
    image = models.CharField(max_length=200, help_text="container image the machines boot")
    active = models.BooleanField(default=True)
    position = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["position", "name"]

    def __str__(self) -> str:
        return f"{self.name} — {self.framework} {self.framework_version}, CUDA {self.cuda_version}"


class RentalDuration(models.Model):
    days = models.PositiveIntegerField(unique=True)
    purpose = models.CharField(max_length=300)
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["days"]

    def __str__(self) -> str:
        return f"{self.days} days"


class CryptoCurrency(models.Model):
    code = models.CharField(max_length=10, unique=True)
    name = models.CharField(max_length=50)
    decimals = models.PositiveSmallIntegerField(help_text="smallest unit, e.g. 8 for BTC")
    uri_scheme = models.CharField(max_length=30, help_text='"bitcoin" for bitcoin:<address>')
    amount_param = models.CharField(
        max_length=30, default="amount", help_text="amount's name in the payment URI"
    )
    active = models.BooleanField(default=True)

    class Meta:
        ordering = ["code"]
        verbose_name_plural = "crypto currencies"

    def __str__(self) -> str:
        return f"{self.code} ({self.name})"


class ExchangeRate(models.Model):
    """A rate staff entered; the newest per currency prices new quotes while fresh."""

    currency = models.ForeignKey(CryptoCurrency, on_delete=models.PROTECT, related_name="rates")
    fiat_per_unit = models.DecimalField(max_digits=20, decimal_places=8)
    recorded_at = models.DateTimeField()
    recorded_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True
    )

    class Meta:
        ordering = ["-recorded_at"]
        # Serves "newest rate of a currency" at every quote.
        indexes = [models.Index(fields=["currency", "-recorded_at"])]

    def __str__(self) -> str:
        return f"1 {self.currency.code} = {self.fiat_per_unit} {settings.FIAT_CURRENCY}"


class DerivationChain(models.Model):
    """The receive addresses of one watch-only extended public key, and the next
    index to derive: one row per key, so each index is given once (docs/ordering.md)."""

    currency = models.ForeignKey(CryptoCurrency, on_delete=models.PROTECT, related_name="+")
    # A hash of what fixes the addresses (network, script type, public key and
    # chain code), never the key itself: the same wallet account under another
    # prefix (xpub or zpub) continues the same chain.
    key_id = models.CharField(max_length=64, unique=True)
    # The key's own BIP-32 fingerprint and depth: what staff compare with their wallet.
    fingerprint = models.CharField(max_length=8)
    script = models.CharField(max_length=20)
    next_index = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"{self.currency.code} key {self.fingerprint}, next index {self.next_index}"


class PaymentAddress(models.Model):
    """One address of the pool, derived from a key, or a BTCPay invoice's; given
    to one order only, ever."""

    currency = models.ForeignKey(CryptoCurrency, on_delete=models.PROTECT, related_name="addresses")
    address = models.CharField(max_length=200, unique=True)
    order = models.OneToOneField(
        "Order", on_delete=models.PROTECT, null=True, blank=True, related_name="payment_address"
    )
    assigned_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # Set for an address derived from the merchant's extended public key.
    chain = models.ForeignKey(
        DerivationChain, on_delete=models.PROTECT, null=True, blank=True, related_name="addresses"
    )
    derivation_index = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "payment addresses"
        # Serves "a free address of this currency" at every quote.
        indexes = [models.Index(fields=["currency", "order"])]
        constraints = [
            # Also the index the staff page's "last paid index" reads.
            models.UniqueConstraint(
                fields=["chain", "derivation_index"], name="one_address_per_derivation_index"
            )
        ]

    def __str__(self) -> str:
        return f"{self.currency.code} {self.address}"


# --- orders -----------------------------------------------------------------


def new_tracking_token() -> str:
    return secrets.token_urlsafe(24)  # 192 bits


class Order(models.Model):
    status = models.CharField(
        max_length=20, choices=Status.choices, default=Status.AWAITING_PAYMENT
    )
    exception = models.CharField(
        max_length=20, choices=PaymentException.choices, default="", blank=True
    )
    # The only key a customer holds: unguessable, never shown to anyone else.
    tracking_token = models.CharField(max_length=64, unique=True, default=new_tracking_token)
    # The plan, with the prices it was quoted at (the catalog may change later).
    gpu = models.ForeignKey(GpuModel, on_delete=models.PROTECT)
    quantity = models.PositiveIntegerField()
    duration_days = models.PositiveIntegerField()
    environment = models.ForeignKey(Environment, on_delete=models.PROTECT)
    price_per_day = models.DecimalField(max_digits=10, decimal_places=2)
    fiat_total = models.DecimalField(max_digits=12, decimal_places=2)
    fiat_currency = models.CharField(max_length=3)
    # The locked quote.
    currency = models.ForeignKey(CryptoCurrency, on_delete=models.PROTECT)
    crypto_amount = models.DecimalField(max_digits=30, decimal_places=12)
    rate = models.DecimalField(max_digits=20, decimal_places=8)
    rate_recorded_at = models.DateTimeField()
    quote_expires_at = models.DateTimeField()
    # An unpaid order keeps its cards off sale until then only (the quote's
    # expiry, then a window after "I paid"; order_states.HOLDS_STOCK_UNTIL).
    held_until = models.DateTimeField(null=True, blank=True)
    # A keyed hash of the client's address (portal/client_ip.py), never the
    # address itself: what the cap on open unpaid orders per client counts.
    client_key = models.CharField(max_length=64, blank=True)
    # Contact: no account, no KYC.
    first_name = models.CharField(max_length=100)
    last_name = models.CharField(max_length=100)
    email = models.EmailField()
    campaign = models.ForeignKey(
        "campaigns.Campaign", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # The profile whose estimate the customer ordered from ("Order this plan"):
    # the dossier shows that one, not a profile run after the order.
    profile = models.ForeignKey(
        "campaigns.Profile", on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    # The rest of the rental's batch list: campaigns the customer also runs on
    # it, beside `campaign` (the one the order was sized on).
    campaigns = models.ManyToManyField("campaigns.Campaign", blank=True, related_name="+")
    # What the machines are set up with (portal/access.py): the customer's SSH
    # public keys, one authorized_keys line each, checked by portal/ssh_keys.py,
    # and the folders (relative to the home folder) results are exported to.
    ssh_public_keys = models.JSONField(default=list, blank=True)
    export_folders = models.JSONField(default=list, blank=True)
    # Staff's flag: a notice arrived after the quote expired (the customer's word).
    paid_late_claim = models.BooleanField(default=False)
    # The payment itself arrived after the quote expired (BTCPay's paidLate).
    # A flag beside `exception`, not a value of it: a late payment can also be
    # an overpayment or a partial one, and staff must see both facts.
    paid_late = models.BooleanField(default=False)
    # Set when the quote came from a BTCPay Server invoice (docs/btcpay.md):
    # the webhook finds the order by it, and the customer pays BTCPay's link.
    btcpay_invoice_id = models.CharField(max_length=100, blank=True)
    # What arrived, in the order's crypto currency, when staff or the processor
    # said so (an underpayment, an overpayment): the tracking page tells an
    # underpaid customer how much is missing from it.
    paid_amount = models.DecimalField(max_digits=30, decimal_places=12, null=True, blank=True)
    payment_link = models.CharField(
        max_length=1000, blank=True, help_text="the processor's payment URI, when it gave one"
    )
    starts_at = models.DateTimeField(null=True, blank=True)
    ends_at = models.DateTimeField(null=True, blank=True)
    end_reminder_sent_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [
            # Serves the expiry sweep and the verification queue.
            models.Index(fields=["status", "quote_expires_at"]),
            # Serves the end-of-rental sweep.
            models.Index(fields=["status", "ends_at"]),
        ]
        constraints = [
            # One order per BTCPay invoice; also the index the webhook's
            # "which order is invoice X" lookup reads.
            models.UniqueConstraint(
                fields=["btcpay_invoice_id"],
                condition=~models.Q(btcpay_invoice_id=""),
                name="one_order_per_btcpay_invoice",
            )
        ]

    def __str__(self) -> str:
        return self.reference

    @property
    def reference(self) -> str:
        """What staff, e-mails and a BTCPay invoice's orderId call the order."""
        return f"BG-{self.pk:06d}" if self.pk else "BG-new"

    @property
    def cards(self) -> str:
        return f"{self.quantity} × {self.gpu.name}"

    def batch_list(self) -> list[str]:
        """The names of the campaigns the rental runs, the one it was sized on first."""
        names = sorted(self.campaigns.values_list("name", flat=True))
        if self.campaign is not None:
            first = self.campaign.name
            names = [first, *(name for name in names if name != first)]
        return names

    def payment_uri(self, amount: Decimal | None = None) -> str:
        """The payment URI of the quote, or of `amount` to the same address
        (what an underpaid order still lacks)."""
        if self.payment_link and (amount is None or amount == self.crypto_amount):
            # BTCPay's own link may carry more than the amount (payjoin, say).
            return self.payment_link
        address = self.payment_address.address
        amount = self.crypto_amount if amount is None else amount
        text = format_amount(amount, self.currency.decimals)
        return f"{self.currency.uri_scheme}:{address}?{self.currency.amount_param}={text}"


def format_amount(amount: Decimal, decimals: int) -> str:
    """Fixed-point, no exponent, no trailing zeros beyond the currency's unit."""
    text = f"{amount.quantize(Decimal(1).scaleb(-decimals)):f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


class RentalAccess(models.Model):
    """How the customer reaches the rented machines, recorded by staff when they
    provision it and corrected later if need be (portal/access.py). Shown on the
    tracking page only, never in an e-mail or the dossier: the page is behind the
    order's token, an e-mail may be forwarded."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE, related_name="access")
    host = models.CharField(max_length=253)
    port = models.PositiveIntegerField(default=22)
    username = models.CharField(max_length=32)
    notebook_url = models.URLField(max_length=500, blank=True)
    notebook_token = models.CharField(max_length=200, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "rental access"

    def __str__(self) -> str:
        return f"{self.order}: {self.username}@{self.host}:{self.port}"


class OrderEvent(models.Model):
    """Append-only history: every transition and every notice, with who and why."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="events")
    from_status = models.CharField(max_length=20, choices=Status.choices, blank=True)
    to_status = models.CharField(max_length=20, choices=Status.choices)
    actor = models.CharField(max_length=100, help_text='"customer", "staff:<name>", "btcpay"')
    note = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]

    def __str__(self) -> str:
        return f"{self.order}: {self.from_status or '—'} → {self.to_status} by {self.actor}"


class PaymentNotice(models.Model):
    """The customer's "I paid": a signal for staff, never proof of payment."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE, related_name="notices")
    transaction_id = models.CharField(max_length=200, blank=True)
    claimed_amount = models.DecimalField(max_digits=30, decimal_places=12, null=True, blank=True)
    after_expiry = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "pk"]
        constraints = [
            # Pressing "I paid" twice (same transaction, or none given) is one notice.
            models.UniqueConstraint(
                fields=["order", "transaction_id"], name="one_notice_per_transaction"
            )
        ]


class WebhookDelivery(models.Model):
    """A BTCPay Server webhook delivery, kept so a redelivery is applied once."""

    delivery_id = models.CharField(max_length=100, unique=True)
    event_type = models.CharField(max_length=50)
    invoice_id = models.CharField(max_length=100, blank=True)
    order = models.ForeignKey(Order, on_delete=models.SET_NULL, null=True, blank=True)
    outcome = models.CharField(max_length=300)
    received_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-received_at"]
        verbose_name_plural = "webhook deliveries"
