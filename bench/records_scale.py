"""A Parquet record campaign at scale, end to end: import, two real workers on Redis, live counts.

    .venv/bin/python bench/records_scale.py --rows 1000000
    .venv/bin/python bench/records_scale.py --rows 10000000 --keep /data/bench-records
    .venv/bin/python bench/records_scale.py --rows 10000000 --run-seconds 900   # a part of the run

What issue 32's "Scale" asks, on one machine: --rows records (id, text of
200–1,000 characters, category; bench/import_records.py writes them, row
groups of 100,000) are imported by `manage.py campaign create --records` in a
process of its own (rows/s, peak RSS); then --workers real Celery workers
(`-Q gpu -c 1`, Redis) run the campaign to the end while gunicorn serves the
site and a logged-in client polls the campaign's counts fragment once a
second, as the page's htmx does (its latencies and status codes). Peak RSS of
the importer, of each worker (main process and pool child) and of the web
server's processes are read from /proc (VmHWM).

The workers embed with an instant stand-in (random unit vectors: the model
replaced as in bench/orchestration.py, in a wrapper that then starts the
ordinary `celery worker`): on these CPUs the real model runs ~100 texts/s, and
what scale tests here is everything around it — claims, reads of the Parquet
rows, shards, checks, recording, the counters the page reads. The database
(--database-url) is dropped and created afresh.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
USER = "bench-scale"
CAMPAIGN = "records-at-scale"


def instant_worker(celery_args: list[str]) -> None:
    """A `celery worker` whose text embedding returns random unit vectors at once."""
    import django
    import numpy as np

    django.setup()
    from instant_model import instant_embed

    from gpuworker.processors import text_embedding
    from portal.celery import app

    embed = instant_embed(np.random.default_rng())
    text_embedding.TextEmbeddingProcessor.embed = embed  # type: ignore[method-assign]
    app.worker_main(["worker", *celery_args])


def _hwm_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _tree(pid: int) -> list[int]:
    """The process and its descendants (a worker's pool child, gunicorn's workers)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        try:
            children = Path(f"/proc/{p}/task/{p}/children").read_text().split()
        except OSError:
            children = []
        todo.extend(int(c) for c in children)
    return found


class Peaks:
    """The highest VmHWM seen a process, sampled while the processes live."""

    def __init__(self) -> None:
        self.mib: dict[str, float] = {}

    def sample(self, role: str, root: int) -> None:
        for i, pid in enumerate(_tree(root)):
            key = f"{role} {'main' if i == 0 else 'child'}"
            self.mib[key] = max(self.mib.get(key, 0.0), _hwm_mib(pid))


def _plan(start, campaign) -> None:
    from django.db import connections

    try:
        start.campaign_run(campaign=campaign)
    finally:
        connections.close_all()


def _admin(url: str, sql: str) -> None:
    import psycopg

    base = url.rsplit("/", 1)[0].replace("postgres://", "postgresql://")
    with psycopg.connect(f"{base}/postgres", autocommit=True) as conn:
        conn.execute(sql)


def _import(records: Path, env: dict, peaks: Peaks) -> tuple[float, str]:
    command = [
        *(sys.executable, "manage.py", "campaign", "create", CAMPAIGN),
        *("--processor", "text-embedding", "--records", str(records)),
        *("--id-column", "id", "--text-column", "text", "--category-column", "category"),
        *("--project", "bench-scale", "--checkpoint", "0"),
    ]
    started = time.perf_counter()
    proc = subprocess.Popen(
        command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    while proc.poll() is None:
        peaks.sample("importer", proc.pid)
        time.sleep(0.2)
    seconds = time.perf_counter() - started
    output = proc.stdout.read() if proc.stdout else ""
    if proc.returncode:
        raise SystemExit(f"import failed:\n{output[-3000:]}")
    return seconds, output


def _poll(url: str, cookie: str) -> tuple[int, float]:
    request = urllib.request.Request(
        url,
        headers={"Cookie": f"sessionid={cookie}", "HX-Request": "true", "HX-Target": "counts"},
    )
    started = time.perf_counter()
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            response.read()
            # A redirect (to the login page, say) would time the wrong page.
            status = response.status if response.geturl() == url else 302
    except urllib.error.HTTPError as error:  # 286 is htmx's "stop polling": a success here
        status = error.code
    except OSError:
        status = 0
    return status, 1000 * (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--keep", help="write (or reuse) the records in this folder")
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/bench_records_scale"
    )
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/4")
    parser.add_argument("--cache-url", default="redis://127.0.0.1:6379/5")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--worker-options",
        default="",
        help="more `celery worker` options, e.g. '--prefetch-multiplier 2'",
    )
    parser.add_argument(
        "--run-seconds",
        type=float,
        default=0,
        help="stop the run after this long (units/s so far; 0: run to the end)",
    )
    parser.add_argument("--worker", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Celery puts the working folder first on sys.path: this checkout's code, not the caller's.
    os.chdir(REPO)
    if args.worker is not None:
        instant_worker(args.worker)
        return

    from import_records import write_records

    work = Path(tempfile.mkdtemp(prefix="bench-records-scale-"))
    folder = Path(args.keep) if args.keep else work / "records"
    folder.mkdir(parents=True, exist_ok=True)
    records = folder / f"records-{args.rows}.parquet"
    if not records.exists():
        write_records(records, None, args.rows)
    env = {
        **os.environ,
        "DATABASE_URL": args.database_url,
        "CELERY_BROKER_URL": args.broker_url,
        # As docs/deployment.md sets it: the rate limits' counts shared by the web processes.
        "CACHE_URL": args.cache_url,
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "VAR_DIR": str(work / "var"),
        "OUTPUT_ROOT": str(work / "outputs"),
        "SECRET_KEY": secrets.token_urlsafe(50),
        "DEBUG": "0",
        "SECURE_SSL_REDIRECT": "0",  # plain HTTP on loopback
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "LOG_LEVEL": "WARNING",
    }
    name = args.database_url.rsplit("/", 1)[1]
    _admin(args.database_url, f'DROP DATABASE IF EXISTS "{name}"')
    _admin(args.database_url, f'CREATE DATABASE "{name}"')
    os.environ.update(env)
    import django

    django.setup()
    from django.contrib.auth import get_user_model
    from django.core.management import call_command
    from django.test import Client

    from campaigns.models import Batch, Campaign, Unit
    from campaigns.runs import leases, start
    from campaigns.selectors import campaign_counts

    call_command("migrate", verbosity=0)
    peaks = Peaks()
    import_s, report = _import(records, env, peaks)
    campaign = Campaign.objects.get(name=CAMPAIGN)
    user = get_user_model().objects.create_user(USER, password=secrets.token_urlsafe(16))
    campaign.project.members.add(user)
    client = Client()
    client.force_login(user)
    cookie = client.cookies["sessionid"].value
    total = campaign_counts(campaign=campaign).total
    rate = total / import_s
    print(f"imported {total:,} of {args.rows:,} rows in {import_s:.1f} s: {rate:,.0f} rows/s")

    with leases.celery_app.connection_for_write() as conn:
        conn.default_channel.queue_purge("gpu")
    port = 18000 + os.getpid() % 1000
    logs = work / "logs"
    logs.mkdir()
    web = subprocess.Popen(
        [str(Path(sys.executable).parent / "gunicorn"), "portal.wsgi", "-w", "2"]
        + ["-b", f"127.0.0.1:{port}", "--log-level", "warning"],
        cwd=REPO,
        env=env,
        stdout=(logs / "web.log").open("wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    workers = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", "-Q", "gpu", "-c", "1", "-n", f"scale{i}@%h"]
            + ["-l", "WARNING", "--without-gossip", "--without-mingle"]
            + shlex.split(args.worker_options),
            cwd=REPO,
            env=env,
            stdout=(logs / f"worker-{i}.log").open("wb"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for i in range(args.workers)
    ]
    url = f"http://127.0.0.1:{port}/campaigns/{CAMPAIGN}/"
    polls: list[tuple[int, float]] = []
    try:
        deadline = time.monotonic() + 60
        while _poll(url, cookie)[0] not in (200, 286):  # 286: htmx's "stop polling"
            if time.monotonic() > deadline:
                raise SystemExit(f"web server did not answer:\n{(logs / 'web.log').read_text()}")
            time.sleep(0.5)
        time.sleep(5)  # the workers load the (unused) model and connect
        started = time.perf_counter()
        # Planning (weighing every text, a slice at a time) goes on beside the
        # workers, in a thread of its own as in a `portal` worker: the polls
        # and the clock start with it.
        planner = threading.Thread(target=_plan, args=(start, campaign), daemon=True)
        planner.start()
        last = time.perf_counter()
        while True:
            polls.append(_poll(url, cookie))
            for i, worker in enumerate(workers):
                peaks.sample(f"worker {i}", worker.pid)
                if worker.poll() is not None:
                    raise SystemExit((logs / f"worker-{i}.log").read_text()[-3000:])
            peaks.sample("web", web.pid)
            counts = campaign_counts(campaign=campaign)
            if time.perf_counter() - last > 60:
                last = time.perf_counter()
                print(f"  {time.perf_counter() - started:.0f} s: {counts.done:,} of {total:,} done")
            if not counts.active and not planner.is_alive():
                break
            if args.run_seconds and time.perf_counter() - started > args.run_seconds:
                print(f"  stopped after {args.run_seconds:.0f} s (--run-seconds)")
                break
            time.sleep(max(0.0, 1.0 - polls[-1][1] / 1000))
        run_s = time.perf_counter() - started
    finally:
        for proc in (*workers, web):
            proc.terminate()
        for proc in (*workers, web):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    counts = campaign_counts(campaign=campaign)
    latencies = sorted(ms for _, ms in polls)
    codes: dict[int, int] = {}
    for status, _ in polls:
        codes[status] = codes.get(status, 0) + 1
    # Where the wall time went: the batches' own time (claim to recorded) over
    # the workers' wall time; the rest is between batches (broker, prefetch, acks).
    from django.db.models import Count, F, Sum

    batches = Batch.objects.filter(campaign=campaign, finished_at__isnull=False)
    spans = batches.aggregate(
        n=Count("pk"), units=Sum("size"), busy=Sum(F("finished_at") - F("started_at"))
    )
    per_worker = sorted(
        batches.values("worker").annotate(n=Count("pk")).values_list("n", flat=True),
        reverse=True,
    )
    result = {
        "rows": args.rows,
        "imported": total,
        "import_s": round(import_s, 1),
        "import_rows_s": round(total / import_s),
        "run_s": round(run_s, 1),
        "units_s": round(counts.done / run_s, 1),
        "to_the_end": not counts.active and not planner.is_alive(),
        "planned": Batch.objects.filter(campaign=campaign).aggregate(n=Sum("size"))["n"],
        "succeeded": Unit.objects.filter(campaign=campaign, state="succeeded").count(),
        "done": counts.done,
        "batches": spans["n"],
        "units_a_batch": round((spans["units"] or 0) / max(1, spans["n"]), 1),
        "batches_a_worker": per_worker,
        "batch_ms_mean": round(1000 * spans["busy"].total_seconds() / max(1, spans["n"]), 1),
        "workers_busy_share": round(spans["busy"].total_seconds() / (run_s * args.workers), 2),
        "counts_polls": len(polls),
        "counts_status": codes,
        "counts_p50_ms": round(statistics.median(latencies), 1),
        "counts_p95_ms": round(latencies[int(0.95 * (len(latencies) - 1))], 1),
        "peak_rss_mib": {k: round(v) for k, v in sorted(peaks.mib.items())},
        "load": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "cores": os.cpu_count(),
    }
    print(json.dumps(result, indent=2))
    print(report.strip().splitlines()[-1] if report.strip() else "")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
