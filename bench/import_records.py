"""Record import at scale: rows/s and peak RSS of `campaign create --records`.

    .venv/bin/python bench/import_records.py --rows 1000000 \\
        --database-url postgres://postgres@127.0.0.1:5432/bench_records

Writes --rows records (id, text of 200–1,000 characters, category) as a
Parquet file (row groups of 100,000 rows) and as the same JSONL, with
pyarrow, in a temp dir (not timed). Then, each in its own process so that
peak RSS (VmHWM) is the importer's: creates a record campaign over the
file through the setup service (`campaign create NAME --records FILE
--id-column id --text-column text --category-column category`), then
imports the unchanged file again (every row already there). On PostgreSQL
(--database-url; the database is created and dropped by the bench, so name
one that is not in use) and on a throw-away SQLite file. `--code PATH` runs
the importer of another checkout (say `git worktree add /tmp/base <commit>`)
for a before/after in the same run; `--formats parquet` skips the JSONL.
Results go in bench/RESULTS.md, "Record import at scale".
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import urlparse

REPO = Path(__file__).resolve().parent.parent
GROUP_ROWS = 100_000
CATEGORIES = ("news", "legal", "medical", "forum", "code", "fiction", "science", "finance")


def _words(seed: int = 32) -> str:
    """Some 4 MB of word-like text that record texts are cut from."""
    import random

    rng = random.Random(seed)
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    vocabulary = [
        "".join(rng.choices(letters, weights=range(26, 0, -1), k=rng.randint(2, 11)))
        for _ in range(20_000)
    ]
    return " ".join(rng.choices(vocabulary, k=700_000))


def write_records(
    parquet: Path, jsonl: Path | None, rows: int, group_rows: int = GROUP_ROWS
) -> None:
    """`rows` records, a row group of `group_rows` at a time (memory holds one group)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    words = _words()
    rng = np.random.default_rng(32)
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("category", pa.string())])
    out = jsonl.open("w", encoding="utf-8") if jsonl else None
    with pq.ParquetWriter(parquet, schema) as writer:
        for start in range(0, rows, group_rows):
            n = min(group_rows, rows - start)
            lengths = rng.integers(200, 1001, n)
            offsets = rng.integers(0, len(words) - 1001, n)
            ids = [f"rec-{i:08d}" for i in range(start, start + n)]
            # The id first: every text differs, as a real corpus's mostly do.
            texts = [
                f"{uid}: {words[o : o + k]}"
                for uid, o, k in zip(ids, offsets.tolist(), lengths.tolist(), strict=True)
            ]
            categories = [CATEGORIES[i % len(CATEGORIES)] for i in range(start, start + n)]
            writer.write_table(
                pa.table({"id": ids, "text": texts, "category": categories}, schema=schema),
                row_group_size=group_rows,
            )
            if out:
                out.writelines(
                    json.dumps({"id": u, "text": t, "category": c}, ensure_ascii=False) + "\n"
                    for u, t, c in zip(ids, texts, categories, strict=True)
                )
    if out:
        out.close()


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return 0.0


def _rss_mib() -> float:
    return _status_mib("VmRSS")


def _peak_rss_mib() -> float:
    """This process's peak RSS: ru_maxrss, or VmHWM when lower (Linux's
    ru_maxrss keeps the peak of the process that forked this one, across exec)."""
    return min(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, _status_mib("VmHWM"))


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _backend_cpu_s(connection) -> float | None:
    """CPU seconds of this connection's PostgreSQL backend, when it runs on this machine."""
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _timed(label: str, result: dict, connection, step) -> object:
    """Run step(); its wall time, and the CPU time of this process and of the
    database backend (on a shared machine wall time follows the load)."""
    cpu, db = _cpu_s(), _backend_cpu_s(connection)
    started = time.perf_counter()
    value = step()
    result[f"{label}_s"] = time.perf_counter() - started
    result[f"{label}_python_cpu_s"] = _cpu_s() - cpu
    if db is not None:
        result[f"{label}_db_cpu_s"] = (_backend_cpu_s(connection) or db) - db
    return value


def run_one(records: Path, rows: int, profile: str | None) -> dict:
    """In a child process: set up Django, create the campaign over the records
    (its import), import them again, report as JSON."""
    work = records.parent
    os.environ.update(
        {
            "VAR_DIR": str(work / "var"),
            "OUTPUT_ROOT": str(work / "outputs"),
            "DJANGO_SETTINGS_MODULE": "portal.settings",
        }
    )
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

    from campaigns.intake.records import RecordColumns
    from campaigns.models import Campaign, Unit
    from campaigns.runs import setup

    call_command("migrate", verbosity=0)
    project = setup.project_for_user(name="bench")
    name = f"bench-records-{os.getpid()}"
    columns = RecordColumns(text="text", id="id", category="category")
    rss_before = _rss_mib()
    result: dict = {
        "backend": connection.vendor,
        "format": records.suffix.lstrip("."),
        "rows": rows,
        "rss_before_mib": rss_before,
    }
    created: list = []

    def create():
        campaign, report = setup.campaign_create(
            name=name,
            processor="text-embedding",
            project=project,
            records=records,
            columns=columns,
            checkpoint_after=0,
        )
        created.append(campaign)
        return report

    try:
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        report = _timed("import", result, connection, create)
        if profiler:
            profiler.disable()
            profiler.dump_stats(profile)
        assert report.created == rows and not report.failed, report.as_dict()
        result["import_rows_s"] = rows / result["import_s"]
        result["peak_rss_after_import_mib"] = _peak_rss_mib()
        campaign = created[0]
        again = _timed(
            "reimport", result, connection, lambda: setup.campaign_import(campaign=campaign)
        )
        assert again.created == 0 and again.existing == rows, again.as_dict()
        assert not again.changed and not again.removed, again.as_dict()
        result["reimport_rows_s"] = rows / result["reimport_s"]
        result["peak_rss_mib"] = _peak_rss_mib()
    finally:
        for campaign in created:
            # Units first, in one statement: Campaign.delete() would collect a
            # million of them in Python.
            Unit.objects.filter(campaign=campaign)._raw_delete(connection.alias)
            Campaign.objects.filter(pk=campaign.pk).delete()
    return result


def _admin(url: str, sql: str) -> None:
    """A statement on the server's `postgres` database (CREATE or DROP DATABASE)."""
    import psycopg

    parsed = urlparse(url)
    with psycopg.connect(
        host=parsed.hostname,
        port=parsed.port or 5432,
        user=parsed.username,
        password=parsed.password,
        dbname="postgres",
        autocommit=True,
    ) as conn:
        conn.execute(sql)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--formats", default="parquet,jsonl")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument(
        "--code",
        action="append",
        help="a checkout whose importer to run (repeatable; default: this one)",
    )
    parser.add_argument("--profile", help="cProfile each import into this folder")
    parser.add_argument("--keep", help="write (or reuse) the records in this folder")
    parser.add_argument(
        "--group-rows",
        type=int,
        default=GROUP_ROWS,
        help="rows a Parquet row group (pyarrow's writer defaults to 1,048,576)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--write", help=argparse.SUPPRESS)
    parser.add_argument("--jsonl", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.write:
        write_records(
            Path(args.write), Path(args.jsonl) if args.jsonl else None, args.rows, args.group_rows
        )
        return

    if args.child:
        result = run_one(Path(args.child), args.rows, args.profile)
        print("RESULT " + json.dumps(result))
        return

    work = Path(args.keep or tempfile.mkdtemp(prefix="bench-records-"))
    work.mkdir(parents=True, exist_ok=True)
    formats = args.formats.split(",")
    grouped = "" if args.group_rows == GROUP_ROWS else f"-g{args.group_rows}"
    files = {fmt: work / f"records-{args.rows}{grouped}.{fmt}" for fmt in formats}
    parquet = files.get("parquet", work / f"records-{args.rows}.parquet")
    if not all(path.exists() for path in files.values()):
        started = time.perf_counter()
        # In a process of its own: the importers' peak RSS is not the writer's.
        jsonl = files.get("jsonl")
        command = [sys.executable, __file__, "--rows", str(args.rows), "--write", str(parquet)]
        command += ["--group-rows", str(args.group_rows)]
        subprocess.run([*command, *(["--jsonl", str(jsonl)] if jsonl else [])], check=True)
        print(f"records written in {time.perf_counter() - started:.1f} s (not timed below)")
    for fmt, path in files.items():
        print(f"{fmt}: {args.rows:,} rows, {path.stat().st_size / 2**20:.0f} MiB ({path})")
    backends: list[str | None] = []
    if args.database_url:
        backends.append(args.database_url)
    if not args.no_sqlite:
        backends.append(None)
    codes = [Path(c).resolve() for c in args.code or [str(REPO)]]
    results = []
    for url in backends:
        if url:
            dbname = urlparse(url).path.lstrip("/")
            _admin(url, f'DROP DATABASE IF EXISTS "{dbname}"')
            _admin(url, f'CREATE DATABASE "{dbname}"')
        try:
            for code in codes:
                for fmt, path in files.items():
                    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
                    env["PYTHONPATH"] = str(code)
                    if url:
                        env["DATABASE_URL"] = url
                    # Each checkout's own SQLite file: a fresh one per run.
                    sqlite = work / "var" / "db.sqlite3"
                    sqlite.unlink(missing_ok=True)
                    command = [sys.executable, __file__, "--rows", str(args.rows)]
                    command += ["--child", str(path)]
                    if args.profile:
                        Path(args.profile).mkdir(parents=True, exist_ok=True)
                        name = f"{code.name}-{'pg' if url else 'sqlite'}-{fmt}.prof"
                        command += ["--profile", str(Path(args.profile) / name)]
                    load = _load()
                    out = subprocess.run(
                        command, env=env, cwd=code, check=True, stdout=subprocess.PIPE, text=True
                    )
                    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
                    result = json.loads(line.removeprefix("RESULT "))
                    result.update(code=code.name, load_before=load, load_after=_load())
                    results.append(result)
                    print(json.dumps(result), flush=True)
        finally:
            if url:
                _admin(url, f'DROP DATABASE IF EXISTS "{dbname}"')
    print()
    print(
        "| code | backend | format | step | wall s | rows/s | CPU s, Python | CPU s, backend "
        "| peak RSS MiB (before) | load average before → after |"
    )
    print("|---|---|---|---|---:|---:|---:|---:|---:|---|")
    for r in results:
        for step in ("import", "reimport"):
            db = r.get(f"{step}_db_cpu_s")
            rss = r["peak_rss_after_import_mib" if step == "import" else "peak_rss_mib"]
            print(
                f"| {r['code']} | {r['backend']} | {r['format']} | {step} | {r[f'{step}_s']:.1f} "
                f"| {r[f'{step}_rows_s']:,.0f} | {r[f'{step}_python_cpu_s']:.1f} | "
                f"{'in process' if db is None else f'{db:.1f}'} | "
                f"{rss:.0f} ({r['rss_before_mib']:.0f}) | "
                f"{r['load_before'].split()[0]} → {r['load_after'].split()[0]} |"
            )


if __name__ == "__main__":
    main()
