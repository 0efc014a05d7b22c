"""Forms of the ordering portal. Prices are never a field: the server computes them."""

from __future__ import annotations

import unicodedata

from django import forms
from django.conf import settings

from portal.models import CryptoCurrency, Environment, GpuModel, RentalDuration
from portal.pricing import cards_available

MAX_CARDS = 16


def quantity_refusal(*, gpu: GpuModel, quantity: int, free: int) -> tuple[str, str] | None:
    """Why `quantity` cards of `gpu` cannot be ordered now, as (field, message), or None.

    The live total and the submitted form both say it, with the same words.
    """
    if quantity < 1:
        return "quantity", "Choose at least one card."
    if free == 0:
        return "gpu", f"{gpu.name} is out of stock. Choose another card."
    if quantity > free:
        return "quantity", f"Only {free} {gpu.name} card(s) are free; choose {free} or fewer."
    if quantity > MAX_CARDS:
        return "quantity", f"At most {MAX_CARDS} cards per order; choose {MAX_CARDS} or fewer."
    return None


class GpuChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, gpu: GpuModel) -> str:
        free = getattr(gpu, "free", None)
        stock = " — out of stock" if free == 0 else (f" — {free} free" if free else "")
        return (
            f"{gpu.name} ({gpu.architecture}, {gpu.memory_gb} GB) · "
            f"{gpu.price_per_day} {settings.FIAT_CURRENCY} per day{stock}"
        )


class DurationChoiceField(forms.ModelChoiceField):
    def label_from_instance(self, duration: RentalDuration) -> str:
        return f"{duration.days} days — {duration.purpose}"


# Long enough for real names; short enough that a name field is no place for a message.
NAME_MAX = 60


def single_line(value: str) -> None:
    """A name is one line of visible text: no line breaks, tabs or control and
    format characters (a header or a second paragraph smuggled into an e-mail,
    text hidden or reversed by a direction mark)."""
    if any(unicodedata.category(ch)[0] == "C" or ch in "\u2028\u2029" for ch in value):
        raise forms.ValidationError(
            "Use one line of plain text: no line breaks or control characters."
        )


class OrderForm(forms.Form):
    gpu = GpuChoiceField(queryset=GpuModel.objects.none(), label="GPU model", empty_label=None)
    quantity = forms.IntegerField(
        min_value=1, max_value=MAX_CARDS, initial=1, help_text="number of cards"
    )
    duration = DurationChoiceField(
        queryset=RentalDuration.objects.filter(active=True),
        empty_label=None,
        widget=forms.RadioSelect,
    )
    environment = forms.ModelChoiceField(
        queryset=Environment.objects.filter(active=True),
        empty_label=None,
        label="Software environment",
    )
    first_name = forms.CharField(max_length=NAME_MAX, validators=[single_line])
    last_name = forms.CharField(max_length=NAME_MAX, validators=[single_line])
    email = forms.EmailField(help_text="the order's contact: payment instructions and updates")
    currency = forms.ModelChoiceField(
        queryset=CryptoCurrency.objects.filter(active=True),
        empty_label=None,
        label="Pay with",
    )

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Out-of-stock cards stay visible (with their state) and are refused
        # on submit with a reason, not hidden.
        gpus = list(GpuModel.objects.filter(active=True))
        for gpu in gpus:
            gpu.free = cards_available(gpu=gpu)
        self.free = {gpu.pk: gpu.free for gpu in gpus}
        field = self.fields["gpu"]
        field.queryset = GpuModel.objects.filter(active=True)
        field.choices = [(gpu.pk, field.label_from_instance(gpu)) for gpu in gpus]

    def clean(self):
        cleaned = super().clean()
        gpu, quantity = cleaned.get("gpu"), cleaned.get("quantity")
        if gpu is not None and quantity is not None:
            refusal = quantity_refusal(gpu=gpu, quantity=quantity, free=self.free.get(gpu.pk, 0))
            if refusal is not None:
                self.add_error(*refusal)
        return cleaned


class NoticeForm(forms.Form):
    transaction_id = forms.CharField(
        max_length=200,
        required=False,
        label="Transaction id (optional)",
        help_text="helps staff find your payment faster",
    )
    claimed_amount = forms.DecimalField(
        max_digits=30,
        decimal_places=12,
        min_value=0,
        required=False,
        label="Amount you sent (optional)",
    )

    def __init__(self, *args, unit: str = "", **kwargs):
        super().__init__(*args, **kwargs)
        if unit:  # the order's crypto currency: an amount always says its unit
            self.fields["claimed_amount"].label = f"Amount you sent, in {unit} (optional)"

    def clean_transaction_id(self) -> str:
        value = self.cleaned_data["transaction_id"].strip()
        if value and not value.replace("-", "").replace("_", "").isalnum():
            raise forms.ValidationError("A transaction id holds letters and digits only.")
        return value


class StaffActionForm(forms.Form):
    ACTIONS = (
        ("confirm", "Confirm payment"),
        ("partial", "Mark partially paid"),
        ("reject", "Reject"),
        ("seen", "Mark payment seen"),
        ("provisioning", "Start provisioning"),
        ("provisioned", "Mark provisioned (rental starts now)"),
        ("refund", "Mark refunded"),
    )
    action = forms.ChoiceField(choices=ACTIONS)
    # Goes on the customer's timeline and into their e-mail as written.
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        max_length=2000,
        label="Note to the customer (shown to the customer, word for word)",
    )
    overpaid = forms.BooleanField(required=False, label="more than the quote arrived")
    # The customer's page of an underpaid order says how much is missing from it.
    paid_amount = forms.DecimalField(
        max_digits=30,
        decimal_places=12,
        min_value=0,
        required=False,
        label="Amount that arrived",
    )

    def clean(self):
        super().clean()
        cleaned = self.cleaned_data
        if cleaned.get("action") == "partial" and cleaned.get("paid_amount") is None:
            self.add_error(
                "paid_amount", "Say how much arrived: the customer sees what is missing."
            )
        return cleaned
