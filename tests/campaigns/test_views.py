from __future__ import annotations

import re
from unittest import mock

import pytest
from django.core.cache import cache
from django.urls import reverse

from campaigns.models import Batch, Unit, UnitState
from campaigns.runs import start
from tests.conftest import UserFactory

HTMX_COUNTS = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "counts"}


@pytest.fixture
def campaign(make_campaign):
    return make_campaign("texts")


def _detail(campaign):
    return reverse("campaign_detail", args=[campaign.name])


def test_pages_need_a_login(client, campaign):
    response = client.get(_detail(campaign))
    assert response.status_code == 302
    assert response.url.startswith(reverse("login"))


def test_a_member_sees_the_campaign_with_its_counts(client, owner, campaign):
    client.force_login(owner)
    response = client.get(_detail(campaign))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-count="pending">39<' in html
    assert 'data-count="succeeded">0<' in html


def test_another_customer_gets_not_found(client, outsider, campaign):
    client.force_login(outsider)
    assert client.get(_detail(campaign)).status_code == 404
    assert campaign.name not in client.get(reverse("campaign_list")).content.decode()


def test_order_staff_get_not_found_on_a_customers_campaign(client, staff, campaign):
    # `is_staff` in the order-staff group: the admin and the verification pages,
    # not the customers' campaigns (portal/staff_group.py)
    client.force_login(staff)
    assert client.get(_detail(campaign)).status_code == 404
    assert campaign.name not in client.get(reverse("campaign_list")).content.decode()
    assert client.get(_detail(campaign), **HTMX_COUNTS).status_code == 404
    assert client.post(reverse("campaign_run", args=[campaign.name])).status_code == 404


def test_a_superuser_sees_every_campaign(client, campaign):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(root)
    assert client.get(_detail(campaign)).status_code == 200
    assert campaign.name in client.get(reverse("campaign_list")).content.decode()


def test_htmx_poll_returns_only_the_counts_fragment_and_stops_when_idle(client, owner, campaign):
    client.force_login(owner)
    response = client.get(_detail(campaign), **HTMX_COUNTS)
    html = response.content.decode()
    assert response.status_code == 286  # htmx: swap these counts, then stop polling
    assert html.lstrip().startswith('<section id="counts"')
    assert "<html" not in html
    assert "hx-trigger" not in html


HTMX_RUN_PANELS = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "run-panels"}


def test_the_run_panels_poll_while_the_campaign_runs_and_stop_when_idle(
    client, owner, outsider, campaign
):
    client.force_login(owner)
    Unit.objects.filter(campaign=campaign).update(state=UnitState.QUEUED)
    running = client.get(_detail(campaign), **HTMX_RUN_PANELS)
    html = running.content.decode()
    assert running.status_code == 200
    assert html.lstrip().startswith('<div id="run-panels"')
    assert "<html" not in html and 'id="counts"' not in html
    assert 'hx-trigger="every 5s"' in html and 'id="batches"' in html
    assert 'id="review-verification"' in html
    # the page itself starts the polling while the campaign runs
    assert 'id="run-panels" data-active="true"' in client.get(_detail(campaign)).content.decode()

    Unit.objects.filter(campaign=campaign).update(state=UnitState.SUCCEEDED)
    idle = client.get(_detail(campaign), **HTMX_RUN_PANELS)
    assert idle.status_code == 286  # swap in the final panels, then stop
    assert "hx-trigger" not in idle.content.decode()

    client.force_login(outsider)
    assert client.get(_detail(campaign), **HTMX_RUN_PANELS).status_code == 404


def test_counts_keep_polling_while_units_are_queued(client, owner, campaign):
    Unit.objects.filter(campaign=campaign).update(state=UnitState.QUEUED)
    client.force_login(owner)
    response = client.get(_detail(campaign), **HTMX_COUNTS)
    assert response.status_code == 200
    assert 'hx-trigger="every 2s"' in response.content.decode()
    assert 'hx-trigger="every 2s"' in client.get(_detail(campaign)).content.decode()


def test_failures_show_their_readable_reason_and_the_state_filter_works(client, owner, campaign):
    Unit.objects.filter(campaign=campaign, uid="bad/empty.txt").update(
        state=UnitState.FAILED, error_class="input_invalid", error_message="empty file"
    )
    client.force_login(owner)
    html = client.get(_detail(campaign), {"state": "failed"}).content.decode()
    assert "empty file" in html
    assert "bad/empty.txt" in html
    assert "news/harbour-reopens.txt" not in html


def test_the_page_lists_the_first_failures_and_links_to_all_of_them(client, owner, campaign):
    failed = list(Unit.objects.filter(campaign=campaign).order_by("pk")[:14])
    for i, unit in enumerate(failed):
        unit.state, unit.error_class = UnitState.FAILED, "input_invalid"
        unit.error_message = f"reason number {i}"
    Unit.objects.bulk_update(failed, ["state", "error_class", "error_message"])
    client.force_login(owner)
    html = client.get(_detail(campaign)).content.decode()
    listed = html.split('class="grid failures"', 1)[1].split("</table>", 1)[0]
    assert listed.count("reason number") == 10
    assert 'href="?state=failed#unit-table" id="all-failures">all 14 failed units<' in html
    table = client.get(_detail(campaign), {"state": "failed"}).content.decode()
    table = table.split('id="units"', 1)[1]
    assert all(f"reason number {i}<" in table for i in range(14))


def test_a_tampered_state_filter_shows_all_units(client, owner, campaign):
    client.force_login(owner)
    response = client.get(_detail(campaign), {"state": "'; DROP TABLE"})
    assert response.status_code == 200
    assert "news/harbour-reopens.txt" in response.content.decode()


def test_run_button_enqueues_the_pending_units(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    client.force_login(owner)
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = client.post(reverse("campaign_run", args=[campaign.name]), follow=True)
    assert response.status_code == 200
    planned = Batch.objects.filter(campaign=campaign).count()
    assert send.call_count == planned >= 1  # a task a batch, the default policy's batches
    assert f"Queued {planned} batch{'es' if planned != 1 else ''}." in response.content.decode()
    assert not Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).exists()


def test_the_run_button_queues_a_large_campaigns_first_slice_and_hands_on_the_rest(
    client, owner, campaign, django_capture_on_commit_callbacks, monkeypatch
):
    monkeypatch.setattr(start, "RUN_SLICE_UNITS", 16)
    type(campaign).objects.filter(pk=campaign.pk).update(checkpoint_after=0)  # past it
    client.force_login(owner)
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        response = client.post(reverse("campaign_run", args=[campaign.name]), follow=True)
    page = response.content.decode()
    assert "Queued 1 batch. The rest of the campaign is being planned in the background." in page
    name, args = send.call_args_list[-1].args[0], send.call_args_list[-1].kwargs["args"]
    assert (name, args[0]) == (start.PLAN_TASK, campaign.pk)
    assert Unit.objects.filter(campaign=campaign, state=UnitState.QUEUED).count() == 16

    # what the portal worker does with it
    from campaigns.tasks import plan_campaign

    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        assert plan_campaign(*args) == 2  # 23 units left, batches of 16
    assert send.call_count == 2
    assert not Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).exists()


def test_pause_stops_the_planning_a_started_campaign_left_to_the_worker(
    client, owner, campaign, django_capture_on_commit_callbacks, monkeypatch
):
    from campaigns.tasks import plan_campaign

    monkeypatch.setattr(start, "RUN_SLICE_UNITS", 16)
    type(campaign).objects.filter(pk=campaign.pk).update(checkpoint_after=0)
    client.force_login(owner)
    with (
        mock.patch.object(start.celery_app, "send_task") as send,
        django_capture_on_commit_callbacks(execute=True),
    ):
        client.post(reverse("campaign_run", args=[campaign.name]))
        client.post(reverse("campaign_pause", args=[campaign.name]))
    args = send.call_args_list[-1].kwargs["args"]
    with mock.patch.object(start.celery_app, "send_task") as send:
        assert plan_campaign(*args) == 0  # the worker gets to it after the Pause
    send.assert_not_called()
    assert Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count() == 39


def test_an_outsider_cannot_run_a_campaign(client, outsider, campaign):
    client.force_login(outsider)
    with mock.patch.object(start.celery_app, "send_task") as send:
        response = client.post(reverse("campaign_run", args=[campaign.name]))
    assert response.status_code == 404
    assert not send.called


def test_campaign_list_shows_progress_from_aggregate_counts(
    client, owner, campaign, django_assert_max_num_queries
):
    Unit.objects.filter(campaign=campaign, uid__startswith="news/").update(
        state=UnitState.SUCCEEDED
    )
    client.force_login(owner)
    with django_assert_max_num_queries(6):  # not one query per unit or per campaign
        html = client.get(reverse("campaign_list")).content.decode()
    assert '<progress max="39" value="6">' in html


def test_verify_button_corrects_states_and_shows_the_report(client, owner, campaign, output_root):
    Unit.objects.filter(campaign=campaign, uid="news/rail-strike.txt").update(
        state=UnitState.SUCCEEDED, output_path="texts/v1-x/00/gone.npy", output_size=10
    )
    client.force_login(owner)
    response = client.post(reverse("campaign_verify", args=[campaign.name]), follow=True)
    html = response.content.decode()
    assert "Verified 39 units: 0 valid, 1 state corrected." in html
    assert 'data-verdict="output_missing">1<' in html
    assert 'data-verdict="pending">38<' in html
    unit = Unit.objects.get(campaign=campaign, uid="news/rail-strike.txt")
    assert unit.state == UnitState.PENDING


def test_an_outsider_cannot_verify_or_export(client, outsider, campaign):
    client.force_login(outsider)
    assert client.post(reverse("campaign_verify", args=[campaign.name])).status_code == 404
    url = reverse("campaign_export", args=[campaign.name, "manifest.csv"])
    assert client.get(url).status_code == 404


def test_inventory_files_download_from_the_page(client, owner, campaign):
    client.force_login(owner)
    html = client.get(_detail(campaign)).content.decode()
    url = reverse("campaign_export", args=[campaign.name, "manifest.csv"])
    assert url in html
    response = client.get(url)
    body = b"".join(response.streaming_content).decode()
    lines = body.splitlines()
    assert lines[0] == "id,source_path,size,sha256,category"
    assert len(lines) == 40
    assert response["Content-Disposition"] == 'attachment; filename="texts-manifest.csv"'
    bad = reverse("campaign_export", args=[campaign.name, "..%2Fsettings.py"])
    assert client.get(bad).status_code == 404


def test_the_unit_page_shows_lineage_from_source_to_attempts(client, owner, campaign):
    from django.utils import timezone

    from campaigns.models import Attempt

    unit = Unit.objects.get(campaign=campaign, uid="bad/empty.txt")
    now = timezone.now()
    Attempt.objects.create(
        unit=unit,
        version=campaign.current_version,
        outcome="failed",
        error_class="input_invalid",
        error_message="empty file",
        worker="gpu-1:42",
        started_at=now,
        finished_at=now,
        duration_ms=3,
        input_sha256="e3b0c442",
    )
    client.force_login(owner)
    html = client.get(_detail(campaign)).content.decode()
    url = reverse("unit_detail", args=[campaign.name, unit.pk])
    assert f'href="{url}"' in html
    page = client.get(url).content.decode()
    assert unit.sha256 in page
    assert "gpu-1:42" in page and "empty file" in page
    assert campaign.current_version.label in page


def test_a_unit_page_says_which_row_of_which_shard_holds_its_vector(client, owner, campaign):
    unit = Unit.objects.get(campaign=campaign, uid="news/rail-strike.txt")
    shard = f"{campaign.name}/v1/shards/0000/b3-<x>.npz"
    Unit.objects.filter(pk=unit.pk).update(
        state=UnitState.SUCCEEDED, output_path=f"{shard}#7", output_size=1536
    )
    client.force_login(owner)
    page = client.get(reverse("unit_detail", args=[campaign.name, unit.pk])).content.decode()
    assert "row 7 of its batch's shard <code>" in page
    assert "b3-&lt;x&gt;.npz</code> (1536 bytes" in page  # escaped like any name


def test_failures_can_be_filtered_by_error_class(client, owner, campaign):
    Unit.objects.filter(campaign=campaign, uid="bad/empty.txt").update(
        state=UnitState.FAILED, error_class="input_invalid", error_message="empty file"
    )
    Unit.objects.filter(campaign=campaign, uid="news/rail-strike.txt").update(
        state=UnitState.FAILED, error_class="processing_error", error_message="boom"
    )
    client.force_login(owner)
    html = client.get(_detail(campaign), {"state": "failed", "error": "processing_error"})
    html = html.content.decode()
    table = html.split('id="units"')[-1]
    assert "news/rail-strike.txt" in table and "bad/empty.txt" not in table
    assert 'data-error="input_invalid"' in html


def _finished_batches(campaign, rows):
    from django.utils import timezone

    from campaigns.models import Batch

    now = timezone.now()
    for i, (policy, items, real, padded, seconds, rss) in enumerate(rows):
        Batch.objects.create(
            campaign=campaign,
            version=campaign.current_version,
            size=items,
            state="done",
            policy=policy,
            real_tokens=real,
            padded_tokens=padded,
            compute_seconds=seconds,
            rss=rss,
            finished_at=now + timezone.timedelta(seconds=i),
        )


def test_the_page_compares_batch_policies_with_real_and_padded_tokens(client, owner, campaign):
    _finished_batches(
        campaign,
        [
            ("original", 16, 1000, 4000, 2.0, 500 << 20),
            ("original", 16, 1000, 4200, 2.0, 500 << 20),
            ("length_grouped", 16, 1000, 1010, 0.5, 500 << 20),
        ],
    )
    client.force_login(owner)
    html = client.get(_detail(campaign)).content.decode()
    original = html.split('data-policy="original"')[1].split("</tr>")[0]
    grouped = html.split('data-policy="length_grouped"')[1].split("</tr>")[0]
    assert "×4.10" in original and "8.0" in original  # 32 items in 4 s
    assert "×1.01" in grouped and "32.0" in grouped
    assert "<svg" in html and "<polyline" in html
    assert 'id="memory-warning"' not in html
    # Its memory axis is labelled from zero to the top (500 MiB here).
    ticks = re.findall(r'<text class="tick"[^>]*>([^<]+)</text>', html.replace("\xa0", " "))
    assert ticks[:5] == ["0 bytes", "125.0 MB", "250.0 MB", "375.0 MB", "500.0 MB"]


def test_an_image_campaign_counts_its_batches_in_pixels(client, owner, campaign):
    # Text: tokens. The same figures for an image processor are pixels.
    _finished_batches(campaign, [("original", 16, 2_304_000, 2_304_000, 2.0, 500 << 20)])
    client.force_login(owner)
    text = client.get(_detail(campaign)).content.decode()
    assert "<th>Real tokens</th>" in text and "<th>Tokens/s</th>" in text
    campaign.processor = "image-classification"
    campaign.save(update_fields=["processor"])
    cache.clear()  # the batch panels are cached until the next batch finishes
    html = client.get(_detail(campaign)).content.decode()
    assert "<th>Real pixels</th>" in html and "<th>Padded pixels</th>" in html
    assert "<th>Pixels/s</th>" in html and "tokens" not in html.split('id="batches"')[1][:2000]
    row = html.split('data-policy="original"')[1].split("</tr>")[0]
    assert "<td>1,152,000</td>" in row  # pixels a second, grouped like the other figures


def test_the_page_lists_the_last_batches_one_by_one_and_every_batch_downloads(
    client, owner, make_campaign, run_here, output_root
):
    import csv
    import io

    from campaigns.models import Batch

    campaign = make_campaign("batches", batch_size=3)
    run_here(campaign)
    batches = Batch.objects.filter(campaign=campaign, state="done")
    assert batches.count() > 10
    client.force_login(owner)
    html = client.get(_detail(campaign)).content.decode()

    # The newest ten, newest first, each with its own figures (a CPU: RSS).
    table = html.split('class="grid recent-batches"')[1].split("</table>")[0]
    newest = list(batches.order_by("-finished_at", "-pk")[:10])
    assert re.findall(r'data-batch="(\d+)"', table) == [str(b.pk) for b in newest]
    heads = re.findall(r"<th>([^<]+)</th>", table)
    assert heads[3:] == [
        "Items",
        "Real tokens",
        "Padded tokens",
        "Padding",
        "Model s",
        "Batch s",
        "RSS",
        "Splits",
    ]
    first = table.split(f'data-batch="{newest[0].pk}">')[1].split("</tr>")[0]
    cells = re.findall(r"<td>([^<]*)</td>", first)
    assert cells[3] == str(newest[0].size)
    assert cells[4] == f"{newest[0].real_tokens:,}" and cells[5] == f"{newest[0].padded_tokens:,}"
    assert float(cells[8]) >= float(cells[7]) > 0  # the batch holds its model's time
    assert re.fullmatch(r"[\d.]+\xa0[MG]B", cells[9])  # the worker's RSS, as a size

    # Every batch, in batches.csv, as the campaign page offers it.
    response = client.get(reverse("campaign_export", args=[campaign.name, "batches.csv"]))
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert [int(r["batch"]) for r in rows] == sorted(b.pk for b in batches)
    assert sum(int(r["real_tokens"]) for r in rows) == sum(b.real_tokens for b in batches)
    assert {r["version"] for r in rows} == {campaign.current_version.label}
    assert all(int(r["rss_bytes"]) > 0 and r["allocated_bytes"] == "" for r in rows)
    assert all(float(r["batch_seconds"]) >= float(r["model_seconds"]) for r in rows)
    # An image classification's predictions table: not a text campaign's.
    assert "predictions.csv" not in html
    predictions = reverse("campaign_export", args=[campaign.name, "predictions.csv"])
    assert client.get(predictions).status_code == 404


def test_on_cuda_the_last_batches_show_allocated_reserved_and_their_peaks(client, owner, campaign):
    from campaigns.models import Batch

    _finished_batches(campaign, [("original", 16, 1000, 4000, 2.0, 500 << 20)])
    Batch.objects.filter(campaign=campaign).update(
        mem_allocated=300 << 20,
        mem_reserved=1 << 30,
        mem_peak_allocated=700 << 20,
        mem_peak_reserved=2 << 30,
    )
    client.force_login(owner)
    table = client.get(_detail(campaign)).content.decode().split("recent-batches")[1]
    table = table.split("</table>")[0]
    assert "<th>Allocated</th><th>Reserved</th><th>Peak allocated</th><th>Peak reserved</th>" in (
        table
    )
    assert "<th>RSS</th>" not in table
    sizes = "<td>300.0 MB</td><td>1.0 GB</td><td>700.0 MB</td><td>2.0 GB</td>"
    assert sizes in table.replace("\xa0", " ")  # filesizeformat's no-break spaces


def test_the_policy_table_follows_each_finished_batch_without_aggregating_every_view(
    client, owner, campaign, django_assert_num_queries
):
    from campaigns.runs import batch_stats

    _finished_batches(campaign, [("original", 16, 1000, 4000, 2.0, 500 << 20)])
    first = batch_stats.policy_comparison(campaign=campaign)
    assert [(r.policy, r.batches) for r in first] == [("original", 1)]
    # Same newest batch: the newest-finish lookup alone, no aggregate.
    with django_assert_num_queries(1):
        assert batch_stats.policy_comparison(campaign=campaign) == first
    _finished_batches(campaign, [("length_grouped", 16, 1000, 1010, 0.5, 500 << 20)] * 2)
    again = batch_stats.policy_comparison(campaign=campaign)
    assert [(r.policy, r.batches) for r in again] == [("length_grouped", 2), ("original", 1)]


def test_a_warming_up_worker_is_not_a_leak(client, owner, campaign):
    # what the demo shows: RSS grows by some MiB over the first batches, then settles
    _finished_batches(
        campaign,
        [("length_grouped", 4, 100, 110, 0.1, (450 + 4 * i) << 20) for i in range(10)],
    )
    client.force_login(owner)
    assert 'id="memory-warning"' not in client.get(_detail(campaign)).content.decode()


def test_memory_that_creeps_up_batch_after_batch_raises_a_warning(client, owner, campaign):
    _finished_batches(
        campaign, [("length_grouped", 16, 1000, 1010, 0.5, (500 + 60 * i) << 20) for i in range(12)]
    )
    client.force_login(owner)
    html = client.get(_detail(campaign)).content.decode()
    assert 'id="memory-warning"' in html
    assert "RSS memory after a batch rose in 7 of the last 7 batches" in html


def test_batches_with_real_tokens_but_no_padded_tokens_show_without_a_padding_figure(
    client, owner, campaign
):
    # given: a processor that reports the tokens it read but pads nothing (as the
    # documented plugin example, tests/plugins/text_stats.py, does)
    _finished_batches(
        campaign, [("original", 16, 1000, None, 2.0, 500 << 20), ("original", 8, 500, None, 1.0, 0)]
    )
    client.force_login(owner)

    # when
    response = client.get(_detail(campaign))

    # then: the page, its policy table and its list of batches, with no padding figure
    assert response.status_code == 200
    html = response.content.decode()
    original = html.split('data-policy="original"')[1].split("</tr>")[0]
    assert "×" not in original and "8.0" in original  # 24 items in 3 s


def test_run_while_the_checkpoint_waits_says_so_instead_of_no_pending_units(
    client, owner, campaign
):
    # given: a checkpoint after 5 units, reached (the holdout ran with them) and
    # waiting for its spot check
    from tests.conftest import waiting_at_checkpoint

    version = waiting_at_checkpoint(campaign).version
    pending = Unit.objects.filter(campaign=campaign, state=UnitState.PENDING).count()
    client.force_login(owner)

    # when
    with mock.patch.object(start.celery_app, "send_task") as send:
        page = client.post(reverse("campaign_run", args=[campaign.name]), follow=True)

    # then: nothing is sent, and the message names the checkpoint and the pending units
    html = page.content.decode()
    assert send.call_count == 0
    assert f"{pending} pending units wait for the checkpoint of v{version.number}" in html
    assert "no pending units" not in html


def test_resume_on_the_page_retries_the_failed_units_of_the_classes_ticked(
    client, owner, campaign, django_capture_on_commit_callbacks
):
    # given: failures of two classes
    units = list(Unit.objects.filter(campaign=campaign, holdout=False).order_by("pk"))
    Unit.objects.filter(pk__in=[u.pk for u in units[:3]]).update(
        state=UnitState.FAILED, error_class="processing_error", error_message="boom"
    )
    Unit.objects.filter(pk__in=[u.pk for u in units[3:5]]).update(
        state=UnitState.FAILED, error_class="out_of_memory", error_message="too big"
    )
    client.force_login(owner)
    page = client.get(_detail(campaign)).content.decode()
    assert 'name="retry" value="processing_error"' in page

    # when: Resume with one class ticked (and a class the campaign has no failure of)
    with (
        mock.patch.object(start.celery_app, "send_task"),
        django_capture_on_commit_callbacks(execute=True),
    ):
        page = client.post(
            reverse("campaign_resume", args=[campaign.name]),
            {"retry": ["processing_error", "input_missing"]},
            follow=True,
        )

    # then: those three run again, the others stay failed with their reason
    assert "3 failed units retried" in page.content.decode()
    assert not Unit.objects.filter(campaign=campaign, error_class="processing_error").exists()
    assert (
        Unit.objects.filter(
            campaign=campaign, state=UnitState.FAILED, error_class="out_of_memory"
        ).count()
        == 2
    )
