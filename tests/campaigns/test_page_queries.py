"""The campaign page and its counts poll at scale: few queries, and caches
that follow the state they depend on (bench/pages_scale.py measures the time)."""

from __future__ import annotations

import pytest
from django.urls import reverse
from django.utils import timezone

from campaigns import selectors
from campaigns.models import (
    Batch,
    Campaign,
    Checkpoint,
    Profile,
    Project,
    Reconciliation,
    Unit,
    UnitState,
)
from campaigns.runs import batch_stats
from tests.campaigns.test_views import HTMX_COUNTS, _detail
from tests.conftest import UserFactory


@pytest.fixture
def campaign(make_campaign):
    return make_campaign("texts")


def _finish_batches(campaign, rss_values, *, start=0, allocated=None, workers=("vm:1",)):
    """Finished batches with these RSS figures; with `allocated`, CUDA batches
    (device memory beside the host's RSS, as a CUDA worker records them)."""
    now = timezone.now()
    for i, rss in enumerate(rss_values, start=start):
        cuda = {}
        if allocated is not None:
            cuda = {"mem_allocated": allocated[i - start], "mem_reserved": 2 << 30}
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
            worker=workers[i % len(workers)],
            **cuda,
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


def test_a_cuda_campaigns_chart_is_device_memory_and_warns_on_allocated_creep(
    client, owner, campaign
):
    client.force_login(owner)
    # Host RSS at 3 GiB beside 200 MiB allocated: on one axis the device
    # lines would lie flat at the bottom.
    _finish_batches(campaign, [3 << 30] * 9, allocated=[200 << 20] * 9)
    html = client.get(_detail(campaign)).content.decode()
    caption = html.split("<figcaption>")[1].split("</figcaption>")[0]
    assert ">allocated</span>" in caption and ">reserved</span>" in caption
    assert "RSS" not in caption
    assert "top of chart: 2.0\xa0GB" in caption
    assert 'id="memory-warning"' not in html
    # Allocated memory after a batch rises batch after batch: kept-alive tensors.
    _finish_batches(
        campaign, [3 << 30] * 8, allocated=[(200 + 5 * i) << 20 for i in range(1, 9)], start=9
    )
    html = client.get(_detail(campaign)).content.decode()
    warning = html.split('id="memory-warning">')[1].split("</p>")[0]
    assert warning.startswith("allocated memory after a batch rose")


def test_two_workers_each_get_a_line_and_one_creeping_is_named(client, owner, campaign):
    client.force_login(owner)
    # gpu-b leaks 60 MiB a batch while gpu-a holds 2 GiB steady: interleaved
    # in one line, the figures zigzag and no rise is steady.
    rss = []
    for i in range(24):
        rss.append(2 << 30 if i % 2 == 0 else (500 + 60 * i) << 20)
    _finish_batches(campaign, rss, workers=("gpu-a", "gpu-b"))
    html = client.get(_detail(campaign)).content.decode()
    caption = html.split("<figcaption>")[1].split("</figcaption>")[0]
    assert ">RSS · gpu-a</span>" in caption and ">RSS · gpu-b</span>" in caption
    assert caption.startswith("Memory after each batch, a line a worker: up to its last 12")
    warning = html.split('id="memory-warning">')[1].split("</p>")[0]
    assert "batches on gpu-b" in warning


def test_batches_without_a_finish_time_are_drawn_every_time(client, owner, campaign):
    """No finish time, no cache key: the panels are not kept, so they cannot go stale."""
    client.force_login(owner)
    assert "No batch finished yet." in client.get(_detail(campaign)).content.decode()
    _finish_batches(campaign, [500 << 20])
    Batch.objects.filter(campaign=campaign).update(finished_at=None)
    html = client.get(_detail(campaign)).content.decode()
    assert "No batch finished yet." not in html
    assert '<tr data-policy="original">' in html


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


# --- the page's header -------------------------------------------------------------


def test_the_page_reads_its_header_in_one_query(client, owner, campaign, django_assert_num_queries):
    """The campaign, its project and version, the newest verify and profile, the
    checkpoint with who decided it, the open review count and the panels' key."""
    version = campaign.current_version
    older = Reconciliation.objects.create(campaign=campaign, seconds=1.0, counts={"valid": 1})
    Reconciliation.objects.filter(pk=older.pk).update(
        created_at=timezone.now() - timezone.timedelta(hours=1)
    )
    Reconciliation.objects.create(
        campaign=campaign, seconds=2.5, deep=True, counts={"valid": 30, "output_missing": 9}
    )
    Profile.objects.create(campaign=campaign, version=version, state="failed")
    Profile.objects.create(
        campaign=campaign, version=version, state="done", chosen_batch_size=48, steps=[{}] * 50
    )
    Checkpoint.objects.create(
        campaign=campaign,
        version=version,
        after_units=10,
        state="passed",
        decided_by=owner,
        decided_at=timezone.now(),
    )
    _finish_batches(campaign, [500 << 20] * 2)
    client.force_login(owner)
    client.get(_detail(campaign))  # the session's first use; the panels cached
    # Session, user, the header, counts, the unit page, the failures.
    with django_assert_num_queries(6):
        html = client.get(_detail(campaign)).content.decode()
    assert "Project acme" in html and f"parameters {version.label}" in html
    assert "deep check, 2.50 s" in html and 'data-verdict="output_missing">9<' in html
    assert "Latest profile (done, batch 48)" in html
    assert '<strong data-verification="passed">passed</strong> by owner' in html
    assert "Memory after each of the last 2 batches" in html


# --- the plain SQL lookups ------------------------------------------------------

_SQL_LOOKUPS = {
    "counts poll": selectors.campaign_counts_for_user,
    "page header": selectors.campaign_page_for_user,
    "campaign views": selectors.campaign_for_user,
}


@pytest.mark.parametrize("lookup", _SQL_LOOKUPS.values(), ids=_SQL_LOOKUPS.keys())
def test_each_sql_lookup_follows_the_access_rule_of_campaigns_for_user(
    lookup, owner, outsider, staff, campaign
):
    """The plain SQL repeats campaigns_for_user's rule: members and superusers, no
    one else (order staff included)."""
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    for user in (owner, outsider, staff, root):
        visible = selectors.campaigns_for_user(user).filter(name=campaign.name).exists()
        assert (lookup(user=user, name=campaign.name) is not None) == visible, user
    assert lookup(user=staff, name=campaign.name) is None
    assert lookup(user=root, name=campaign.name) is not None
    assert lookup(user=root, name="no-such-campaign") is None


def test_the_review_queues_campaign_names_follow_campaigns_for_user(
    owner, outsider, staff, make_campaign
):
    """The queue's campaign filter in plain SQL: campaigns_for_user's campaigns
    by name, for each kind of reader (another project's campaign left out)."""
    for name in ("zeta", "alpha", "mid"):
        make_campaign(name)
    other_project = Project.objects.create(name="elsewhere")
    other_project.members.add(outsider)
    Campaign.objects.create(project=other_project, name="not-yours", processor="text-embedding")
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    for user in (owner, outsider, staff, root):
        expected = list(
            selectors.campaigns_for_user(user).values_list("pk", "name").order_by("name")
        )
        assert selectors.campaign_names_for_user(user=user) == expected, user
    assert [n for _, n in selectors.campaign_names_for_user(user=owner)] == ["alpha", "mid", "zeta"]


def test_the_sql_lookups_read_what_the_orm_reads(owner, campaign):
    campaign_id, counts = selectors.campaign_counts_for_user(user=owner, name=campaign.name)
    assert campaign_id == campaign.pk
    assert counts == selectors.campaign_counts(campaign=campaign)

    found = selectors.campaign_for_user(user=owner, name=campaign.name)
    assert (found, found.project, found.current_version) == (
        campaign,
        campaign.project,
        campaign.current_version,
    )
    assert found.current_version.params == campaign.current_version.params

    page = selectors.campaign_page_for_user(user=owner, name=campaign.name)
    assert page.campaign == campaign
    assert page.campaign.current_version == campaign.current_version
    assert (page.reconciliation, page.latest_profile, page.checkpoint) == (None,) * 3
    assert page.open_review_items == 0 and page.newest_finished_batch is None


def test_the_campaign_list_reads_its_campaigns_and_checkpoints_in_one_query(
    client, owner, outsider, staff, make_campaign, django_assert_num_queries
):
    """The list's plain SQL: campaigns_for_user's campaigns in its order, each with
    the checkpoint of its current version (not an older version's) and who decided it."""
    texts, other, third = (make_campaign(n) for n in ("texts", "other", "third"))
    Checkpoint.objects.create(
        campaign=texts,
        version=texts.current_version,
        after_units=3,
        state="passed",
        decided_by=owner,
        decided_at=timezone.now(),
    )
    old = third.current_version
    Checkpoint.objects.create(campaign=third, version=old, after_units=3, state="failed")
    newer = third.versions.create(number=old.number + 1, params=old.params, software=old.software)
    Campaign.objects.filter(pk=third.pk).update(current_version=newer)
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    for user in (owner, outsider, staff, root):
        listed = selectors.campaign_list_for_user(user=user)
        assert [c for c, _ in listed] == list(selectors.campaigns_for_user(user)), user
    listed = selectors.campaign_list_for_user(user=owner)
    by_name = {c.name: (c, ck) for c, ck in listed}
    campaign, checkpoint = by_name["texts"]
    assert (campaign.project.name, campaign.current_version.number) == ("acme", 1)
    assert (checkpoint.state, checkpoint.decided_by.get_username()) == ("passed", "owner")
    assert by_name["other"][1] is None and by_name["third"][1] is None
    assert by_name["third"][0].current_version.number == old.number + 1

    client.force_login(owner)
    client.get(reverse("campaign_list"))  # the session's first use
    # Session, user, the campaigns with their checkpoints, their counts.
    with django_assert_num_queries(4):
        html = client.get(reverse("campaign_list")).content.decode()
    assert '<td data-verification="passed">passed<br><small class="meta" data-verified-by>' in html
    assert html.count('data-verification="not verified"') == 2
