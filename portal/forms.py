"""Forms of the ordering portal. Prices are never a field: the server computes them."""

from __future__ import annotations

import unicodedata
from typing import cast

from django import forms
from django.conf import settings
from django.http import QueryDict

from campaigns.models import Campaign
from portal import access, ssh_keys
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
    # What the machines are set up with (portal/access.py, docs/ordering.md).
    ssh_keys = forms.CharField(
        label="SSH public keys",
        max_length=ssh_keys.MAX_KEYS * (ssh_keys.MAX_LINE + 2),
        widget=forms.Textarea(
            attrs={
                "rows": 3,
                "spellcheck": "false",
                "placeholder": "ssh-ed25519 AAAAC3Nz… you@laptop",
            }
        ),
        help_text="one per line: the contents of a .pub file such as ~/.ssh/id_ed25519.pub "
        "(make one with ssh-keygen -t ed25519). Ed25519, ECDSA, RSA of 2048 bits or more and "
        f"security keys (sk-) are accepted; at most {ssh_keys.MAX_KEYS}.",
        error_messages={"required": "Give at least one SSH public key: it is how you log in."},
    )
    export_folders = forms.CharField(
        label="Export folders",
        required=False,
        initial=access.DEFAULT_EXPORT_FOLDER,
        max_length=access.EXPORT_FOLDERS_MAX * (access.EXPORT_FOLDER_MAX + 2),
        widget=forms.Textarea(attrs={"rows": 2, "spellcheck": "false"}),
        help_text="where your results are exported on the machine, one folder per line, "
        f"relative to your home folder (e.g. results/run1); empty: {access.DEFAULT_EXPORT_FOLDER}.",
    )
    campaigns = forms.ModelMultipleChoiceField(
        queryset=Campaign.objects.none(),
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Campaigns to run on the rental",
        help_text="your batch list: the page of your rental gives the command lines that run them",
    )

    def __init__(self, *args, campaigns=None, **kwargs):
        super().__init__(*args, **kwargs)
        # The campaigns the signed-in user may see (none without an account).
        if campaigns is not None:
            cast(forms.ModelMultipleChoiceField, self.fields["campaigns"]).queryset = campaigns
        else:
            del self.fields["campaigns"]
        # Out-of-stock cards stay visible (with their state) and are refused
        # on submit with a reason, not hidden.
        gpus = list(GpuModel.objects.filter(active=True))
        for gpu in gpus:
            gpu.free = cards_available(gpu=gpu)
        self.free = {gpu.pk: gpu.free for gpu in gpus}
        field = self.fields["gpu"]
        field.queryset = GpuModel.objects.filter(active=True)
        field.choices = [(gpu.pk, field.label_from_instance(gpu)) for gpu in gpus]

    def clean_ssh_keys(self) -> list[str]:
        text = self.cleaned_data["ssh_keys"]
        if ssh_keys.looks_private(text):
            # Never sent back into the page, nor kept anywhere.
            data = self.data.copy() if isinstance(self.data, QueryDict) else dict(self.data)
            data[self.add_prefix("ssh_keys")] = ""
            self.data = data
        keys, errors = ssh_keys.parse_keys(text)
        if errors:
            raise forms.ValidationError(errors)
        if not keys:
            raise forms.ValidationError(self.fields["ssh_keys"].error_messages["required"])
        return [key.line for key in keys]

    def clean_export_folders(self) -> list[str]:
        folders, errors = access.parse_export_folders(self.cleaned_data["export_folders"])
        if errors:
            raise forms.ValidationError(errors)
        return folders

    def clean_campaigns(self):
        chosen = self.cleaned_data["campaigns"]
        if len(chosen) > access.BATCH_CAMPAIGNS_MAX:
            raise forms.ValidationError(
                f"{len(chosen)} campaigns chosen; a rental takes at most "
                f"{access.BATCH_CAMPAIGNS_MAX}."
            )
        return chosen

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


class AccessForm(forms.Form):
    """What staff record when they provision a rental, or correct later."""

    host = forms.CharField(
        max_length=253, help_text="the machine's DNS name or IP address, as ssh takes it"
    )
    port = forms.IntegerField(min_value=1, max_value=65535, initial=22)
    username = forms.CharField(
        max_length=32, label="User", help_text="the account the keys log into"
    )
    notebook_url = forms.URLField(
        max_length=500,
        required=False,
        assume_scheme="https",
        label="Notebook URL (optional)",
        help_text="e.g. https://gpu-7.example.net:8888/lab — without its token",
    )
    notebook_token = forms.CharField(
        max_length=200,
        required=False,
        label="Notebook token (optional)",
        help_text="shown on the customer's order page only, never e-mailed",
    )
    note = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 2}),
        max_length=2000,
        required=False,
        label="Note to the customer (optional; shown to the customer, word for word)",
    )

    def __init__(self, *args, **kwargs):
        # Beside the staff action form on one page: ids of its own.
        kwargs.setdefault("auto_id", "access_%s")
        super().__init__(*args, **kwargs)

    def clean_host(self) -> str:
        value = self.cleaned_data["host"].strip()
        if not access.valid_host(value):
            raise forms.ValidationError(
                "Give a DNS name (gpu-7.example.net) or an IP address, nothing else."
            )
        return value

    def clean_username(self) -> str:
        value = self.cleaned_data["username"].strip()
        if not access.USERNAME.match(value):
            raise forms.ValidationError(
                "A user name of lower-case letters, digits, - and _, starting with a letter or _."
            )
        return value

    def clean_notebook_url(self) -> str:
        value = self.cleaned_data["notebook_url"]
        if value and not value.startswith(("https://", "http://")):
            raise forms.ValidationError("A notebook address starts with https:// (or http://).")
        if "token=" in value:
            raise forms.ValidationError(
                "Leave the token out of the address and put it in the token field: "
                "the address may travel further than the page."
            )
        return value

    def clean_notebook_token(self) -> str:
        value = self.cleaned_data["notebook_token"].strip()
        single_line(value)
        return value

    def clean(self):
        cleaned = super().clean() or {}
        if cleaned.get("notebook_token") and not cleaned.get("notebook_url"):
            self.add_error("notebook_url", "A token needs the notebook's address.")
        return cleaned

    def details(self) -> access.AccessDetails:
        data = self.cleaned_data
        return access.AccessDetails(
            host=data["host"],
            port=data["port"],
            username=data["username"],
            notebook_url=data["notebook_url"],
            notebook_token=data["notebook_token"],
        )
