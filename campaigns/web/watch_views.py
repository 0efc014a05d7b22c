"""Watching a run: the panel with its ETA, stall banner, live workers, charts
and notifications (a fragment the campaign page loads after itself, and a
page of its own), and a project's alerts."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods
from django.views.decorators.vary import vary_on_headers

from campaigns import selectors
from campaigns.models import Project, ProjectAlerts, new_webhook_secret, sees_every_project
from campaigns.runs.leases import BATCH_QUEUE, broker_queue_waiting
from campaigns.watch import notify, state, summary
from campaigns.web.access import campaign_for_user_or_404
from campaigns.web.forms import AlertsForm

#: Notifications listed on the panel, newest first.
NOTIFICATIONS_SHOWN = 10


@login_required
@vary_on_headers("HX-Request")
def campaign_watch(request: HttpRequest, name: str) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    counts = selectors.campaign_counts(campaign=campaign)
    watch = state.campaign_watch(
        campaign=campaign,
        counts=counts,
        broker_check=lambda: broker_queue_waiting(BATCH_QUEUE),
        # The workers are shared: another project's batch is shown unnamed.
        visible=None
        if sees_every_project(request.user)
        else set(selectors.campaigns_for_user(request.user).values_list("pk", flat=True)),
    )
    context = {
        "campaign": campaign,
        "watch": watch,
        "rate_text": summary.rate_text(watch.rate, watch.cost_unit),
        "eta_text": summary.eta_text(watch.eta, left_units=watch.left.units, running=watch.active),
        "fit_text": summary.fit_text(watch.fit, watch.rental, now=watch.now),
        "versions": [
            {
                "label": v.version.label,
                "current": v.version.pk == campaign.current_version_id,
                "left": v.left,
                "rate": summary.rate_text(v.rate, watch.cost_unit),
                "eta": summary.eta_text(v.eta, left_units=v.left.units, running=watch.active),
            }
            for v in watch.versions
        ],
        "charts": state.run_charts(campaign_id=campaign.pk, cost_unit=watch.cost_unit),
        "notifications": campaign.notifications.all()[:NOTIFICATIONS_SHOWN],
        "alerts": notify.alerts_of(campaign.project_id),
    }
    template = "campaigns/watch.html"
    if request.headers.get("HX-Request"):
        template += "#watch-panel"
    return render(request, template, context)


def _project_for_user_or_404(request: HttpRequest, pk: int) -> Project:
    projects = Project.objects.all()
    if not sees_every_project(request.user):
        projects = projects.filter(members=request.user.pk)
    project = projects.filter(pk=pk).first()
    if project is None:
        raise Http404("No such project.")
    return project


@login_required
@require_http_methods(["GET", "POST"])
def project_alerts(request: HttpRequest, pk: int) -> HttpResponse:
    """What the project's members are told about its runs, and where."""
    project = _project_for_user_or_404(request, pk)
    # Saved at the first look, so that the secret shown is the one that signs.
    alerts, _ = ProjectAlerts.objects.get_or_create(project=project)
    if request.method == "POST" and "new_secret" in request.POST:
        alerts.webhook_secret = new_webhook_secret()
        alerts.save()
        return redirect("project_alerts", pk=project.pk)
    form = AlertsForm(request.POST or None, instance=alerts)
    saved = False
    if request.method == "POST" and form.is_valid():
        form.save()
        saved = True
    context = {
        "project": project,
        "form": form,
        "alerts": alerts,
        "saved": saved,
        "campaigns": project.campaigns.order_by("name"),
    }
    return render(request, "campaigns/project_alerts.html", context)
