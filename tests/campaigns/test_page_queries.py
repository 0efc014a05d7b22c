"""The campaign page and its counts poll at scale: few queries, and caches
that follow the state they depend on (bench/pages_scale.py measures the time)."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from campaigns import batch_stats, selectors
from campaigns.models import Batch, Campaign, Unit, UnitState
from tests.campaigns.test_views import HTMX_COUNTS, _detail


@pytest.fixture
def campaign(make_campaign):
    return make_campaign("texts")


def _finish_batches(campaign, rss_values, *, start=0):
    now = timezone.now()
    for i, rss in enumerate(rss_values, start=start):
        Batch.objects.create(
            campaign=campaign,
            version=campaign.current_version,
            size=16,
            state="done",
            policy="original",
            real_tokens=1000,
            padded_tokens=1200,
            compute_seconds=1.0,
            rss=rss,
            finished_at=now + timezone.timedelta(seconds=i),
        )


# --- the counts poll -------------------------------------------------------------


def test_the_counts_poll_checks_access_and_counts_in_one_query(
    client, owner, campaign, django_assert_num_queries
):
    Unit.objects.filter(campaign=campaign).update(state=UnitState.QUEUED)
    client.force_login(owner)
    client.get(_detail(campaign), **HTMX_COUNTS)  # the session's first use
    # The session, the user, then the campaign and its counts together.
    with django_assert_num_queries(3):
        response = client.get(_detail(campaign), **HTMX_COUNTS)
    assert response.status_code == 200
    html = response.content.decode()
    assert 'data-count="queued">39<' in html
    assert f'hx-get="{_detail(campaign)}"' in html


def test_the_counts_poll_is_not_found_for_an_outsider_or_an_unknown_name(
    client, outsider, owner, campaign
):
    client.force_login(outsider)
    assert client.get(_detail(campaign), **HTMX_COUNTS).status_code == 404
    client.force_login(owner)
    missing = reverse("campaign_detail", args=["no-such-campaign"])
    assert client.get(missing, **HTMX_COUNTS).status_code == 404


def test_counts_for_user_follows_the_access_rule_of_campaigns_for_user(
    owner, outsider, staff, campaign
):
    """The poll's SQL repeats campaigns_for_user's rule: members and staff, no one else."""
    for user in (owner, outsider, staff):
        visible = selectors.campaigns_for_user(user).filter(name=campaign.name).exists()
        found = selectors.campaign_counts_for_user(user=user, name=campaign.name)
        assert (found is not None) == visible, user
        if found is not None:
            campaign_id, counts = found
            assert campaign_id == campaign.pk
            assert counts == selectors.campaign_counts(campaign=campaign)
    assert selectors.campaign_counts_for_user(user=staff, name="no-such-campaign") is None


def test_a_campaign_without_units_polls_zero_counts_and_stops(client, owner, project):
    empty = Campaign.objects.create(
        project=project, name="empty", processor="text-embedding", input_root="/nowhere"
    )
    found = selectors.campaign_counts_for_user(user=owner, name="empty")
    assert found == (empty.pk, selectors.Counts())
    client.force_login(owner)
    response = client.get(_detail(empty), **HTMX_COUNTS)
    assert response.status_code == 286
    assert 'data-count="total">0<' in response.content.decode()


# --- the batch panels ------------------------------------------------------------


def test_the_batch_panels_are_read_once_per_finished_batch(campaign, django_assert_num_queries):
    _finish_batches(campaign, [500 << 20] * 3)
    first = batch_stats.batch_panels(campaign=campaign)
    assert first.memory_chart is not None and first.memory_chart.batches == 3
    # Same newest batch: the newest-finish lookup alone, no chart, no aggregate.
    with django_assert_num_queries(1):
        again = batch_stats.batch_panels(campaign=campaign)
    assert again.memory_chart.lines == first.memory_chart.lines
    assert again.policies == first.policies


def test_the_memory_chart_and_its_warning_follow_each_finished_batch(client, owner, campaign):
    client.force_login(owner)
    _finish_batches(campaign, [500 << 20] * 9)
    html = client.get(_detail(campaign)).content.decode()
    assert "Memory after each of the last 9 batches" in html
    assert 'id="memory-warning"' not in html
    # Memory creeps up from now on: the cached panels must not hide it.
    _finish_batches(campaign, [(600 + 60 * i) << 20 for i in range(8)], start=9)
    html = client.get(_detail(campaign)).content.decode()
    assert "Memory after each of the last 17 batches" in html
    assert 'id="memory-warning"' in html


# --- the unit table --------------------------------------------------------------


def test_the_unit_table_rows_show_each_units_fields(client, owner, campaign):
    unit = Unit.objects.filter(campaign=campaign).order_by("pk").first()
    Unit.objects.filter(pk=unit.pk).update(
        state=UnitState.FAILED, error_class="input_invalid", error_message="empty file"
    )
    client.force_login(owner)
    html = client.get(_detail(campaign)).content.decode()
    row = html.split(f'href="{_detail(campaign)}units/{unit.pk}/"')[1].split("</tr>")[0]
    assert f">{unit.uid}</a>" in row
    assert "<td>failed</td><td>input_invalid</td><td>empty file</td><td>—</td>" in row
