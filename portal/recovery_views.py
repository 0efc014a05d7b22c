"""A lost tracking link, sent again: to the order's own address, never on screen.

The page answers the same words whether or not any order uses the address, so
it tells a visitor nothing about who ordered. Per client address the form is
rate-limited (ORDER_RECOVER_RATE, a 429 page); per e-mail address the links are
mailed at most ORDER_RECOVER_EMAIL_RATE times (beyond it the same answer, and no
e-mail), so the page cannot be turned on someone's mailbox.

The e-mail is sent by a task on the `portal` queue, not in the request: the
request does the same work whether or not the address ordered (count, send a
message), so how long it takes tells nothing either. A broker that does not
answer loses that one e-mail (logged, without the address); the page says the same.
"""

from __future__ import annotations

from django import forms
from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django_ratelimit.core import is_ratelimited
from django_ratelimit.exceptions import Ratelimited

from campaigns.runs import start

#: portal/tasks.py: looks the address's orders up and mails their links.
SEND_LINKS_TASK = "portal.tasks.send_tracking_links"


class RecoverForm(forms.Form):
    email = forms.EmailField(label="E-mail address you ordered with")


def _client_rate(group, request) -> str:
    return settings.ORDER_RECOVER_RATE


def _address_rate(group, request) -> str:
    return settings.ORDER_RECOVER_EMAIL_RATE


def order_recover(request: HttpRequest) -> HttpResponse:
    form = RecoverForm(request.POST or None)
    sent = False
    if request.method == "POST":
        if is_ratelimited(
            request, group="order_recover", key="ip", rate=_client_rate, increment=True
        ):
            raise Ratelimited()
        if form.is_valid():
            address = form.cleaned_data["email"].strip().lower()
            if not is_ratelimited(
                request,
                group="order_recover_address",
                key=lambda _group, _request: address,
                rate=_address_rate,
                increment=True,
            ):
                # Not taken by the broker: task_send logs it; the visitor
                # reads the same answer and may ask again.
                start.task_send(task=SEND_LINKS_TASK, args=[address])
            sent = True
            form = RecoverForm()
    return render(request, "orders/order_recover.html", {"form": form, "sent": sent})
