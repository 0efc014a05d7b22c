from __future__ import annotations

from pathlib import Path
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_POST
from django.views.decorators.vary import vary_on_headers
from django_htmx.http import HttpResponseStopPolling

from campaigns import selectors
from campaigns.adaptation import services as adaptation
from campaigns.exports import inventory
from campaigns.intake import importing, uploads
from campaigns.models import (
    Campaign,
    ErrorClass,
    UnitState,
)
from campaigns.review import previews, reasons
from campaigns.review import queue as review
from campaigns.runs import batch_stats, control, setup, start
from campaigns.specs import processors as processor_specs
from campaigns.verify import reconcile
from campaigns.watch import state as watch_state
from campaigns.web import setup_records, training_views
from campaigns.web.access import campaign_for_user_or_404
from campaigns.web.forms import CampaignSetupForm, ParametersForm

# The unit table's partial, and its htmx target id; and its rows', which
# redraw by themselves while the campaign runs.
UNIT_TABLE = "unit-table"
UNIT_ROWS = "unit-rows"
TIME = "%Y-%m-%d %H:%M"


@login_required
def campaign_list(request: HttpRequest) -> HttpResponse:
    listed = selectors.campaign_list_for_user(user=request.user)
    counts = selectors.counts_by_campaign(campaign_ids=[c.pk for c, _ in listed])
    rows = [
        (c, counts[c.pk], selectors.run_state(campaign=c, counts=counts[c.pk], checkpoint=ck))
        for c, ck in listed
    ]
    verification = {c.pk: review.verification_of(ck) for c, ck in listed}
    etas = watch_state.list_etas(
        campaigns=[c for c, _ in listed if counts[c.pk].active], counts=counts
    )
    return render(
        request,
        "campaigns/campaign_list.html",
        {"rows": rows, "verification": verification, "etas": etas},
    )


@login_required
@vary_on_headers("HX-Request")
def campaign_detail(request: HttpRequest, name: str) -> HttpResponse:
    if request.htmx and request.htmx.target == "counts":
        return _counts_fragment(request, name)
    if request.htmx and request.htmx.target == "run-panels":
        return _run_panels_fragment(request, name)
    if request.htmx and request.htmx.target in (UNIT_TABLE, UNIT_ROWS):
        return _unit_table_fragment(request, name, request.htmx.target)

    page = _campaign_page(request, name)
    campaign = page.campaign
    context = {
        **_run_panels(page),
        **_unit_table(request, campaign),
        "reconciliation": page.reconciliation,
        "export_files": list(inventory.files_for(campaign)),
        "reject_reasons": reasons.reject_reasons(campaign),
        "latest_profile": page.latest_profile,
        "is_adaptation": adaptation.is_adaptation(campaign),
        "lineage": adaptation.lineage(campaign.current_version)
        if campaign.current_version
        else None,
    }
    context["live"] = context["counts"].active
    return render(request, "campaigns/campaign_detail.html", context)


def _campaign_page(request: HttpRequest, name: str) -> selectors.CampaignPage:
    page = selectors.campaign_page_for_user(user=request.user, name=name)
    if page is None:
        raise Http404("No such campaign.")
    return page


def _run_panels(page: selectors.CampaignPage) -> dict:
    """What a run changes besides the counts: batches, memory, verification."""
    campaign = page.campaign
    counts = selectors.campaign_counts(campaign=campaign)
    return {
        "campaign": campaign,
        "counts": counts,
        "run_state": selectors.run_state(
            campaign=campaign, counts=counts, checkpoint=page.checkpoint
        ),
        "panels": batch_stats.PanelsOnDemand(
            campaign=campaign, newest_finished=page.newest_finished_batch
        ),
        "verification": review.verification_of(page.checkpoint),
        "open_review_items": page.open_review_items,
        "failures": selectors.failure_reasons(campaign=campaign),
        # Read only when the counters show out-of-memory failures.
        "memory_failures": selectors.campaign_memory_failures(
            campaign=campaign, failed=counts.by_error.get(ErrorClass.OUT_OF_MEMORY, 0)
        ),
        "cost_unit": processor_specs.cost_unit(campaign.processor),
    }


def _run_panels_fragment(request: HttpRequest, name: str) -> HttpResponse:
    """The run panels' poll (every 5 s while the campaign runs); the batch
    panels come from the cache until another batch finishes."""
    context = _run_panels(_campaign_page(request, name))
    response = render(request, "campaigns/campaign_detail.html#run-panels", context)
    if not context["counts"].active:
        response.status_code = HttpResponseStopPolling.status_code
    return response


def _unit_table_fragment(request: HttpRequest, name: str, target: str) -> HttpResponse:
    """Filtering and paging swap the table only (no counts panel, no charts);
    its rows' poll (every 5 s while the campaign runs) the rows and pager only,
    so a filter being typed is left alone."""
    campaign = campaign_for_user_or_404(request, name)
    live = selectors.campaign_counts(campaign=campaign).active
    context = {"campaign": campaign, "live": live, **_unit_table(request, campaign)}
    response = render(request, f"campaigns/campaign_detail.html#{target}", context)
    if target == UNIT_ROWS and not live:
        response.status_code = HttpResponseStopPolling.status_code
    return response


def _counts_fragment(request: HttpRequest, name: str) -> HttpResponse:
    """The counts poll: the access check and the counts in one query, as the
    page polls every 2 s for as long as a campaign runs."""
    found = selectors.campaign_counts_for_user(user=request.user, name=name)
    if found is None:
        raise Http404("No such campaign.")
    campaign_id, counts = found
    # The partial needs the name only (its links): no need to load the campaign.
    context = {
        "campaign": Campaign(pk=campaign_id, name=name),
        "counts": counts,
        "run_state": selectors.campaign_run_state(campaign_id=campaign_id, counts=counts),
    }
    # The header's label too, out of band: the run ending at the checkpoint
    # (or a Pause) changes it with the counts.
    response = HttpResponse(
        render_to_string("campaigns/campaign_detail.html#counts", context, request)
        + render_to_string(
            "campaigns/campaign_detail.html#run-state", {**context, "oob": True}, request
        )
    )
    if not counts.active:
        # 286: htmx swaps in these final counts and stops polling.
        response.status_code = HttpResponseStopPolling.status_code
    return response


def _cursor(raw: str) -> int | None:
    return int(raw) if raw.isdigit() and len(raw) < 19 else None


def _unit_table(request: HttpRequest, campaign: Campaign) -> dict:
    """The unit table's context: one keyset page and the links around it."""
    unit_filter = selectors.UnitFilter.parse(request.GET)
    after = _cursor(request.GET.get("after", ""))
    before = _cursor(request.GET.get("before", ""))
    page = selectors.unit_page(
        campaign=campaign, unit_filter=unit_filter, after=after, before=before
    )
    base = reverse("campaign_detail", args=[campaign.name])

    def url(**params) -> str:
        query = urlencode({k: v for k, v in params.items() if v not in ("", None)})
        return f"{base}?{query}" if query else base

    # <campaign>/units/<pk>/: one reverse() for the page rather than one a row.
    unit_url = reverse("unit_detail", args=[campaign.name, 0]).removesuffix("0/")
    kept = unit_filter.params()
    others = {k: v for k, v in kept.items() if k not in ("state", "error")}
    here = timezone.get_current_timezone()  # once, not a lookup a row
    return {
        # The time preformatted: the date filter is the page's dearest cell.
        # Flat tuples in cell order, for the `unit_rows` tag.
        "unit_rows": [
            (
                f"{unit_url}{row.pk}/",
                row.uid,
                row.state,
                row.error_class,
                row.error_message,
                row.output_path,
                row.updated_at.astimezone(here).strftime(TIME),
            )
            for row in page.rows
        ],
        "unit_filter": unit_filter,
        "states": UnitState.choices,
        "error_classes": ErrorClass.choices,
        "state_links": [
            (value, label, url(**others, state=value)) for value, label in UnitState.choices
        ],
        "all_states_url": url(**others),
        "next_url": url(**kept, after=page.next_after) if page.next_after else "",
        "previous_url": url(**kept, before=page.previous_before) if page.previous_before else "",
        "first_url": url(**kept) if "after" in request.GET or "before" in request.GET else "",
        # This very page again, for the rows' poll.
        "this_url": url(**kept, after=after, before=before),
    }


@login_required
@require_POST
def campaign_verify(request: HttpRequest, name: str) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    report = reconcile.campaign_verify(campaign=campaign, deep=request.POST.get("deep") == "1")
    messages.info(
        request,
        f"Verified {report.total} units: {report.counts['valid']} valid, "
        f"{report.corrected} state{'s' if report.corrected != 1 else ''} corrected.",
    )
    return redirect(f"{reverse('campaign_detail', args=[campaign.name])}#verify")


@login_required
def campaign_export(request: HttpRequest, name: str, filename: str) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    generate = inventory.files_for(campaign).get(filename)
    if generate is None:
        raise Http404("No such export file.")
    if filename in inventory.PROCESSOR_FILES.get(campaign.processor, {}):
        inventory.mark_exported(campaign)  # a classifier's predictions: its outputs
    response = StreamingHttpResponse(
        generate(campaign), content_type=inventory.CONTENT_TYPES[Path(filename).suffix]
    )
    response["Content-Disposition"] = f'attachment; filename="{campaign.name}-{filename}"'
    return response


@login_required
def unit_detail(request: HttpRequest, name: str, pk: int) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    found = selectors.unit_lineage(campaign=campaign, pk=pk)
    if found is None:
        raise Http404("No such unit.")
    unit, attempts = found
    # The attempt whose output the unit holds now, else its last (a failure says why).
    shown = next(
        (a for a in reversed(attempts) if unit.output_path and a.output_path == unit.output_path),
        attempts[-1] if attempts else None,
    )
    version = shown.version if shown else campaign.current_version
    params = version.params if version else {}
    context = {
        "campaign": campaign,
        "unit": unit,
        "attempts": attempts,
        "input": previews.input_preview(unit=unit, campaign=campaign, params=params),
        "output": previews.output_summary(
            unit=unit, attempt=shown, campaign=campaign, params=params
        ),
        "memory_failure": selectors.unit_memory_failure(
            campaign=campaign, unit=unit, attempt=attempts[-1]
        )
        if attempts and attempts[-1].error_class == ErrorClass.OUT_OF_MEMORY
        else None,
    }
    return render(request, "campaigns/unit_detail.html", context)


# A large campaign's first slice is queued in the request, the rest by a worker.
_PLANNING_ON = " The rest of the campaign is being planned in the background."


@login_required
@require_POST
def campaign_run(request: HttpRequest, name: str) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    if adaptation.is_adaptation(campaign):
        # Its run is a training, with its own page.
        return training_views.training_start(request, name)
    try:
        with start.broker_outage_noted() as outage:
            batches, more = start.campaign_start(campaign=campaign)
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        if outage:
            messages.warning(request, start.broker_outage_reason(outage))
        elif batches:
            messages.success(
                request,
                f"Queued {batches} batch{'es' if batches != 1 else ''}."
                + (_PLANNING_ON if more else ""),
            )
        else:
            messages.info(request, start.nothing_queued_reason(campaign=campaign))
    return redirect("campaign_detail", name=campaign.name)


@csrf_exempt
@login_required
def campaign_new(request: HttpRequest) -> HttpResponse:
    """Set up a campaign: inputs, processor, parameters; preview; then create and start."""
    # Installed before anything reads request.POST, so that a manifest over the
    # cap is stopped as it arrives rather than spooled whole to disk first. The
    # CSRF middleware would read POST before this view; hence exempt here and
    # checked by _campaign_new (Django's "Modifying upload handlers on the fly").
    cap = uploads.CappedUploadHandler(request, max_bytes=settings.MANIFEST_UPLOAD_MAX_BYTES)
    request.upload_handlers.insert(0, cap)
    return _campaign_new(request, refused_uploads=cap.refused)


@csrf_protect
def _campaign_new(request: HttpRequest, *, refused_uploads: set[str]) -> HttpResponse:
    processor = request.POST.get("processor") or request.GET.get("processor")
    if request.method != "POST":
        form = CampaignSetupForm(
            processor=processor, user=request.user, source=request.GET.get("source")
        )
        if request.htmx and request.htmx.target == "params":
            # The parameters, and the inputs' choice out of band: records only
            # for a processor that takes text.
            return render(request, "campaigns/campaign_new_params.html", {"form": form})
        return render(request, "campaigns/campaign_new.html", {"form": form})
    form = CampaignSetupForm(
        request.POST,
        request.FILES,
        processor=processor,
        refused_uploads=refused_uploads,
        user=request.user,
    )
    if not form.is_valid():
        return render(request, "campaigns/campaign_new.html", {"form": form}, status=400)
    data = form.cleaned_data
    records = form.uses_records()
    # A manifest kept from a folder's preview is no part of a record campaign.
    token = "" if records else request.POST.get("manifest_token", "")
    if data["manifest"] and not records:
        manifest = uploads.manifest_store(upload=data["manifest"])
    elif token:
        # Uploaded with the preview; a browser does not send a file twice.
        manifest = uploads.manifest_for_token(token)
        if manifest is None:
            # Going on without it would import the whole folder instead.
            form.add_error(
                "manifest",
                "the manifest uploaded with the preview is no longer kept "
                "(a day after its last use); choose it again",
            )
            return render(request, "campaigns/campaign_new.html", {"form": form}, status=400)
    else:
        manifest = None
    if form.params_reset:
        # The template says the parameters were reset; the user checks them first.
        return render(
            request,
            "campaigns/campaign_new.html",
            {"form": form, "manifest_token": manifest.name if manifest else ""},
        )
    if request.POST.get("action") != "create":
        spec = form.spec
        result = importing.preview(
            root=data["folder"],
            manifest=manifest,
            check_input=spec.check_input,
            params=data["params"],
            folder_categories=not data["no_folder_categories"],
            limits=spec.input_limits(data["params"]) if spec else None,
            records=(data["record_files"], data["columns"]) if records else None,
            count=setup_records.PREVIEW_COUNT if records else None,
        )
        return render(
            request,
            "campaigns/campaign_new.html",
            {"form": form, "preview": result, "manifest_token": manifest.name if manifest else ""},
        )
    try:
        campaign, report = setup.campaign_create(
            name=data["name"],
            processor=data["processor"],
            project=data["project"],
            input_folder=None if manifest or records else data["folder"],
            manifest=manifest,
            input_root=data["folder"] if manifest else None,
            records=data["records"] if records else None,
            columns=data["columns"] if records else None,
            params=data["params"],
            checkpoint_after=data["checkpoint_after"],
            holdout_share=data["holdout_share"],
            folder_categories=not data["no_folder_categories"],
            # The folder checked again where the campaign is made (the form's
            # check and this one are the same rule: project_folders).
            user=request.user,
        )
    except (ValidationError, importing.ManifestError, OSError, EOFError) as exc:
        # A record file's later part refused by the import (a file of an
        # Arrow folder without the column): said on the records field.
        form.add_error(
            "records" if records else None, "; ".join(getattr(exc, "messages", [str(exc)]))
        )
        return render(request, "campaigns/campaign_new.html", {"form": form}, status=400)
    if adaptation.is_adaptation(campaign):
        # Its run is a training, started and followed on its own page.
        messages.success(
            request,
            f"Created {campaign.name}: {report.created} examples "
            f"({report.failed} failed at import).",
        )
        _say_report(request, report)
        return training_views.training_start(request, campaign.name)
    with start.broker_outage_noted() as outage:
        batches, more = start.campaign_start(campaign=campaign)
    messages.success(
        request,
        f"Created {campaign.name}: {report.created} units ({report.failed} failed at import), "
        f"{batches} batch{'es' if batches != 1 else ''} queued."
        + (_PLANNING_ON if more and not outage else ""),
    )
    if outage:
        messages.warning(request, start.broker_outage_reason(outage))
    _say_report(request, report)
    return redirect("campaign_detail", name=campaign.name)


def _say_report(request: HttpRequest, report: importing.ImportReport) -> None:
    if identical := report.identical_summary():
        messages.info(request, identical)
    if skipped := report.skipped_lines(shown=5):
        messages.warning(request, " ".join(skipped))


@login_required
@require_POST
def campaign_pause(request: HttpRequest, name: str) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    units = control.campaign_pause(campaign=campaign)
    messages.info(request, f"Paused: {units} queued units taken back; running batches finish.")
    return redirect("campaign_detail", name=campaign.name)


@login_required
@require_POST
def campaign_resume(request: HttpRequest, name: str) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    if adaptation.is_adaptation(campaign):
        return training_views.training_start(request, name)
    # Only classes the campaign has failures of: a tampered value retries nothing.
    failing = selectors.campaign_counts(campaign=campaign).by_error
    classes = [c for c in request.POST.getlist("retry") if c in failing]
    try:
        with start.broker_outage_noted() as outage:
            report, retried, batches = control.campaign_resume(
                campaign=campaign, retry_failed=classes
            )
    except ValidationError as exc:  # a failed checkpoint holds the campaign where it is
        messages.error(request, "Nothing resumed: " + "; ".join(exc.messages))
        return redirect("campaign_detail", name=campaign.name)
    if outage:
        messages.warning(request, start.broker_outage_reason(outage))
    messages.info(
        request,
        f"Resumed: verify found {report.counts['valid']} valid outputs; "
        + (f"{retried} failed unit{'s' if retried != 1 else ''} retried; " if classes else "")
        + f"{batches} batch{'es' if batches != 1 else ''} queued.",
    )
    return redirect("campaign_detail", name=campaign.name)


@login_required
def campaign_params(request: HttpRequest, name: str) -> HttpResponse:
    campaign = campaign_for_user_or_404(request, name)
    ran = campaign.batches.filter(version=campaign.current_version).exists()
    form = ParametersForm(request.POST or None, campaign=campaign)
    if request.method == "POST" and form.is_valid():
        before = campaign.current_version
        version = setup.version_create(campaign=campaign, params=form.cleaned_data["params"])
        if version.pk == before.pk:
            messages.info(request, f"Nothing changed: the parameters are those of {version.label}.")
        else:
            messages.success(
                request,
                f"New parameter version {version.label}: the next run processes "
                "every unit under it, through its own checkpoint; its outputs go to "
                "their own folder and the earlier version's stay.",
            )
        return redirect("campaign_detail", name=campaign.name)
    return render(
        request,
        "campaigns/campaign_params.html",
        {"campaign": campaign, "form": form, "ran": ran},
        status=400 if request.method == "POST" else 200,
    )
