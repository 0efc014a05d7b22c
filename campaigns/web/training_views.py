"""An adaptation campaign's training page: state, curves, checkpoints, and their use."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST
from django_htmx.http import HttpResponseStopPolling

from campaigns import selectors
from campaigns.adaptation import charts as training_charts
from campaigns.adaptation import services as adaptation
from campaigns.models import Campaign, ModelCheckpoint, Training
from campaigns.runs import start

# What a checkpoint of each kind can become the model of.
TARGET_PROCESSOR = {"text-adaptation": "text-embedding", "image-adaptation": "image-classification"}


def _adaptation_campaign(request: HttpRequest, name: str) -> Campaign:
    campaign = selectors.campaign_for_user(user=request.user, name=name)
    if campaign is None or not adaptation.is_adaptation(campaign):
        raise Http404("No such adaptation campaign.")
    return campaign


@login_required
def training_page(request: HttpRequest, name: str) -> HttpResponse:
    campaign = _adaptation_campaign(request, name)
    training = (
        Training.objects.filter(version=campaign.current_version).first()
        or Training.objects.filter(campaign=campaign).first()
    )
    live = training is not None and training.state in adaptation.LIVE
    context = {
        "campaign": campaign,
        "training": training,
        "live": live,
        "checkpoints": list(training.checkpoints.all()) if training else [],
        "loss_chart": training_charts.loss_chart(training) if training else None,
        "metric_chart": training_charts.metric_chart(training) if training else None,
        "targets": selectors.campaigns_for_user(request.user).filter(
            processor=TARGET_PROCESSOR[campaign.processor]
        ),
    }
    if request.htmx and request.htmx.target == "training":
        response = render(request, "campaigns/training.html#training", context)
        if not live:
            response.status_code = HttpResponseStopPolling.status_code
        return response
    return render(request, "campaigns/training.html", context)


@login_required
@require_POST
def training_start(request: HttpRequest, name: str) -> HttpResponse:
    campaign = _adaptation_campaign(request, name)
    try:
        with start.broker_outage_noted() as outage:
            training = adaptation.training_start(campaign=campaign)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        if outage:
            messages.warning(request, start.broker_outage_reason(outage))
        else:
            messages.success(request, f"Training {training.get_state_display().lower()}.")
    return redirect("training_page", campaign.name)


@login_required
@require_POST
def training_stop(request: HttpRequest, name: str) -> HttpResponse:
    campaign = _adaptation_campaign(request, name)
    training = Training.objects.filter(campaign=campaign, state__in=adaptation.LIVE).first()
    if training is not None:
        adaptation.training_stop(training=training)
        messages.success(request, "The training stops after its current step, with a checkpoint.")
    return redirect("training_page", campaign.name)


@login_required
@require_POST
def checkpoint_use(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    campaign = _adaptation_campaign(request, name)
    checkpoint = ModelCheckpoint.objects.filter(training__campaign=campaign, pk=pk).first()
    # Only the user's own campaigns of the matching kind: a tampered field finds nothing.
    target = (
        selectors.campaigns_for_user(request.user)
        .filter(name=request.POST.get("target", ""), processor=TARGET_PROCESSOR[campaign.processor])
        .first()
    )
    if checkpoint is None or target is None:
        messages.error(request, "Choose one of your campaigns of the matching kind.")
        return redirect("training_page", campaign.name)
    try:
        version = adaptation.checkpoint_use(checkpoint=checkpoint, target=target)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("training_page", campaign.name)
    messages.success(
        request,
        f"Version {version.number} of {target.name} uses step {checkpoint.step} of "
        f"{campaign.name}; "
        "run it to compute its outputs.",
    )
    return redirect("campaign_detail", target.name)
