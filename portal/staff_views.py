"""Staff's verification queue and order actions. Every action goes through a service."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.admin.views.decorators import staff_member_required
from django.contrib.auth.decorators import permission_required
from django.db.models import Count, Q
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from campaigns.selectors import campaigns_for_user
from portal import access, order_services, payment_addresses
from portal.forms import AccessForm, StaffActionForm
from portal.models import Order, RentalAccess
from portal.order_page import missing_amount
from portal.order_states import ALLOWED, FINAL, Status, TransitionRefused, holds_cards
from portal.pricing import cards_available
from portal.staff_group import VERIFY_ACT, VERIFY_VIEW

# Which action moves an order where; the state table says whether it may.
ACTION_TARGET = {
    "confirm": Status.CONFIRMED,
    "partial": Status.UNDERPAID,
    "reject": Status.REJECTED,
    "seen": Status.PAYMENT_SEEN,
    "provisioning": Status.PROVISIONING,
    "refund": Status.REFUNDED,
}


def _orders():
    return Order.objects.select_related("gpu", "currency").annotate(notice_count=Count("notices"))


# A staff account logs in; its permissions (the "Order staff" group,
# portal/staff_group.py) decide whether it may look and whether it may act.
@staff_member_required
@permission_required(VERIFY_VIEW, raise_exception=True)
def staff_queue(request: HttpRequest) -> HttpResponse:
    # Notified first (a customer is waiting), then expired orders that still
    # got a notice (paid late?), then what the processor saw or found short.
    groups = [
        (
            "Payment notified",
            _orders().filter(status=Status.PAYMENT_NOTIFIED).order_by("updated_at"),
        ),
        (
            "Expired with a notice (paid late?)",
            _orders()
            .filter(status=Status.EXPIRED)
            .filter(Q(paid_late_claim=True) | Q(notices__isnull=False))
            .distinct()
            .order_by("updated_at"),
        ),
        (
            "Paid, awaiting capacity or refund",
            _orders().filter(status=Status.AWAITING_CAPACITY).order_by("updated_at"),
        ),
        (
            "Notice not verified in time (cards released)",
            _orders().filter(status=Status.HOLD_LAPSED).order_by("updated_at"),
        ),
        (
            "Payment seen or underpaid",
            _orders()
            .filter(status__in=[Status.PAYMENT_SEEN, Status.UNDERPAID])
            .order_by("updated_at"),
        ),
        (
            "To provision",
            _orders()
            .filter(status__in=[Status.CONFIRMED, Status.PROVISIONING])
            .order_by("updated_at"),
        ),
    ]
    context = {"groups": groups, "address_sources": payment_addresses.sources()}
    return render(request, "orders/staff_queue.html", context)


@staff_member_required
@permission_required(VERIFY_VIEW, raise_exception=True)
@never_cache  # the access form carries the notebook token
def staff_order(request: HttpRequest, pk: int) -> HttpResponse:
    return _staff_order_page(request, get_object_or_404(_orders(), pk=pk))


def _access_form(order: Order) -> AccessForm | None:
    """Provisioning records the access; an active rental's can be corrected."""
    if order.status == Status.PROVISIONING:
        return AccessForm()
    if order.status == Status.ACTIVE:
        current = RentalAccess.objects.filter(order=order).values().first()
        return AccessForm(initial=dict(current) if current else {})
    return None


def _staff_order_page(
    request: HttpRequest, order: Order, access_form: AccessForm | None = None, status: int = 200
) -> HttpResponse:
    allowed = ALLOWED.get(order.status, frozenset())
    now = timezone.now()
    # Cards the order would take if a payment moved it on now; None while it
    # holds its own, or once it is over.
    free = (
        None
        if order.status in FINAL or holds_cards(order, now)
        else cards_available(gpu=order.gpu, now=now)
    )
    actions = [
        (k, label)
        for k, label in StaffActionForm.ACTIONS
        if ACTION_TARGET[k] in allowed
        # Provisioning is offered once the cards are free; the service checks again.
        and not (k == "provisioning" and free is not None and free < order.quantity)
    ]
    may_act = request.user.has_perm(VERIFY_ACT)
    if not may_act:
        actions = []  # may look, not act: the action would answer 403
    linked = access.linked_campaigns(order=order)
    context = {
        "order": order,
        "free": free,
        "events": order.events.all(),
        "notices": order.notices.all(),
        "actions": actions,
        "form": StaffActionForm(),
        "rental": access.rental_view(order=order, now=now),
        "linked_campaigns": linked,
        # Order staff see the batch list's counts and estimates here; the
        # campaign pages themselves follow project membership (a superuser
        # sees every one), so only those this account may open are links.
        "openable_campaigns": set(
            campaigns_for_user(request.user)
            .filter(pk__in=[item.campaign.pk for item in linked])
            .values_list("pk", flat=True)
        ),
        "access_form": (access_form or _access_form(order)) if may_act else None,
        "missing": missing_amount(order),
    }
    return render(request, "orders/staff_order.html", context, status=status)


@staff_member_required
@permission_required(VERIFY_ACT, raise_exception=True)
@require_POST
def staff_order_access(request: HttpRequest, pk: int) -> HttpResponse:
    """Provision (PROVISIONING → ACTIVE, with the access) or correct an active rental's access."""
    order = get_object_or_404(_orders(), pk=pk)
    form = AccessForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Nothing changed: correct the access details below.")
        return _staff_order_page(request, order, access_form=form, status=400)
    actor = order_services.staff_actor(request.user)
    note = form.cleaned_data["note"]
    try:
        if order.status == Status.ACTIVE:
            changed = access.access_correct(
                order=order, actor=actor, details=form.details(), note=note
            )
            if not changed:
                messages.info(request, "Nothing changed: those are the access details already.")
                return redirect("staff_order", pk=pk)
            messages.success(
                request,
                f"{order.reference}: access corrected ({', '.join(changed)}); "
                "the customer was e-mailed that it changed.",
            )
            return redirect("staff_order", pk=pk)
        access.access_provision(order=order, actor=actor, details=form.details(), note=note)
    except TransitionRefused as exc:
        messages.error(request, f"Nothing changed: {exc}.")
        return redirect("staff_order", pk=pk)
    order.refresh_from_db()
    messages.success(
        request,
        f"{order.reference} is now active until {order.ends_at:%Y-%m-%d %H:%M} UTC; "
        "the customer was e-mailed that it is ready.",
    )
    return redirect("staff_queue")


@staff_member_required
@permission_required(VERIFY_ACT, raise_exception=True)
@require_POST
def staff_order_action(request: HttpRequest, pk: int) -> HttpResponse:
    order = get_object_or_404(Order, pk=pk)
    form = StaffActionForm(request.POST)
    if not form.is_valid():
        errors = "; ".join(f"{k}: {' '.join(v)}" for k, v in form.errors.items())
        messages.error(request, f"Nothing changed: {errors}")
        return redirect("staff_order", pk=pk)
    actor = order_services.staff_actor(request.user)
    note = form.cleaned_data["note"]
    action = form.cleaned_data["action"]
    paid_amount = form.cleaned_data["paid_amount"]
    try:
        if action == "confirm":
            order_services.order_confirm_payment(
                order=order,
                actor=actor,
                note=note,
                overpaid=form.cleaned_data["overpaid"],
                paid_amount=paid_amount,
            )
        elif action == "partial":
            order_services.order_mark_underpaid(
                order=order, actor=actor, note=note, paid_amount=paid_amount
            )
        elif action == "reject":
            order_services.order_reject(order=order, actor=actor, note=note)
        elif action == "seen":
            order_services.order_mark_payment_seen(order=order, actor=actor, note=note)
        elif action == "provisioning":
            order_services.order_start_provisioning(order=order, actor=actor, note=note)
        elif action == "refund":
            order_services.order_refund(order=order, actor=actor, note=note)
    except TransitionRefused as exc:
        messages.error(request, f"Nothing changed: {exc}.")
        return redirect("staff_order", pk=pk)
    order.refresh_from_db()
    messages.success(request, f"{order.reference} is now {order.get_status_display().lower()}.")
    return redirect("staff_queue")
