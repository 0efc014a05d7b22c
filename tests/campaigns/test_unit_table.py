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


def test_htmx_swaps_only_the_table_reading_no_more_of_the_counts_than_the_counters(
    client, owner, campaign
):
    client.force_login(owner)
    with CaptureQueriesContext(connection) as queries:
        response = client.get(_url(campaign), {"state": "failed"}, **TABLE)
    page = response.content.decode()
    assert response.status_code == 200
    assert page.lstrip().startswith('<section id="unit-table"')
    assert "<html" not in page and 'id="counts"' not in page
    assert len(_uids(page)) == 44
    assert response["Vary"].count("HX-Request") == 1
    # Whether the campaign runs (so the rows keep polling) comes from the
    # counters, one small read; the units are never counted, nor skipped over.
    statements = [q["sql"] for q in queries.captured_queries]
    assert sum("campaigns_unitcount" in sql for sql in statements) == 1
    units = [sql for sql in statements if re.search(r'FROM "?campaigns_unit"?\s', sql)]
    assert units and not any("OFFSET" in sql or "COUNT(" in sql for sql in units)


ROWS = {"HTTP_HX_REQUEST": "true", "HTTP_HX_TARGET": "unit-rows"}


def _rows_poll(page: str) -> str | None:
    """The URL the rows poll asks for, or None when they do not poll."""
    found = re.search(r'<div id="unit-rows" hx-get="([^"]+)" hx-trigger="every 5s"', page)
    return html.unescape(found.group(1)) if found else None


def test_the_rows_redraw_by_themselves_while_the_campaign_runs_and_keep_the_filter(
    client, owner, outsider, campaign
):
    client.force_login(owner)
    idle = client.get(_url(campaign), {"state": "failed"}).content.decode()
    assert _rows_poll(idle) is None

    # A worker takes units: the page, and a filter swapped in, poll their own page.
    queued = list(Unit.objects.filter(campaign=campaign, state=UnitState.SUCCEEDED)[:60])
    Unit.objects.filter(pk__in=[u.pk for u in queued]).update(state=UnitState.QUEUED)
    first = client.get(_url(campaign), {"state": "queued"}).content.decode()
    second_url = _link(first, "next")
    second = client.get(second_url, **TABLE).content.decode()
    assert _rows_poll(first) == f"{_url(campaign)}?state=queued"
    assert _rows_poll(second) == second_url
    # The pager's links still swap the whole table and its address.
    assert 'rel="next" hx-target="#unit-table" hx-push-url="true"' in first

    # The poll: rows and pager only (the filters a person may be typing stay).
    polled = client.get(_rows_poll(first), **ROWS)
    body = polled.content.decode()
    assert polled.status_code == 200
    assert body.lstrip().startswith('<div id="unit-rows"') and 'id="unit-filters"' not in body
    assert _uids(body) == _uids(first)

    # Units finish: the next poll shows where they went, then stops (286).
    Unit.objects.filter(pk__in=[u.pk for u in queued[:PAGE]]).update(state=UnitState.SUCCEEDED)
    Unit.objects.filter(pk__in=[u.pk for u in queued[PAGE:]]).update(state=UnitState.FAILED)
    done = client.get(_rows_poll(first), **ROWS)
    assert done.status_code == 286
    assert _uids(done.content.decode()) == [] and _rows_poll(done.content.decode()) is None
    assert "No units match these filters." in done.content.decode()

    client.force_login(outsider)
    assert client.get(_rows_poll(first), **ROWS).status_code == 404


def test_an_outsider_gets_no_table(client, outsider, campaign):
    client.force_login(outsider)
    assert client.get(_url(campaign), **TABLE).status_code == 404


@pytest.fixture
def shuffled(project) -> Campaign:
    """Ids imported out of id order, with characters LIKE would read as wildcards."""
    campaign = Campaign.objects.create(
        project=project, name="shuffled", processor="text-embedding", input_root="/nowhere"
    )
    uids = [f"scan/{(i * 37) % 120:03d}.png" for i in range(120)]
    uids += ["Scan/upper.png", "a_b.txt", "axb.txt", "100%.txt", "1000.txt"]
    Unit.objects.bulk_create(
        Unit(campaign=campaign, uid=uid, source_path=uid, state=UnitState.PENDING) for uid in uids
    )
    return campaign


def test_an_id_prefix_search_pages_in_id_order_both_ways(client, owner, shuffled):
    client.force_login(owner)
    pages = _walk(client, f"{_url(shuffled)}?q=scan/")
    assert [len(p) for p in pages] == [PAGE, PAGE, 120 - 2 * PAGE]
    # Ids in order, not in import order, each once; "Scan/" is another prefix.
    assert [uid for page in pages for uid in page] == [f"scan/{i:03d}.png" for i in range(120)]

    first = client.get(f"{_url(shuffled)}?q=scan/").content.decode()
    second = client.get(_link(first, "next")).content.decode()
    third = client.get(_link(second, "next")).content.decode()
    back = client.get(_link(third, "prev")).content.decode()
    assert _uids(back) == _uids(second)
    back = client.get(_link(back, "prev")).content.decode()
    assert _uids(back) == _uids(first) and _link(back, "prev") is None


@pytest.mark.parametrize(
    ("prefix", "found"),
    [
        ("a_", ["a_b.txt"]),  # "_" is a character, not LIKE's any-one wildcard
        ("100%", ["100%.txt"]),
        ("Scan/", ["Scan/upper.png"]),  # case-sensitive on SQLite as on PostgreSQL
        ("scan/11", [f"scan/{i}.png" for i in range(110, 120)]),
        ("scan/119.png", ["scan/119.png"]),
        ("zzz", []),
    ],
)
def test_the_id_prefix_is_matched_as_written(client, owner, shuffled, prefix, found):
    client.force_login(owner)
    page = client.get(_url(shuffled), {"q": prefix}).content.decode()
    assert _uids(page) == found


def test_a_cursor_from_another_campaign_or_a_nul_in_the_search_shows_the_first_page(
    client, owner, shuffled, campaign
):
    client.force_login(owner)
    elsewhere = Unit.objects.filter(campaign=campaign).first().pk
    page = client.get(_url(shuffled), {"q": "scan/", "after": elsewhere})
    assert _uids(page.content.decode())[:2] == ["scan/000.png", "scan/001.png"]
    page = client.get(_url(shuffled), {"q": "scan/\x0011", "category": "\x00"})
    assert page.status_code == 200
    assert _uids(page.content.decode())[0] == "scan/110.png"


def test_an_id_prefix_page_reads_the_id_index_in_order(owner, shuffled):
    """The page is a range of unit_uid_unique read in order: no sort of every
    match, and no scan of the campaign in import order (bench/RESULTS.md)."""
    unit_filter = selectors.UnitFilter.parse({"q": "scan/1"})
    statements = []

    def keep(execute, sql, params, many, context):
        statements.append((sql, params))
        return execute(sql, params, many, context)

    # The statement as sent, with its parameters, so that EXPLAIN plans what
    # the page runs whichever way its parameters are bound.
    with connection.execute_wrapper(keep):
        selectors.unit_page(campaign=shuffled, unit_filter=unit_filter)
    ((page_sql, params),) = [(sql, p) for sql, p in statements if "LIMIT" in sql]
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # A hundred rows: the planner would rather sort them all. With a
            # full sort priced out, it finds the order in the index, or fails.
            cursor.execute("SET LOCAL enable_seqscan = off")
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute("SET LOCAL enable_sort = off")
            cursor.execute(f"EXPLAIN {page_sql}", params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert "Index Scan using unit_uid_unique" in plan, plan
            assert "Presorted Key: uid" in plan or "Sort" not in plan, plan
            assert "Disabled" not in plan and "cost=10000000" not in plan, plan
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {page_sql}", params)
            plan = "\n".join(str(row[-1]) for row in cursor.fetchall())
            # The unique constraint's index (SQLite names it itself), read as a range.
            assert "(campaign_id=? AND uid>? AND uid<?)" in plan, plan
            assert "TEMP B-TREE" not in plan, plan


@pytest.mark.parametrize(
    ("prefix", "upper"),
    [("ab", "ac"), ("a\U0010ffff", "b"), ("\U0010ffff", None), ("x\ud7ff", "x\ue000")],
)
def test_the_prefix_range_ends_at_the_next_string(prefix, upper):
    from campaigns.db.id_order import _next_string

    assert _next_string(prefix) == upper


@pytest.mark.parametrize(
    "unit_filter",
    [
        selectors.UnitFilter(),
        selectors.UnitFilter(state=UnitState.FAILED),
        selectors.UnitFilter(error=ErrorClass.TIMEOUT),
        selectors.UnitFilter(category="news"),
        selectors.UnitFilter(state=UnitState.SUCCEEDED, category="recipes"),
        selectors.UnitFilter(state=UnitState.SUCCEEDED, error=ErrorClass.TIMEOUT),  # none
    ],
)
def test_pages_forward_in_import_order_hold_what_the_orm_selects(campaign, unit_filter):
    # The plain SQL the page opens on and polls (page_queries.unit_rows_in_pk_order):
    # each unit once, in pk order, with the ORM's values, and links both ways.
    f = unit_filter

    def shown(cells) -> bool:
        state, error, category = cells
        return (
            (not f.state or state == f.state)
            and (not f.error or (state, error) == (UnitState.FAILED, f.error))
            and (not f.category or category == f.category)
        )

    everything = Unit.objects.filter(campaign=campaign).order_by("pk")
    columns = everything.values_list(*selectors.UnitRow._fields, "category")
    expected = [selectors.UnitRow(*row[:-1]) for row in columns if shown((row[2], row[3], row[-1]))]
    seen, after, pages = [], None, 0
    while True:
        page = selectors.unit_page(campaign=campaign, unit_filter=unit_filter, after=after, size=9)
        assert (page.previous_before is not None) == (pages > 0 and bool(page.rows))
        seen += page.rows
        pages += 1
        if page.next_after is None:
            break
        after = page.next_after
    assert seen == expected
    assert all(row.updated_at.tzinfo is not None for row in seen)  # aware, as the ORM's
