"""The campaign page's unit table: keyset pages, filters that combine, an htmx partial."""

from __future__ import annotations

import html
import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from campaigns import selectors
from campaigns.models import Campaign, ErrorClass, Unit, UnitState

TABLE = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "unit-table"}
PAGE = selectors.UNIT_PAGE_SIZE


@pytest.fixture
def campaign(project) -> Campaign:
    """130 units: every third failed (two error classes), two categories, two id prefixes."""
    campaign = Campaign.objects.create(
        project=project, name="big", processor="text-embedding", input_root="/nowhere"
    )
    units = []
    for i in range(130):
        failed = i % 3 == 0
        units.append(
            Unit(
                campaign=campaign,
                uid=f"{'news' if i % 2 else 'recipes'}/{i:04d}.txt",
                source_path=f"{i}.txt",
                category="news" if i % 2 else "recipes",
                state=UnitState.FAILED if failed else UnitState.SUCCEEDED,
                error_class=(ErrorClass.INPUT_INVALID if i % 6 == 0 else ErrorClass.TIMEOUT)
                if failed
                else "",
            )
        )
    Unit.objects.bulk_create(units)
    return campaign


def _url(campaign: Campaign) -> str:
    return reverse("campaign_detail", args=[campaign.name])


def _uids(page: str) -> list[str]:
    table = page.split('id="units"', 1)[1].split("</table>", 1)[0]
    return re.findall(r'/units/\d+/">([^<]+)</a>', table)


def _link(page: str, rel: str) -> str | None:
    found = re.search(rf'<a href="([^"]+)" hx-get="[^"]+" rel="{rel}"', page)
    return html.unescape(found.group(1)) if found else None


def _walk(client, url: str, **extra) -> list[list[str]]:
    pages = []
    while url:
        page = client.get(url, **extra).content.decode()
        pages.append(_uids(page))
        url = _link(page, "next")
        assert len(pages) < 10, "the next links never end"
    return pages


def test_next_pages_continue_where_the_last_stopped_without_duplicates(client, owner, campaign):
    client.force_login(owner)
    pages = _walk(client, _url(campaign))
    assert [len(p) for p in pages] == [PAGE, PAGE, 130 - 2 * PAGE]
    shown = [uid for page in pages for uid in page]
    in_import_order = list(Unit.objects.filter(campaign=campaign).order_by("pk").values_list("uid"))
    assert shown == [uid for (uid,) in in_import_order]


def test_previous_goes_back_to_the_page_before(client, owner, campaign):
    client.force_login(owner)
    first = client.get(_url(campaign)).content.decode()
    assert _link(first, "prev") is None and _link(first, "first") is None
    second = client.get(_link(first, "next")).content.decode()
    back = client.get(_link(second, "prev")).content.decode()
    assert _uids(back) == _uids(first)
    assert _link(back, "prev") is None  # nothing before the first page
    assert _link(back, "next") == _link(first, "next")
    assert _link(second, "first") == _url(campaign)


def test_filters_combine_and_the_pages_keep_them(client, owner, campaign):
    client.force_login(owner)
    url = f"{_url(campaign)}?state=failed&error=timeout&category=news"
    pages = _walk(client, url)
    shown = [uid for page in pages for uid in page]
    expected = Unit.objects.filter(
        campaign=campaign, state="failed", error_class="timeout", category="news"
    ).order_by("pk")
    assert shown == list(expected.values_list("uid", flat=True))
    assert 0 < len(shown) < 130

    with_prefix = client.get(url + "&q=news/001").content.decode()
    assert _uids(with_prefix) == [u for u in shown if u.startswith("news/001")]


def test_a_long_filtered_list_pages_with_its_filter(client, owner, campaign):
    client.force_login(owner)
    pages = _walk(client, f"{_url(campaign)}?state=succeeded")
    assert [len(p) for p in pages] == [PAGE, 86 - PAGE]
    assert all(
        Unit.objects.get(campaign=campaign, uid=uid).state == "succeeded"
        for page in pages
        for uid in page
    )


def test_the_id_prefix_search_finds_units_by_the_start_of_their_id(client, owner, campaign):
    client.force_login(owner)
    page = client.get(_url(campaign), {"q": "recipes/00"}).content.decode()
    assert _uids(page) == [f"recipes/{i:04d}.txt" for i in range(0, 100, 2)]
    assert _link(page, "next") is None


def test_tampered_filters_and_cursors_show_the_first_page(client, owner, campaign):
    client.force_login(owner)
    response = client.get(
        _url(campaign), {"state": "'; DROP TABLE", "error": "nope", "after": "-1", "before": "x"}
    )
    assert response.status_code == 200
    assert len(_uids(response.content.decode())) == PAGE


def test_htmx_swaps_only_the_table_without_reading_the_counts(client, owner, campaign):
    client.force_login(owner)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(_url(campaign), {"state": "failed"}, **TABLE)
    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<section id="unit-table"')
    assert "<html" not in page and 'id="counts"' not in page
    assert len(_uids(page)) == 44
    assert response["Vary"].count("HX-Request") == 1
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    assert "campaigns_unitcount" not in sql
    assert "OFFSET" not in sql and "COUNT(" not in sql


def test_an_outsider_gets_no_table(client, outsider, campaign):
    client.force_login(outsider)
    assert client.get(_url(campaign), **TABLE).status_code == 404
