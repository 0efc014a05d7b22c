"""Two Celery worker processes against one, on the same kind of campaign.

    .venv/bin/python bench/workers_scale.py                       # PostgreSQL + Redis
    .venv/bin/python bench/workers_scale.py --embed-texts 1000    # + a text-embedding row

Each row: start N real `celery worker -Q gpu -c 1` processes (each its own node
name), wait until they consume, then time `campaign run` to the last unit
recorded. The cheap rows use the image-transform processor on tiny PNGs, so
the time is the orchestration's: broker round trips, claims, lease threads,
atomic writes with fsync, recording. The embedding row runs all-MiniLM-L6-v2
on the first texts of shared/data/corpus_stdlib_docstrings_5000.jsonl.gz (a
warm-up campaign first loads the model in every worker).

Defaults: database bench_workers on the local PostgreSQL (created if missing),
Redis db 3. Every run makes new campaigns; outputs go to a temporary folder.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DEFAULT_CORPUS = REPO.parent / "shared" / "data" / "corpus_stdlib_docstrings_5000.jsonl.gz"


def ensure_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0].replace("postgres://", "postgresql://") + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone():
            conn.execute(f'CREATE DATABASE "{name}"')


class Workers:
    """N worker processes on this benchmark's database and broker."""

    def __init__(self, n: int, logs: Path, env: dict):
        self.procs, self.logs = [], []
        for i in range(n):
            log = logs / f"worker-{n}-{i}.log"
            self.logs.append(log)
            self.procs.append(
                subprocess.Popen(
                    [
                        *(sys.executable, "-m", "celery", "-A", "portal", "worker"),
                        *("-Q", "gpu", "-c", "1", "-n", f"bench{i}@%h", "-l", "INFO"),
                        *("--without-gossip", "--without-mingle", "--without-heartbeat"),
                    ],
                    cwd=REPO,
                    env=env,
                    stdout=log.open("wb"),
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        for proc, log in zip(self.procs, self.logs, strict=True):
            while " ready." not in log.read_text(errors="replace"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"worker did not start:\n{log.read_text()[-3000:]}")
                time.sleep(0.2)

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--database-url", default="postgres://postgres@127.0.0.1:5432/bench_workers"
    )
    parser.add_argument("--broker-url", default="redis://127.0.0.1:6379/3")
    parser.add_argument("--units", type=int, default=2000, help="images for the cheap rows")
    parser.add_argument("--batch-size", type=int, default=8, help="images per batch")
    parser.add_argument("--workers", default="1,2", help="worker counts to compare")
    parser.add_argument("--embed-texts", type=int, default=0, help="texts for the embedding row")
    parser.add_argument("--embed-batch-size", type=int, default=16)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads per worker (OMP_NUM_THREADS); 0: torch's default, one per core",
    )
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="bench-workers-"))
    env = {
        "DATABASE_URL": args.database_url,
        "CELERY_BROKER_URL": args.broker_url,
        "VAR_DIR": str(work / "var"),
        "OUTPUT_ROOT": str(work / "outputs"),
        "DJANGO_SETTINGS_MODULE": "portal.settings",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    ensure_database(args.database_url)
    import django

    django.setup()
    from django.core.management import call_command
    from django.db.models import Count
    from PIL import Image

    from campaigns.models import Batch, Unit, UnitState
    from campaigns.runs import leases, setup, start

    call_command("migrate", verbosity=0)
    project = setup.project_for_user(name="bench-workers")
    stamp = time.strftime("%H%M%S")
    images = work / "images"
    images.mkdir()
    for i in range(args.units):
        colour = (i * 37 % 256, i * 91 % 256, i * 53 % 256)
        Image.new("RGB", (32, 32), colour).save(images / f"img-{i:05d}.png")
    texts = work / "texts"
    if args.embed_texts:
        texts.mkdir()
        with gzip.open(args.corpus, "rt", encoding="utf-8") as fh:
            for i, line in zip(range(args.embed_texts), fh, strict=False):
                (texts / f"doc-{i:05d}.txt").write_text(json.loads(line)["text"], "utf-8")
        warm = work / "warm"
        warm.mkdir()
        for i in range(8):
            (warm / f"w{i}.txt").write_text(f"warm-up text number {i}\n")

    def campaign(name: str, processor: str, folder: Path, params: dict):
        c, _ = setup.campaign_create(
            name=f"{name}-{stamp}",
            processor=processor,
            project=project,
            input_folder=folder,
            params=params,
            checkpoint_after=0,  # measuring speed: no stop for a spot check
        )
        return c

    def unfinished(c) -> int:
        done = [UnitState.SUCCEEDED, UnitState.FAILED, UnitState.NEEDS_REVIEW]
        return Unit.objects.filter(campaign=c).exclude(state__in=done).count()

    def timed_run(c) -> float:
        started = time.perf_counter()
        start.campaign_run(campaign=c)
        while unfinished(c):
            time.sleep(0.05)
        return time.perf_counter() - started

    image_params = {"batch_size": args.batch_size, "width": 16, "height": 16}
    embed_params = {"batch_size": args.embed_batch_size, "batch_policy": "length_grouped"}
    rows = []
    for n in [int(x) for x in args.workers.split(",")]:
        with leases.celery_app.connection_for_write() as conn:
            conn.default_channel.queue_purge("gpu")
        threads = {"OMP_NUM_THREADS": str(args.threads)} if args.threads else {}
        workers = Workers(n, work, {**os.environ, **env, **threads})
        try:
            workers.wait_ready()
            plans = [("image-transform", images, image_params, args.units)]
            if args.embed_texts:
                # The model loads on each worker's first batch: one small batch each.
                warm_c = campaign(f"warm-{n}", "text-embedding", warm, {"batch_size": 1})
                timed_run(warm_c)
                plans.append(("text-embedding", texts, embed_params, args.embed_texts))
            for processor, folder, params, units in plans:
                c = campaign(f"scale-{n}-{processor}", processor, folder, params)
                seconds = timed_run(c)
                split = sorted(
                    Batch.objects.filter(campaign=c)
                    .values("worker")
                    .annotate(n=Count("pk"))
                    .values_list("n", flat=True),
                    reverse=True,
                )
                ok = Unit.objects.filter(campaign=c, state=UnitState.SUCCEEDED).count()
                rows.append((processor, n, units, ok, seconds, split))
        finally:
            workers.stop()

    load = os.getloadavg()
    print(
        f"# {os.cpu_count()} cores, torch threads per worker: {args.threads or 'default'}, "
        f"load average at the end {load[0]:.1f}; "
        f"database {args.database_url.rsplit('@', 1)[-1]}, broker {args.broker_url}"
    )
    print("| processor | workers | units | done | seconds | units/s | × 1 worker | batches each |")
    print("|---|---:|---:|---:|---:|---:|---:|---|")
    base: dict[str, float] = {}
    for processor, n, units, ok, seconds, split in rows:
        rate = ok / seconds
        base.setdefault(processor, rate)
        print(
            f"| {processor} | {n} | {units} | {ok} | {seconds:.1f} | {rate:.1f} | "
            f"{rate / base[processor]:.2f} | {' / '.join(map(str, split))} |"
        )
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
