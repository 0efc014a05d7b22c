from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling
from django_tables2 import RequestConfig

from . import selectors, services
from .models import Campaign, Unit, UnitState
from .tables import UnitTable

UNITS_PER_PAGE = 50


def _get_campaign_for_user(request: HttpRequest, name: str) -> Campaign:
    """The campaign if the user may see it; outsiders get the same 404 as a wrong name."""
    campaign = selectors.campaigns_for_user(request.user).filter(name=name).first()
    if campaign is None:
        raise Http404("No such campaign.")
    return campaign


@login_required
def campaign_list(request: HttpRequest) -> HttpResponse:
    campaigns = list(selectors.campaigns_for_user(request.user))
    counts = selectors.counts_by_campaign(campaign_ids=[c.pk for c in campaigns])
    rows = [(c, counts[c.pk]) for c in campaigns]
    return render(request, "campaigns/campaign_list.html", {"rows": rows})


@login_required
def campaign_detail(request: HttpRequest, name: str) -> HttpResponse:
    campaign = _get_campaign_for_user(request, name)
    counts = selectors.campaign_counts(campaign=campaign)
    context = {"campaign": campaign, "counts": counts}
    if request.htmx and request.htmx.target == "counts":
        response = render(request, "campaigns/campaign_detail.html#counts", context)
        if not counts.active:
            # 286: htmx swaps in these final counts and stops polling.
            response.status_code = HttpResponseStopPolling.status_code
        return response

    state = request.GET.get("state", "")
    if state and state not in UnitState.values:
        state = ""  # an unknown filter value shows everything rather than failing
    units = Unit.objects.filter(campaign=campaign).order_by("pk")
    if state:
        units = units.filter(state=state)
    table = UnitTable(units)
    RequestConfig(request, paginate={"per_page": UNITS_PER_PAGE}).configure(table)
    context.update(
        {
            "table": table,
            "state": state,
            "states": UnitState.choices,
            "failures": selectors.failure_reasons(campaign=campaign),
        }
    )
    return render(request, "campaigns/campaign_detail.html", context)


@login_required
@require_POST
def campaign_run(request: HttpRequest, name: str) -> HttpResponse:
    campaign = _get_campaign_for_user(request, name)
    try:
        batches = services.campaign_run(campaign=campaign)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        if batches:
            messages.success(request, f"Queued {batches} batch{'es' if batches != 1 else ''}.")
        else:
            messages.info(request, "Nothing to run: no pending units.")
    return redirect("campaign_detail", name=campaign.name)
