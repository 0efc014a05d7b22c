"""A campaign's parameter versions: how much of the corpus each has made,
its matrix and tables to download, and two versions compared."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, StreamingHttpResponse
from django.shortcuts import render
from django.views.decorators.vary import vary_on_headers

from campaigns.exports import completions, inventory, matrices, tables
from campaigns.exports.csv_stream import stream_csv
from campaigns.exports.predictions import predictions_csv
from campaigns.models import Campaign, ParameterVersion
from campaigns.review.compare import compare_versions
from campaigns.runs import versions
from campaigns.web.access import campaign_for_user_or_404

#: Units the page compares at most (a sample spread over the corpus beyond):
#: 200,000 units take ~31 s on 2 cores, 20,000 about 3 s, within a request
#: (bench/RESULTS.md, "Parameter versions at scale — `bench/versions_scale.py`").
PAGE_COMPARE_UNITS = 20_000

#: What a version offers for download, by the kind of matrix its outputs form.
DOWNLOADS = {
    "vectors": ("vectors.npy", "rows.csv", "vectors.parquet"),
    "features": ("features.npy", "rows.csv", "predictions.csv", "predictions.parquet"),
    None: (),
}


def downloads_of(campaign: Campaign) -> tuple[str, ...]:
    """The files each version of this campaign offers."""
    if campaign.processor == completions.GENERATION:
        return completions.DOWNLOADS
    return DOWNLOADS[matrices.kind_of(campaign)]


@login_required
@vary_on_headers("HX-Request")
def campaign_versions(request: HttpRequest, name: str) -> HttpResponse:
    """The versions table (a fragment the campaign page loads after itself,
    or a page of its own), and with ?a=&b= their comparison."""
    campaign = campaign_for_user_or_404(request, name)
    context = _versions_context(campaign)
    a, b = request.GET.get("a"), request.GET.get("b")
    if a and b:
        first, second = _version(campaign, a), _version(campaign, b)
        context["comparison"] = compare_versions(
            campaign=campaign, a=first, b=second, at_most=PAGE_COMPARE_UNITS
        )
    template = "campaigns/versions.html"
    if request.headers.get("HX-Request"):
        template += "#versions-panel"
    return render(request, template, context)


def _versions_context(campaign: Campaign) -> dict[str, Any]:
    progress = versions.version_progress(campaign=campaign)
    numbers = [p.version.number for p in progress]
    return {
        "campaign": campaign,
        "progress": progress,
        "downloads": downloads_of(campaign),
        "completion_table": campaign.processor == completions.GENERATION,
        # The default comparison: the current version against the one before it.
        "compare_a": numbers[1] if len(numbers) > 1 else None,
        "compare_b": numbers[0] if numbers else None,
    }


def _version(campaign: Campaign, label: str) -> ParameterVersion:
    version = versions.version_by_label(campaign=campaign, label=label)
    if version is None:
        raise Http404("No such parameter version.")
    return version


@login_required
def version_download(
    request: HttpRequest, name: str, number: int, filename: str
) -> StreamingHttpResponse:
    """One version's matrix (.npy, streamed), its rows named (.csv), a
    classifier's predictions (.csv), or its outputs as a table (.parquet,
    streamed a row group at a time)."""
    campaign = campaign_for_user_or_404(request, name)
    version = _version(campaign, str(number))
    if filename not in downloads_of(campaign):
        raise Http404("No such download for this campaign.")
    if filename != "rows.csv" and version.pk == campaign.current_version_id:
        inventory.mark_exported(campaign)  # the current outputs, not only their names
    if filename == "completions.jsonl":
        if not versions.outputs_count(campaign=campaign, version=version):
            raise Http404(f"{version.label} has no readable output yet.")
        response = StreamingHttpResponse(
            completions.completions_jsonl(campaign, version), content_type="application/jsonl"
        )
        response["Content-Disposition"] = (
            f'attachment; filename="{campaign.name}-completions-{version.label}.jsonl"'
        )
        return response
    if filename.endswith(".npy"):
        matrix = matrices.matrix_stream(campaign=campaign, version=version)
        if matrix is None:
            raise Http404(f"{version.label} has no readable output yet.")
        response = StreamingHttpResponse(matrix.body, content_type="application/octet-stream")
        response["Content-Disposition"] = f'attachment; filename="{matrix.filename}"'
        response["X-Matrix-Shape"] = f"{matrix.rows},{matrix.dimension}"
        return response
    if filename.endswith(".parquet"):
        table = (
            completions.completions_parquet(campaign, version)
            if filename == "completions.parquet"
            else tables.table_stream(campaign=campaign, version=version)
        )
        if table is None:
            raise Http404(f"{version.label} has no readable output yet.")
        response = StreamingHttpResponse(table.body, content_type="application/vnd.apache.parquet")
        response["Content-Disposition"] = f'attachment; filename="{table.filename}"'
        return response
    if filename == "predictions.csv":
        body = predictions_csv(campaign, version)
    else:
        header = ["row", "id", "source_path", "category", "output_path"]
        body = stream_csv(header, matrices.row_names(campaign=campaign, version=version))
    response = StreamingHttpResponse(body, content_type="text/csv")
    stem = filename.removesuffix(".csv")
    response["Content-Disposition"] = (
        f'attachment; filename="{campaign.name}-{stem}-{version.label}.csv"'
    )
    return response
