from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling
from django_tables2 import RequestConfig

from . import batch_stats, inventory, reconcile, selectors, services
from .models import Campaign, ErrorClass, Unit, UnitState
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

    # Unknown filter values show everything rather than failing.
    state = request.GET.get("state", "")
    state = state if state in UnitState.values else ""
    error = request.GET.get("error", "")
    error = error if error in ErrorClass.values else ""
    units = Unit.objects.filter(campaign=campaign).order_by("pk")
    if state:
        units = units.filter(state=state)
    if error:
        units = units.filter(state=UnitState.FAILED, error_class=error)
    table = UnitTable(units, campaign_name=campaign.name)
    chart = batch_stats.memory_chart(campaign=campaign)
    RequestConfig(request, paginate={"per_page": UNITS_PER_PAGE}).configure(table)
    context.update(
        {
            "table": table,
            "state": state,
            "error": error,
            "states": UnitState.choices,
            "failures": selectors.failure_reasons(campaign=campaign),
            "reconciliation": selectors.last_reconciliation(campaign=campaign),
            "policies": batch_stats.policy_comparison(campaign=campaign),
            "memory_chart": chart,
            "memory_warning": batch_stats.memory_creep(chart),
            "export_files": list(inventory.FILES),
        }
    )
    return render(request, "campaigns/campaign_detail.html", context)


@login_required
@require_POST
def campaign_verify(request: HttpRequest, name: str) -> HttpResponse:
    campaign = _get_campaign_for_user(request, name)
    report = reconcile.campaign_verify(campaign=campaign, deep=request.POST.get("deep") == "1")
    messages.info(
        request,
        f"Verified {report.total} units: {report.counts['valid']} valid, "
        f"{report.corrected} state{'s' if report.corrected != 1 else ''} corrected.",
    )
    return redirect(f"{reverse('campaign_detail', args=[campaign.name])}#verify")


@login_required
def campaign_export(request: HttpRequest, name: str, filename: str) -> HttpResponse:
    campaign = _get_campaign_for_user(request, name)
    if filename not in inventory.FILES:
        raise Http404("No such export file.")
    response = StreamingHttpResponse(
        inventory.GENERATORS[filename](campaign), content_type=inventory.FILES[filename]
    )
    response["Content-Disposition"] = f'attachment; filename="{campaign.name}-{filename}"'
    return response


@login_required
def unit_detail(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    campaign = _get_campaign_for_user(request, name)
    found = selectors.unit_lineage(campaign=campaign, pk=pk)
    if found is None:
        raise Http404("No such unit.")
    unit, attempts = found
    return render(
        request,
        "campaigns/unit_detail.html",
        {"campaign": campaign, "unit": unit, "attempts": attempts},
    )


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
