"""The customer's pages: configurator, tracking, "I paid", dossier. Thin: services decide."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib import messages
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling
from django_ratelimit.core import is_ratelimited
from django_ratelimit.decorators import ratelimit
from django_ratelimit.exceptions import Ratelimited

from campaigns.models import Profile
from campaigns.selectors import campaigns_for_user
from portal import access, order_services
from portal.client_ip import client_key
from portal.dossier import dossier_open
from portal.forms import NoticeForm, OrderForm, quantity_refusal
from portal.models import GpuModel, Order, RentalDuration
from portal.order_page import track_page
from portal.order_states import FINAL, TransitionRefused
from portal.pricing import QuoteRefused, cards_available, plan_price
from portal.ssh_keys import looks_private


def _create_rate(group, request) -> str:
    return settings.ORDER_CREATE_RATE


def _notice_rate(group, request) -> str:
    return settings.ORDER_NOTICE_RATE


def _dossier_rate(group, request) -> str:
    return settings.ORDER_DOSSIER_RATE


def _order_by_token(token: str) -> Order:
    # One answer for a wrong, expired or guessed token: no hint either way.
    order = (
        Order.objects.select_related("gpu", "environment", "currency", "payment_address")
        .filter(tracking_token=token)
        .first()
    )
    if order is None:
        raise Http404("No such order.")
    return order


# What the live price reads; nothing else of the form travels to /order/price/.
PLAN_FIELDS = ("gpu", "quantity", "duration", "environment")


def _price_preview(data) -> dict:
    """What the summary shows for the current choices; nothing here is trusted later.

    The total is always that of the quantity typed; a quantity that cannot be
    ordered (more than are free, more than an order takes) shows the reason
    instead of a total.
    """
    try:
        gpu = GpuModel.objects.get(pk=int(data.get("gpu", "")), active=True)
        duration = RentalDuration.objects.get(pk=int(data.get("duration", "")), active=True)
        quantity = int(data.get("quantity", "1"))
    except (ValueError, GpuModel.DoesNotExist, RentalDuration.DoesNotExist):
        return {}
    preview = {
        "gpu": gpu,
        "duration": duration,
        "quantity": quantity,
        "fiat": settings.FIAT_CURRENCY,
    }
    refusal = quantity_refusal(gpu=gpu, quantity=quantity, free=cards_available(gpu=gpu))
    if refusal is not None:
        return {**preview, "refusal": refusal[1]}
    price = plan_price(gpu=gpu, quantity=quantity, days=duration.days)
    return {**preview, "total": price.total}


def _campaign_for(request: HttpRequest):
    """A campaign the signed-in user may see, when the order starts from one."""
    name = request.GET.get("campaign") or request.POST.get("campaign")
    if not name or not request.user.is_authenticated:
        return None
    return campaigns_for_user(request.user).filter(name=name).first()


def _profile_for(request: HttpRequest, campaign):
    """The finished profile of `campaign` the order was sized on ("Order this plan")."""
    if campaign is None:
        return None
    try:
        pk = int(request.GET.get("profile") or request.POST.get("profile") or "")
    except ValueError:
        return None
    return Profile.objects.filter(pk=pk, campaign=campaign, state=Profile.State.DONE).first()


def _batch_choices(request: HttpRequest, campaign):
    """The campaigns a signed-in user may add to the rental's batch list (the
    one the order starts from is in it already); None without an account."""
    if not request.user.is_authenticated:
        return None
    choices = campaigns_for_user(request.user).order_by("name")
    return choices.exclude(pk=campaign.pk) if campaign is not None else choices


def _min_memory(request: HttpRequest) -> int | None:
    try:
        value = int(request.GET.get("min_memory_gb", ""))
    except ValueError:
        return None
    return value if 0 < value < 1000 else None


def order_new(request: HttpRequest) -> HttpResponse:
    campaign = _campaign_for(request)
    batch_choices = _batch_choices(request, campaign)
    if request.method == "POST" and "update_price" in request.POST:
        # "Update price" (shown without JavaScript): the same page with the
        # summary of the posted choices; nothing is validated or ordered.
        posted: dict[str, Any] = {
            k: v for k, v in request.POST.items() if k in OrderForm.base_fields
        }
        posted["campaigns"] = request.POST.getlist("campaigns")
        if looks_private(posted.get("ssh_keys", "")):
            posted["ssh_keys"] = ""  # a private key pasted by mistake is never shown back
        form = OrderForm(initial=posted, campaigns=batch_choices)
        preview = _price_preview(request.POST)
    elif request.method == "POST":
        form = OrderForm(request.POST, campaigns=batch_choices)
        if form.is_valid():
            # Only a submission that could order counts toward the limit: a
            # form sent back with an error (a typo, a card just sold out) does not.
            if is_ratelimited(
                request, group="order_create", key="ip", rate=_create_rate, increment=True
            ):
                raise Ratelimited()
            data = form.cleaned_data
            plan = order_services.Plan(
                gpu=data["gpu"],
                quantity=data["quantity"],
                days=data["duration"].days,
                environment=data["environment"],
                currency=data["currency"],
            )
            try:
                order = order_services.order_create(
                    plan=plan,
                    first_name=data["first_name"],
                    last_name=data["last_name"],
                    email=data["email"],
                    campaign=campaign,
                    profile=_profile_for(request, campaign),
                    campaigns=list(data.get("campaigns") or ()),
                    ssh_public_keys=data["ssh_keys"],
                    export_folders=data["export_folders"],
                    client_key=client_key(request),
                )
            except QuoteRefused as exc:
                form.add_error(None, str(exc))
            else:
                return redirect("order_track", token=order.tracking_token)
        preview = _price_preview(request.POST)
    else:
        initial = {
            k: v
            for k, v in request.GET.items()
            # "Get a new quote for this plan" (portal/order_page.py) names the currency too.
            if k in ("gpu", "quantity", "duration", "environment", "currency")
        }
        shortest = RentalDuration.objects.filter(active=True).values_list("pk", flat=True).first()
        # The duration the summary prices is the one checked, until the user picks another.
        form = OrderForm(initial={"duration": shortest, **initial}, campaigns=batch_choices)
        first = {
            "gpu": form.fields["gpu"].choices[0][0] if form.fields["gpu"].choices else "",
            "duration": shortest,
            "quantity": 1,
        }
        preview = _price_preview({**first, **initial})
    context = {
        "form": form,
        "preview": preview,
        "durations": RentalDuration.objects.filter(active=True),
        "campaign": campaign,
        "profile": _profile_for(request, campaign),
        "min_memory_gb": _min_memory(request),
        "gpus": GpuModel.objects.filter(active=True),
    }
    return render(request, "orders/order_new.html", context)


def order_price(request: HttpRequest) -> HttpResponse:
    """The summary partial the configurator swaps in as choices change."""
    return render(request, "orders/order_new.html#price", {"preview": _price_preview(request.GET)})


# The tracking page and the dossier carry the customer's order behind its
# token: `Cache-Control: private, no-store` (never_cache) keeps them out of
# shared caches and off the disk of the browser's own.
@never_cache
def order_track(request: HttpRequest, token: str) -> HttpResponse:
    order = _order_by_token(token)
    now = timezone.now()
    events = list(order.events.all())
    notices = list(order.notices.all())
    page = track_page(order=order, now=now, events=len(events), notices=len(notices))
    context = {
        "order": order,
        "page": page,
        "events": events,
        "notices": notices,
        "notice_form": NoticeForm(unit=order.currency.code),
        "now": now,
    }
    if request.htmx and request.htmx.target == "order-state":
        # The auto-refresh: everything that depends on the state, as one partial.
        if order.status not in FINAL and request.GET.get("v") == page.version:
            # Nothing changed: no swap, so a half-typed notice stays as typed.
            return HttpResponse(status=204)
        response = render(request, "orders/order_track.html#state", context)
        if order.status in FINAL:
            response.status_code = HttpResponseStopPolling.status_code
        return response
    # The access block (orders/_access.html): the keys and batch list given,
    # and while the rental is active how to connect.
    context["rental"] = access.rental_view(order=order, now=now)
    return render(request, "orders/order_track.html", context)


@require_POST
@ratelimit(key="ip", rate=_notice_rate, method="POST", block=True)
def order_paid(request: HttpRequest, token: str) -> HttpResponse:
    order = _order_by_token(token)
    form = NoticeForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(e for errs in form.errors.values() for e in errs)
        messages.error(request, f"Your notice was not recorded: {errors}")
        return redirect("order_track", token=token)
    try:
        result = order_services.order_record_notice(
            order=order,
            transaction_id=form.cleaned_data["transaction_id"],
            claimed_amount=form.cleaned_data["claimed_amount"],
        )
    except TransitionRefused:
        messages.error(
            request,
            f"Your notice was not recorded: this order is {order.get_status_display().lower()} "
            "and no longer takes payment notices.",
        )
        return redirect("order_track", token=token)
    if result.created:
        messages.success(
            request,
            "Your notice was recorded. Verification is under way: "
            "we will confirm once the payment is seen on the network.",
        )
    else:
        messages.info(request, "This notice was already recorded; verification is under way.")
    return redirect("order_track", token=token)


@never_cache
@ratelimit(key="ip", rate=_dossier_rate, method="GET", block=True)
def order_dossier(request: HttpRequest, token: str) -> HttpResponse:
    order = _order_by_token(token)
    # The kept zip while the order and its campaign are unchanged; rebuilt otherwise.
    dossier, _built = dossier_open(order=order)
    return FileResponse(dossier, as_attachment=True, filename=f"{order.reference}-dossier.zip")


def rate_limited(request: HttpRequest, exception) -> HttpResponse:
    """django-ratelimit's answer (RATELIMIT_VIEW): readable, and nothing was recorded."""
    return render(request, "orders/rate_limited.html", status=429)
