"""The campaign pages with a million units, under wrk, against PostgreSQL.

    createdb -h 127.0.0.1 -U postgres bench_pages   # once
    .venv/bin/python bench/pages_scale.py            # seeds once, then measures
    .venv/bin/python bench/pages_scale.py --units 10000000 --reseed   # 10M units
    .venv/bin/python bench/pages_scale.py --in-process 40   # CPU a view, no wrk

Seeds one campaign of 1,000,000 units (--units) with INSERT ... SELECT generate_series
(a mid-run mix: succeeded, pending, queued, running, failed in five classes,
needs review; eight categories) and 15,625 finished batches of 64 with their
measurements, so every panel of the page has data; --open-items open review
items in it (300,000), and --campaigns campaigns in all (100: the others of
1,000 units each) for the campaign list. The counters fill by
themselves: the insert fires the migration's statement trigger. Then a user
logs in (django.test.Client, for the session cookie), gunicorn serves the site
with DEBUG off on loopback (-w 2), and wrk (-t2 -c32 -d20s --latency) measures
each URL; a Lua done() prints p50/p90/p95/p99, which wrk's own report lacks p95 of.
Each page's p95 is also given as a ratio to the login page's in the same run:
the pages' goals are such ratios (issue 32), which hold across machines where
absolute latencies do not.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
CAMPAIGN = "bench-million"
USER, PASSWORD = "bench", "bench-password-not-secret"
BATCH = 64

WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK {"p50": %d, "p90": %d, "p95": %d, "p99": %d, "requests": %d, "duration_us": %d, '
    .. '"errors": %d, "bad_status": %d}\\n',
    latency:percentile(50), latency:percentile(90), latency:percentile(95),
    latency:percentile(99), summary.requests, summary.duration,
    e.connect + e.read + e.write + e.timeout, e.status))
end
"""

# (name, path, extra headers).
TARGETS = [
    # The floor: session and user lookups and a small template, no campaign data.
    ("login page (baseline)", "/accounts/login/", {}),
    (
        "counts fragment (htmx poll)",
        f"/campaigns/{CAMPAIGN}/",
        {"HX-Request": "true", "HX-Target": "counts"},
    ),
    ("campaign page", f"/campaigns/{CAMPAIGN}/", {}),
    ("campaign list (__CAMPAIGNS__ campaigns)", "/campaigns/", {}),
    (
        "unit table, failed + timeout (htmx)",
        f"/campaigns/{CAMPAIGN}/?state=failed&error=timeout",
        {"HX-Request": "true", "HX-Target": "unit-table"},
    ),
    (
        "unit table, page after unit 900,000 (htmx)",
        f"/campaigns/{CAMPAIGN}/?after=__DEEP__",
        {"HX-Request": "true", "HX-Target": "unit-table"},
    ),
    (
        "unit table, category + id prefix (htmx)",
        f"/campaigns/{CAMPAIGN}/?category=cat-3&q=docs/0123",
        {"HX-Request": "true", "HX-Target": "unit-table"},
    ),
    ("review queue (__ITEMS__ open items)", f"/review/?campaign={CAMPAIGN}", {}),
    # The watch panel (htmx, every 15 s while the run is active): ETA, workers, charts.
    ("watch panel (htmx)", f"/campaigns/{CAMPAIGN}/watch/", {"HX-Request": "true"}),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--database-url", default="postgres://postgres@127.0.0.1:5432/bench_pages")
    parser.add_argument("--units", type=int, default=1_000_000)
    parser.add_argument("--reseed", action="store_true", help="drop the campaign and seed again")
    parser.add_argument(
        "--campaigns", type=int, default=100, help="campaigns in all (the list page's rows)"
    )
    parser.add_argument(
        "--open-items", type=int, default=300_000, help="open review items in the big campaign"
    )
    parser.add_argument("--duration", default="20s")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes")
    parser.add_argument(
        "--gunicorn",
        default="",
        help="more gunicorn options, e.g. '-k gthread --threads 4 --keep-alive 5'",
    )
    parser.add_argument(
        "--cache-url",
        default="",
        help="CACHE_URL for the site, e.g. redis://127.0.0.1:6379/1 as docs/deployment.md sets "
        "it (rate limits and cached panels then live there); unset: the per-process default",
    )
    parser.add_argument(
        "--only",
        default="",
        help="run only targets whose name contains one of these (comma-separated)",
    )
    parser.add_argument("--explain", action="store_true", help="print EXPLAIN ANALYZE and stop")
    parser.add_argument(
        "--in-process",
        type=int,
        default=0,
        metavar="N",
        help="instead of wrk: each page N times through django.test.Client in this process "
        "(DEBUG off), CPU ms a view and its ratio to the login page's, best of --rounds",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds of --in-process")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-pages-"))
    env = {
        "DATABASE_URL": args.database_url,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "VAR_DIR": str(work / "var"),
        "OUTPUT_ROOT": str(work / "outputs"),
        # The same key here (where the session is made) and in gunicorn.
        "SECRET_KEY": secrets.token_urlsafe(50),
    }
    if args.cache_url:
        env["CACHE_URL"] = args.cache_url
    os.environ.update(env)
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    campaign = _seed(units=args.units, reseed=args.reseed)
    _seed_review_items(campaign, args.open_items)
    _seed_campaigns(campaign, args.campaigns)
    deep = _deep_cursor(campaign)
    if args.explain:
        _explain(campaign, deep)
        return
    if args.in_process:
        _in_process(args, deep)
        return
    cookie = _session_cookie(campaign)

    port = _free_port()
    server_env = {
        **os.environ,
        **env,
        "DEBUG": "0",
        "ALLOWED_HOSTS": "127.0.0.1",
        # Loopback without TLS: no redirect to https.
        "SECURE_SSL_REDIRECT": "0",
    }
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "portal.wsgi", "-w", str(args.workers)]
        + ["-b", f"127.0.0.1:{port}", "--log-level", "warning"]
        + shlex.split(args.gunicorn),
        cwd=REPO,
        env=server_env,
    )
    script = work / "percentiles.lua"
    script.write_text(WRK_DONE)
    results = []
    load_before = os.getloadavg()
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for(f"{base}/campaigns/", cookie)
        for name, path, headers in TARGETS:
            name = name.replace("__CAMPAIGNS__", f"{args.campaigns:,}")
            name = name.replace("__ITEMS__", f"{args.open_items:,}")
            if args.only and not any(part in name for part in args.only.split(",")):
                continue
            url = base + path.replace("__DEEP__", str(deep))
            headers = {"Cookie": f"sessionid={cookie}", **headers}
            status, size = _fetch(url, headers)  # warm up, and check it answers
            for _ in range(20):
                _fetch(url, headers)
            command = ["wrk", f"-t{args.threads}", f"-c{args.connections}", f"-d{args.duration}"]
            command += ["--latency", "-s", str(script)]
            for key, value in headers.items():
                command += ["-H", f"{key}: {value}"]
            out = subprocess.run(command + [url], capture_output=True, text=True, check=True)
            line = next(x for x in out.stdout.splitlines() if x.startswith("WRK "))
            figures = json.loads(line[4:])
            figures.update(name=name, status=status, size=size, url=url.removeprefix(base))
            results.append(figures)
            print(json.dumps(figures), flush=True)
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)

    load_after = os.getloadavg()
    # Other work on the machine shares the cores: say how busy it was.
    print(f"\nload average (1, 5, 15 min) before {load_before}, after {load_after}")
    print(
        f"{args.units:,} units; wrk -t{args.threads} -c{args.connections} -d{args.duration} "
        f"--latency; gunicorn -w {args.workers} {args.gunicorn}".rstrip()
        + f"; {os.cpu_count()} cores; CACHE_URL {args.cache_url or 'unset (locmem)'}"
    )
    login = next((r["p95"] for r in results if r["name"].startswith("login")), None)
    print(
        "| URL | status | p50 ms | p90 ms | p95 ms | p99 ms | requests/s | errors "
        "| p95 ÷ login p95 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        rps = r["requests"] / (r["duration_us"] / 1e6)
        ratio = f"{r['p95'] / login:.2f}" if login else "—"
        print(
            f"| {r['name']} | {r['status']} | {r['p50'] / 1000:.1f} | {r['p90'] / 1000:.1f} | "
            f"{r['p95'] / 1000:.1f} | {r['p99'] / 1000:.1f} | {rps:,.0f} | "
            f"{r['errors'] + r['bad_status']} | {ratio} |"
        )


def _seed(*, units: int, reseed: bool):
    from django.contrib.auth import get_user_model
    from django.db import connection

    from campaigns.models import Campaign, ParameterVersion, Project

    campaign = Campaign.objects.filter(name=CAMPAIGN).first()
    if campaign is not None and not reseed and campaign.units.exists():
        return campaign
    if campaign is not None:
        with connection.cursor() as cursor:
            # The bench's own data: TRUNCATE is the fast way out (its trigger
            # clears the counters too).
            cursor.execute(
                "TRUNCATE campaigns_unit, campaigns_attempt, campaigns_reviewitem, "
                "campaigns_reviewdecision, campaigns_batch CASCADE"
            )
        # The list's other campaigns go too (their units went with the TRUNCATE).
        Campaign.objects.filter(project=campaign.project).delete()
    user = get_user_model().objects.filter(username=USER).first()
    if user is None:
        user = get_user_model().objects.create_user(USER, password=PASSWORD)
    project, _ = Project.objects.get_or_create(name="bench")
    project.members.add(user)
    campaign = Campaign.objects.create(
        project=project,
        name=CAMPAIGN,
        processor="text-embedding",
        input_root="/bench/inputs",
        checkpoint_after=0,
    )
    version = ParameterVersion.objects.create(
        campaign=campaign,
        number=1,
        params={"model": "sentence-transformers/all-MiniLM-L6-v2", "batch_size": BATCH},
        software={"python": sys.version.split()[0]},
        fingerprint=secrets.token_hex(32),
    )
    Campaign.objects.filter(pk=campaign.pk).update(current_version=version)
    campaign.refresh_from_db()

    started = time.perf_counter()
    batches = units // BATCH
    with connection.cursor() as cursor:
        # Finished batches with measurements: the policy table and memory chart read them.
        cursor.execute(
            """
            INSERT INTO campaigns_batch (campaign_id, version_id, state, size, worker,
                lease_token, deliveries, created_at, started_at, finished_at, policy,
                real_tokens, padded_tokens, compute_seconds, mem_allocated, mem_reserved,
                mem_peak_allocated, mem_peak_reserved, rss, metrics, error)
            SELECT %(c)s, %(v)s, 'done', %(b)s, 'gpu-' || (i %% 4), '', 1,
                now() - interval '1 day', now() - make_interval(secs => %(n)s - i),
                now() - make_interval(secs => %(n)s - i - 1),
                CASE WHEN i %% 2 = 0 THEN 'length_grouped' ELSE 'original' END,
                9000 + i %% 1000, 12000 + i %% 3000, 0.5 + (i %% 7) / 10.0,
                800000000 + (i %% 5) * 1000000, 2000000000, 1500000000, 2100000000,
                3000000000, '{}'::jsonb, ''
            FROM generate_series(0, %(n)s - 1) AS i
            """,
            {"c": campaign.pk, "v": version.pk, "b": BATCH, "n": batches},
        )
        cursor.execute("SELECT min(id) FROM campaigns_batch WHERE campaign_id = %s", [campaign.pk])
        first_batch = cursor.fetchone()[0]
        # A mid-run mix spread over the ids (a multiplicative hash, not blocks):
        # 60% succeeded, 25% pending, 5% queued, 1% running, 6% failed in five
        # classes, 3% needs review.
        cursor.execute(
            """
            INSERT INTO campaigns_unit (campaign_id, uid, source_path, size, sha256, mtime_ns,
                category, cost, metadata, holdout, state, error_class, error_message,
                batch_id, output_path, output_size, output_sha256, updated_at)
            SELECT %(c)s, 'docs/' || lpad(i::text, 7, '0') || '.txt',
                'docs/' || lpad(i::text, 7, '0') || '.txt', 1000 + i %% 5000,
                md5(i::text) || md5((i + 1)::text), 1700000000000000000 + i,
                'cat-' || (i %% 8), 200 + i %% 300, '{}'::jsonb, i %% 20 = 0, s.state,
                CASE WHEN s.state = 'failed' THEN (ARRAY['input_invalid', 'timeout',
                    'processing_error', 'input_missing', 'out_of_memory'])[1 + i %% 5]
                    ELSE '' END,
                CASE WHEN s.state = 'failed' THEN 'something was wrong with this input'
                    ELSE '' END,
                CASE WHEN s.state IN ('pending') THEN NULL
                    ELSE %(fb)s + LEAST(i / %(b)s, %(nb)s - 1) END,
                CASE WHEN s.state IN ('succeeded', 'needs_review')
                    THEN 'bench-million/v1/docs/' || lpad(i::text, 7, '0') || '.npy'
                    ELSE '' END,
                CASE WHEN s.state IN ('succeeded', 'needs_review') THEN 1664 END,
                CASE WHEN s.state IN ('succeeded', 'needs_review') THEN md5(i::text) ELSE '' END,
                now()
            FROM generate_series(0, %(n)s - 1) AS i,
            LATERAL (SELECT CASE
                WHEN h < 60 THEN 'succeeded' WHEN h < 85 THEN 'pending'
                WHEN h < 90 THEN 'queued' WHEN h < 91 THEN 'running'
                WHEN h < 97 THEN 'failed' ELSE 'needs_review' END AS state
                FROM (SELECT ((i::bigint * 2654435761) %% 4294967296) %% 100 AS h) AS hashed
            ) AS s
            """,
            {"c": campaign.pk, "n": units, "b": BATCH, "nb": batches, "fb": first_batch},
        )
    seeded = time.perf_counter() - started
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE campaigns_unit")
        cursor.execute("VACUUM ANALYZE campaigns_batch")
        cursor.execute("VACUUM ANALYZE campaigns_unitcount")
    _check_counters(campaign)
    print(f"seeded {units:,} units and {batches:,} batches in {seeded:.1f} s", flush=True)
    return campaign


def _seed_review_items(campaign, open_items: int) -> None:
    """open_items open review items, as flag rules leave them: on the units in
    needs_review first, then on succeeded ones, more than one a unit when the
    campaign has fewer units than that (three reasons)."""
    from django.db import connection

    from campaigns.models import ReviewItem

    have = ReviewItem.objects.filter(campaign=campaign, state="open").count()
    if have == open_items:
        return
    started = time.perf_counter()
    with connection.cursor() as cursor:
        # The bench's own items: TRUNCATE is the fast way out (its triggers
        # clear the review counters too).
        cursor.execute("TRUNCATE campaigns_reviewitem, campaigns_reviewdecision CASCADE")
        cursor.execute(
            """
            INSERT INTO campaigns_reviewitem (campaign_id, unit_id, version_id, source, reason,
                detail, state, note, created_at)
            SELECT campaign_id, id, %(v)s, 'rule',
                (ARRAY['truncated', 'abnormal_norm', 'duplicate_vector'])[1 + (id + k) %% 3],
                'seeded by bench/pages_scale.py', 'open', '', now()
            FROM (
                SELECT u.campaign_id, u.id, k FROM campaigns_unit u,
                    generate_series(0, (%(n)s - 1) / GREATEST(1, (
                        SELECT count(*) FROM campaigns_unit
                        WHERE campaign_id = %(c)s
                            AND state IN ('needs_review', 'succeeded')))) AS k
                WHERE u.campaign_id = %(c)s AND u.state IN ('needs_review', 'succeeded')
                ORDER BY k, u.state = 'succeeded', u.id
                LIMIT %(n)s
            ) AS chosen
            """,
            {"c": campaign.pk, "v": campaign.current_version_id, "n": open_items},
        )
        cursor.execute("VACUUM ANALYZE campaigns_reviewitem")
    print(
        f"seeded {open_items:,} open review items in {time.perf_counter() - started:.1f} s",
        flush=True,
    )


def _seed_campaigns(campaign, campaigns: int) -> None:
    """Campaigns of the same project, 1,000 units each, until there are `campaigns`
    in all: the campaign list's rows."""
    from django.db import connection

    from campaigns.models import Campaign, ParameterVersion

    have = Campaign.objects.filter(project=campaign.project).count()
    started = time.perf_counter()
    for i in range(have, campaigns):
        other = Campaign.objects.create(
            project=campaign.project,
            name=f"bench-other-{i:04d}",
            processor="text-embedding",
            input_root="/bench/inputs",
            checkpoint_after=0,
        )
        version = ParameterVersion.objects.create(
            campaign=other,
            number=1,
            params={"model": "sentence-transformers/all-MiniLM-L6-v2", "batch_size": BATCH},
            software={"python": sys.version.split()[0]},
            fingerprint=secrets.token_hex(32),
        )
        Campaign.objects.filter(pk=other.pk).update(current_version=version)
        with connection.cursor() as cursor:
            cursor.execute(
                """
                INSERT INTO campaigns_unit (campaign_id, uid, source_path, size, sha256,
                    mtime_ns, category, cost, metadata, holdout, state, error_class,
                    error_message, output_path, output_sha256, updated_at)
                SELECT %(c)s, 'docs/' || lpad(i::text, 7, '0') || '.txt',
                    'docs/' || lpad(i::text, 7, '0') || '.txt', 1000, md5(i::text),
                    1700000000000000000 + i, 'cat-' || (i %% 8), 200, '{}'::jsonb, false,
                    CASE WHEN i %% 3 = 0 THEN 'pending' ELSE 'succeeded' END, '', '', '', '',
                    now()
                FROM generate_series(0, 999) AS i
                """,
                {"c": other.pk},
            )
    if have < campaigns:
        print(
            f"seeded {campaigns - have} more campaigns in {time.perf_counter() - started:.1f} s",
            flush=True,
        )


def _check_counters(campaign) -> None:
    """Once, after seeding: the triggers' counts equal a GROUP BY (a full scan, here only)."""
    from django.db.models import Count

    from campaigns import selectors
    from campaigns.models import Unit

    counts = selectors.campaign_counts(campaign=campaign)
    fresh = dict(
        Unit.objects.filter(campaign=campaign).values_list("state").annotate(n=Count("pk"))
    )
    assert all(getattr(counts, state) == n for state, n in fresh.items()), (counts, fresh)
    assert counts.total == sum(fresh.values())


def _deep_cursor(campaign) -> int:
    from campaigns.models import Unit

    uid = "docs/0900000.txt"
    unit = Unit.objects.filter(campaign=campaign, uid=uid).only("pk").first()
    return unit.pk if unit else 0


def _session_cookie(campaign) -> str:
    from django.contrib.auth import get_user_model
    from django.test import Client

    # force_login: the login backends (django-axes) want the request a form
    # login has; this session is what a form login leaves behind.
    client = Client()
    client.force_login(get_user_model().objects.get(username=USER))
    return client.cookies["sessionid"].value


def _in_process(args, deep: int) -> None:
    """Each target's CPU time a view, served in this process: the steadiest
    figure a shared machine gives (wrk's latencies move with whatever else
    runs). Rounds are interleaved, and each target's best round is kept."""
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    settings.DEBUG = False
    settings.ALLOWED_HOSTS = ["testserver"]
    settings.SECURE_SSL_REDIRECT = False
    client = Client()
    client.force_login(get_user_model().objects.get(username=USER))
    targets = []
    for name, path, headers in TARGETS:
        name = name.replace("__CAMPAIGNS__", f"{args.campaigns:,}")
        name = name.replace("__ITEMS__", f"{args.open_items:,}")
        if args.only and not any(part in name for part in args.only.split(",")):
            continue
        extra = {"HTTP_" + k.upper().replace("-", "_"): v for k, v in headers.items()}
        targets.append((name, path.replace("__DEEP__", str(deep)), extra))
    best: dict[str, tuple[float, float]] = {}
    queries: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, path, extra in targets:
            for _ in range(3):  # warm: templates compiled, caches filled
                response = client.get(path, **extra)
                assert response.status_code in (200, 286), (name, response.status_code)
            with CaptureQueriesContext(connection) as captured:
                client.get(path, **extra)
            queries[name] = len(captured.captured_queries)
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(args.in_process):
                client.get(path, **extra)
            figures = (
                (time.process_time() - cpu) * 1000 / args.in_process,
                (time.perf_counter() - wall) * 1000 / args.in_process,
            )
            best[name] = min(best.get(name, figures), figures)
    login = next(v[0] for k, v in best.items() if k.startswith("login"))
    print(
        f"\nin-process, {args.units:,} units, best of {args.rounds} rounds of "
        f"{args.in_process} views; load average {os.getloadavg()}"
    )
    print("| view | CPU ms | wall ms | CPU ÷ login | queries |")
    print("|---|---:|---:|---:|---:|")
    for name, (cpu, wall) in best.items():
        print(f"| {name} | {cpu:.2f} | {wall:.2f} | {cpu / login:.2f} | {queries[name]} |")


def _explain(campaign, deep: int) -> None:
    """The hot queries' plans, for when a figure is off."""
    from django.db import connection

    from campaigns import selectors

    filters = [
        selectors.UnitFilter(),
        selectors.UnitFilter(state="failed", error="timeout"),
        selectors.UnitFilter(category="cat-3", prefix="docs/0123"),
        selectors.UnitFilter(state="pending", category="cat-5"),
    ]
    statements: list[tuple[str, object]] = []

    def keep(execute, sql, params, many, context):
        statements.append((sql, params))  # the server binds the parameters
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        selectors.campaign_counts(campaign=campaign)
        for unit_filter in filters:
            selectors.unit_page(campaign=campaign, unit_filter=unit_filter)
            selectors.unit_page(campaign=campaign, unit_filter=unit_filter, after=deep)
        list(selectors.failure_reasons(campaign=campaign))
    with connection.cursor() as cursor:
        for sql, params in statements:
            cursor.execute("EXPLAIN (ANALYZE, BUFFERS) " + sql, params)
            print(sql[:300])
            print("\n".join(f"    {row[0]}" for row in cursor.fetchall()), "\n")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _fetch(url: str, headers: dict) -> tuple[int, int]:
    request = urllib.request.Request(url, headers=headers)
    with urllib.request.urlopen(request, timeout=30) as response:
        # A redirect (to the login page, say) would measure the wrong page.
        assert response.geturl() == url, f"{url} went to {response.geturl()}"
        return response.status, len(response.read())


def _wait_for(url: str, cookie: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        try:
            status, _ = _fetch(url, {"Cookie": f"sessionid={cookie}"})
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
            continue
        assert status == 200, status
        return


if __name__ == "__main__":
    main()
