"""Import of a trusted manifest at scale: rows/s and peak RSS.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/helper_import \\
        .venv/bin/python bench/import_scale.py --rows 1000000

Writes a manifest of --rows rows (id, path, size, sha256; JSONL or --format
csv) in a temp dir, then, each in its own process so peak RSS is the
import's: imports it into a fresh campaign, imports it again (every row
already there), on PostgreSQL (DATABASE_URL or --database-url; its tables are
migrated, the campaign deleted afterwards) and on a throw-away SQLite file.
The input files do not exist: a trusted row is not opened at import. Results
go in bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def write_manifest(path: Path, rows: int, fmt: str) -> None:
    with path.open("w", encoding="utf-8", newline="") as fh:
        if fmt == "csv":
            fh.write("id,path,size,sha256\n")
        for i in range(rows):
            uid = f"doc-{i:07d}"
            sha = hashlib.sha256(uid.encode()).hexdigest()
            rel = f"{i // 1000:04d}/{uid}.txt"
            size = 100 + i % 5000
            if fmt == "csv":
                fh.write(f"{uid},{rel},{size},{sha}\n")
            else:
                fh.write(f'{{"id": "{uid}", "path": "{rel}", "size": {size}, "sha256": "{sha}"}}\n')


def _rss_mib() -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


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
    """Run step(); record its wall time and the CPU time of this process and of the
    database backend: on a shared machine wall time follows the load, CPU time
    is the work."""
    cpu, db = _cpu_s(), _backend_cpu_s(connection)
    started = time.perf_counter()
    value = step()
    result[f"{label}_s"] = time.perf_counter() - started
    result[f"{label}_python_cpu_s"] = _cpu_s() - cpu
    if db is not None:
        result[f"{label}_db_cpu_s"] = _backend_cpu_s(connection) - db
    return value


def run_one(manifest: Path, rows: int, profile: bool) -> dict:
    """In a child process: set up Django, import twice, report as JSON."""
    work = manifest.parent
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

    from campaigns.intake.importing import import_manifest
    from campaigns.models import Campaign, Unit
    from campaigns.runs import setup

    call_command("migrate", verbosity=0)
    project = setup.project_for_user(name="bench")
    name = f"bench-import-{os.getpid()}"
    campaign, _ = setup.campaign_create(
        name=name,
        processor="text-embedding",
        project=project,
        manifest=manifest.parent / "empty.jsonl",
        input_root=manifest.parent / "corpus",
        checkpoint_after=0,
    )
    rss_before = _rss_mib()
    result: dict = {"backend": connection.vendor, "rows": rows, "rss_before_mib": rss_before}
    try:
        profiler = None
        if profile:
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        report = _timed("import", result, connection, lambda: import_manifest(campaign, manifest))
        if profiler:
            profiler.disable()
            profiler.dump_stats(str(work / f"import-{connection.vendor}.prof"))
        assert report.created == rows, report.as_dict()
        result["import_rows_s"] = rows / result["import_s"]
        result["peak_rss_after_import_mib"] = (
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        )
        again = _timed("reimport", result, connection, lambda: import_manifest(campaign, manifest))
        assert again.created == 0 and again.existing == rows, again.as_dict()
        result["reimport_rows_s"] = rows / result["reimport_s"]
        result["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        result["units"] = Unit.objects.filter(campaign=campaign).count()
    finally:
        # Units first, in one statement: Campaign.delete() would collect a
        # million of them in Python.
        Unit.objects.filter(campaign=campaign)._raw_delete(connection.alias)
        Campaign.objects.filter(pk=campaign.pk).delete()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--format", choices=("jsonl", "csv"), default="jsonl")
    parser.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    parser.add_argument("--no-sqlite", action="store_true")
    parser.add_argument("--profile", action="store_true", help="cProfile each import")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        result = run_one(Path(args.child), args.rows, args.profile)
        print("RESULT " + json.dumps(result))
        return

    work = Path(tempfile.mkdtemp(prefix="bench-import-"))
    manifest = work / f"manifest.{args.format}"
    started = time.perf_counter()
    write_manifest(manifest, args.rows, args.format)
    (work / "empty.jsonl").write_text("")
    print(
        f"manifest: {args.rows:,} rows, {manifest.stat().st_size / 2**20:.0f} MiB, "
        f"written in {time.perf_counter() - started:.1f} s ({manifest})"
    )
    backends: list[str | None] = []
    if args.database_url:
        backends.append(args.database_url)
    if not args.no_sqlite:
        backends.append(None)
    results = []
    for url in backends:
        env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
        if url:
            env["DATABASE_URL"] = url
        command = [sys.executable, __file__, "--rows", str(args.rows), "--child", str(manifest)]
        if args.profile:
            command.append("--profile")
        out = subprocess.run(command, env=env, check=True, stdout=subprocess.PIPE, text=True)
        line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT "))
        result = json.loads(line.removeprefix("RESULT "))
        results.append(result)
        print(json.dumps(result))
    print()
    print(
        "| backend | step | wall s | rows/s | CPU s: Python (both threads) | CPU s: database "
        "backend | peak RSS MiB (before import) |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in results:
        for step in ("import", "reimport"):
            db = r.get(f"{step}_db_cpu_s")
            print(
                f"| {r['backend']} | {step} | {r[f'{step}_s']:.1f} | "
                f"{r[f'{step}_rows_s']:,.0f} | {r[f'{step}_python_cpu_s']:.1f} | "
                f"{'in process' if db is None else f'{db:.1f}'} | "
                f"{r['peak_rss_mib']:.0f} ({r['rss_before_mib']:.0f}) |"
            )


if __name__ == "__main__":
    main()
