"""A campaign's batch-size profile in the browser: the report, a re-run, a new profile."""

from __future__ import annotations

import math
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling

from campaigns.models import Campaign, Estimate, Profile
from campaigns.profiles import charts as profile_charts
from campaigns.profiles.advice import advisor
from campaigns.profiles.extrapolation import (
    SIZE_UNITS,
    CorpusSizeError,
    corpus_size_parse,
    estimate_extrapolate,
)
from campaigns.profiles.report import CAP_REACHED, profile_comparison, profile_report
from campaigns.profiles.services import latest_profile, profile_rerun_start, profile_start
from campaigns.runs import start
from campaigns.specs import processors as processor_specs
from campaigns.web.access import campaign_for_user_or_404

PROFILE_ACTIVE = {Profile.State.QUEUED, Profile.State.RUNNING}
DEFAULT_MARGIN_PERCENT = 20
MAX_MARGIN_PERCENT = 90
# The largest batch a profile tries: the model's default, and a ceiling a form
# cannot raise (each step of the sweep doubles the batch up to it).
DEFAULT_MAX_BATCH = Profile._meta.get_field("max_batch_size").default
MAX_PROFILE_BATCH = 65536


@login_required
def campaign_profile(request: HttpRequest, name: str) -> HttpResponse:
    """The latest profile's report; the report part polls while a worker measures.

    ?compare=ID puts an earlier profile of the campaign beside it (a re-run of
    the same sample on another device, another day).
    """
    campaign = campaign_for_user_or_404(request, name)
    profile = latest_profile(campaign=campaign)
    context = {
        "campaign": campaign,
        "profile": profile,
        "margin_percent": round(profile.margin * 100) if profile else DEFAULT_MARGIN_PERCENT,
        "max_margin_percent": MAX_MARGIN_PERCENT,
        "max_batch": profile.max_batch_size if profile else DEFAULT_MAX_BATCH,
        "max_profile_batch": MAX_PROFILE_BATCH,
        "cost_unit": processor_specs.cost_unit(campaign.processor),
        "cap_reached_text": CAP_REACHED,
    }
    if profile is not None:
        estimate = Estimate.objects.filter(profile=profile).first()
        advice = advisor()
        environment, environment_note = advice.environment_match(profile.runtime)
        context.update(
            {
                "active": profile.state in PROFILE_ACTIVE,
                "report": profile_report(profile),
                "headroom": profile_charts.headroom(profile),
                "memory_chart": profile_charts.memory_chart(profile),
                "throughput_chart": profile_charts.throughput_chart(profile),
                "order_url": advice.order_link(estimate=estimate)
                if estimate is not None and estimate.gpu_name
                else None,
                "environment": environment,
                "environment_note": environment_note,
                "earlier": list(
                    campaign.profiles.exclude(pk=profile.pk).order_by("-created_at", "-pk")[
                        :EARLIER_PROFILES
                    ]
                ),
                "comparison": _comparison(request, campaign, profile),
                "poll_url": request.get_full_path(),
                **_extrapolation(request, estimate),
            }
        )
    if request.htmx and request.htmx.target == "profile-report":
        response = render(request, "campaigns/campaign_profile.html#profile-report", context)
        if not context.get("active"):
            # 286: htmx swaps in the finished report and stops polling.
            response.status_code = HttpResponseStopPolling.status_code
        return response
    return render(request, "campaigns/campaign_profile.html", context)


EARLIER_PROFILES = 10


def _comparison(request: HttpRequest, campaign: Campaign, profile: Profile) -> dict | None:
    """The ?compare= profile beside the shown one; another campaign's id is a 404."""
    raw = request.GET.get("compare", "")
    if not raw:
        return None
    if not raw.isdigit():
        raise Http404("No such profile.")
    other = campaign.profiles.filter(pk=int(raw)).first()
    if other is None:
        raise Http404("No such profile.")
    return profile_comparison(profile=profile, other=other)


def _extrapolation(request: HttpRequest, estimate: Estimate | None) -> dict:
    """The corpus-size form (?corpus=2M&corpus_unit=units) and, when it is
    filled, the estimate carried to that size or why it cannot be."""
    amount = request.GET.get("corpus", "")[:40]
    unit = request.GET.get("corpus_unit", "units")
    context: dict = {
        "corpus_amount": amount,
        "corpus_unit": unit if unit in SIZE_UNITS else "units",
        "corpus_units": list(SIZE_UNITS),
    }
    if estimate is None:
        return context
    try:
        size = corpus_size_parse(amount, unit)
        if size is not None:
            context["extrapolation"] = estimate_extrapolate(estimate=estimate, size=size)
    except CorpusSizeError as exc:
        context["extrapolation_error"] = str(exc)
    return context


@login_required
@require_POST
def campaign_profile_rerun(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    """The same sample and parameter version again, queued; the report then
    compares the new profile with the one it repeats."""
    campaign = campaign_for_user_or_404(request, name)
    profile = campaign.profiles.filter(pk=pk).first()
    if profile is None:
        raise Http404("No such profile.")
    # One measuring at a time: a second press of the button queues nothing.
    measuring = campaign.profiles.filter(state__in=PROFILE_ACTIVE).order_by("pk").first()
    if measuring is not None:
        messages.error(request, f"Profile {measuring.pk} is still measuring: nothing was queued.")
        return redirect("campaign_profile", name=campaign.name)
    try:
        with start.broker_outage_noted() as outage:
            again = profile_rerun_start(profile=profile)
    except ValueError as exc:
        messages.error(request, f"{exc}: nothing was queued.")
        return redirect("campaign_profile", name=campaign.name)
    if outage:
        messages.warning(request, start.broker_outage_reason(outage))
    else:
        messages.success(
            request,
            f"Profile {again.pk} queued: the sample of profile {profile.pk} again, with its "
            "parameters; the report compares the two when it is done.",
        )
    url = reverse("campaign_profile", args=[campaign.name])
    return redirect(f"{url}?{urlencode({'compare': profile.pk})}")


def _form_number(raw: str, *, parse, default, low, high):
    """A number from a form field: the default when left empty, None when it
    is not a number of that kind within [low, high]."""
    if not raw.strip():
        return default
    try:
        value = parse(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) and low <= value <= high else None


def _margin_percent(raw: str) -> float | None:
    """The form's margin, a percentage of memory kept free."""
    return _form_number(
        raw, parse=float, default=DEFAULT_MARGIN_PERCENT, low=0, high=MAX_MARGIN_PERCENT
    )


def _max_batch(raw: str) -> int | None:
    """The form's largest batch to try, a whole number."""
    return _form_number(raw, parse=int, default=DEFAULT_MAX_BATCH, low=1, high=MAX_PROFILE_BATCH)


@login_required
@require_POST
def campaign_profile_start(request: HttpRequest, name: str) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    margin = _margin_percent(request.POST.get("margin", ""))
    if margin is None:
        messages.error(
            request,
            f"The margin is the share of memory kept free, a percentage from 0 to "
            f"{MAX_MARGIN_PERCENT}: nothing was queued.",
        )
        return redirect("campaign_profile", name=campaign.name)
    max_batch = _max_batch(request.POST.get("max_batch", ""))
    if max_batch is None:
        messages.error(
            request,
            f"The largest batch to try is a whole number from 1 to {MAX_PROFILE_BATCH}: "
            "nothing was queued.",
        )
        return redirect("campaign_profile", name=campaign.name)
    try:
        with start.broker_outage_noted() as outage:
            profile_start(campaign=campaign, margin=margin / 100, max_batch_size=max_batch)
    except ValueError as exc:
        messages.error(request, f"{exc}: nothing was queued.")
        return redirect("campaign_profile", name=campaign.name)
    if outage:
        messages.warning(request, start.broker_outage_reason(outage))
    else:
        messages.success(
            request,
            f"Profile queued: a worker measures the largest batch that keeps {margin:g}% of "
            "memory free on this campaign's heaviest inputs, then estimates the whole corpus.",
        )
    return redirect("campaign_profile", name=campaign.name)
