"""Correction effort in the browser: a campaign's figures (a page, and the
fragment its campaign page loads) and its list of reject reasons.

Thin views over campaigns/review/effort.py and campaigns/review/reasons.py.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.middleware import HtmxDetails

from campaigns.review import effort, reasons
from campaigns.web.access import campaign_for_user_or_404


class HtmxHttpRequest(HttpRequest):
    htmx: HtmxDetails


@login_required
@vary_on_headers("HX-Request")
def review_effort(request: HtmxHttpRequest, name: str) -> HttpResponse:
    """The campaign's correction effort over every parameter version; the
    campaign page loads the fragment after the page, the link opens the page."""
    campaign = campaign_for_user_or_404(request, name)
    context = {"campaign": campaign, "effort": effort.review_effort(campaign=campaign)}
    if request.htmx:
        return render(request, "campaigns/review_effort.html#effort", context)
    return render(request, "campaigns/review_effort.html", context)


@login_required
@require_POST
def reject_reasons_edit(request: HttpRequest, name: str) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    try:
        saved = reasons.reject_reasons_set(campaign=campaign, text=request.POST.get("reasons", ""))
    except ValidationError as exc:
        messages.error(request, f"Reject reasons not saved: {'; '.join(exc.messages)}.")
    else:
        messages.success(request, f"Reject reasons saved: {', '.join(saved)}.")
    return redirect(reverse("campaign_detail", args=[campaign.name]) + "#reject-reasons")
