"""The worker's host work alone: `run_batch` with the model replaced by an instant stand-in.

    DEBUG=0 .venv/bin/python bench/orchestration.py --limit 3000
    DEBUG=0 .venv/bin/python bench/orchestration.py --limit 3000 --profile 32768
    DEBUG=0 .venv/bin/python bench/orchestration.py --limit 3000 --processes 2
    DEBUG=0 .venv/bin/python bench/orchestration.py --limit 3000 --statements
    DEBUG=0 .venv/bin/python bench/orchestration.py --limit 3000 --sources files,jsonl,parquet
    DEBUG=0 .venv/bin/python bench/orchestration.py --limit 3000 --rounds 5

On a GPU the model is a fraction of a batch's time (bench/RESULTS.md, the H200
figures): what a worker does around it — claim, read and check inputs, write
and check one file a unit, record — sets the speed. This measures that part on
any machine, ms a unit, for a small and a large token budget; `--profile` adds a
cProfile of the run at that budget. Not a model benchmark: the vectors are random.
`--processes N` runs the batches in N forked processes at once, as N pool
processes of one worker would (WORKERS_PER_DEVICE): how far the host work
spreads over cores, with the database's own locking in the way.
`--sources` names the corpus's forms: a file a unit (`files`), or the same texts
as rows of one JSONL or Parquet record file (`jsonl`, `parquet`).

Each row times the batches alone: the tokenizer each campaign's version
loads once a process is loaded before the clock starts, and the stand-in
hands out vectors from a pool drawn once (bench/instant_model.py).
On a shared machine a row's time wanders with the other load: `--rounds N`
runs each row N times, interleaved, and ends with the best of each.
Besides the wall time, each row says the process's CPU time a unit (user +
system, forked processes included): on a shared machine the wall time
wanders with the other load, the CPU time much less.
"""

from __future__ import annotations

import argparse
import cProfile
import multiprocessing
import os
import pstats
import resource
import sys
import time
from collections import defaultdict
from contextlib import nullcontext
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from bench import django_env, instant_model  # noqa: E402
from bench.corpus import DEFAULT_CORPUS, corpus_folder, read_texts  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--limit", type=int, default=3000)
    parser.add_argument("--budgets", default="2048,32768", help="token budgets, comma-separated")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every row this many times (a campaign each) and print the best of them",
    )
    parser.add_argument("--profile", type=int, default=0, help="cProfile the run at this budget")
    parser.add_argument("--profile-out", type=Path, help="and save those stats here (pstats)")
    parser.add_argument(
        "--statements",
        action="store_true",
        help="time each SQL statement (the database's answer, as the client waits for it)",
    )
    parser.add_argument(
        "--processes", type=int, default=1, help="run the batches in N processes at once"
    )
    parser.add_argument(
        "--sources",
        default="files",
        help="comma-separated: files (a file a unit), jsonl, parquet (rows of one record file)",
    )
    parser.add_argument(
        "--database-url",
        default="",
        help="run on this database (e.g. postgres://postgres@127.0.0.1:5432/bench_workers) "
        "instead of a fresh SQLite file. It is EMPTIED first (flush): give one of its own",
    )
    args = parser.parse_args()
    if (args.profile or args.statements) and args.processes > 1:
        parser.error("--profile and --statements measure one process: leave --processes at 1")

    work = django_env.setup("bench-orchestration-", args.database_url)
    import logging

    import numpy as np
    from django.db import connections

    from campaigns.intake.records import RecordColumns
    from campaigns.models import Batch, Unit, UnitState
    from campaigns.runs import setup, start
    from gpuworker.processors import get_processor, text_embedding
    from gpuworker.runner.batch import run_batch

    logging.getLogger("gpuworker").setLevel(logging.WARNING)
    logging.getLogger("campaigns.runs.recording").setLevel(logging.WARNING)
    texts = read_texts(args.corpus, args.limit)
    corpus = corpus_folder(work / "corpus", texts)
    record_files = {
        "jsonl": work / "records" / "texts.jsonl",
        "parquet": work / "records" / "texts.parquet",
    }
    write_records(record_files, texts)
    project = setup.project_for_user(name="bench")
    rng = np.random.default_rng(0)

    instant_embed = instant_model.instant_embed(rng)

    def campaign(name: str, budget: int, source: str = "files"):
        where: dict = (
            {"input_folder": corpus}
            if source == "files"
            else {"records": record_files[source], "columns": RecordColumns(text="text", id="id")}
        )
        created, _ = setup.campaign_create(
            checkpoint_after=0,
            name=name,
            processor="text-embedding",
            project=project,
            params={"batch_size": 16, "batch_policy": "token_budget", "token_budget": budget},
            **where,
        )
        start.campaign_run(campaign=created)
        return list(
            Batch.objects.filter(campaign=created).order_by("pk").values_list("pk", flat=True)
        )

    def run_share(pks: list[int]) -> None:
        if args.processes > 1:
            # Forked processes would draw the same "vectors": the duplicate
            # check would send half the units to review.
            rng.bit_generator.state = np.random.default_rng(os.getpid()).bit_generator.state
        for pk in pks:
            run_batch(pk)
        if args.processes > 1:
            connections.close_all()

    def run_all(pks: list[int]) -> None:
        """The batches in turn, or spread over forked processes (each its own
        database connection), which take them as a worker's pool would."""
        if args.processes == 1:
            run_share(pks)
            return
        connections.close_all()  # not shared across the fork
        fork = multiprocessing.get_context("fork")
        shares = [
            fork.Process(target=run_share, args=(pks[i :: args.processes],))
            for i in range(args.processes)
        ]
        for proc in shares:
            proc.start()
        for proc in shares:
            proc.join()
        if any(proc.exitcode for proc in shares):
            raise SystemExit(f"a process failed: exit codes {[p.exitcode for p in shares]}")

    with (
        mock.patch.object(start.celery_app, "send_task"),
        mock.patch.object(text_embedding.TextEmbeddingProcessor, "embed", instant_embed),
    ):
        for pk in campaign("warm-up", 2048)[:3]:
            run_batch(pk)
        best: dict[str, tuple[float, float]] = {}
        for round_, source, budget in (
            (r, s, int(b))
            for r in range(args.rounds)
            for s in args.sources.split(",")
            for b in args.budgets.split(",")
        ):
            name = f"{source}-{budget}-{round_}"
            batches = campaign(name, budget, source)
            # The model loads once a process and version, as in a worker, before
            # the clock starts: the rows measure what each batch costs.
            version = Batch.objects.get(pk=batches[0]).version
            get_processor("text-embedding", version.params, version.software.get("files"))
            profile = cProfile.Profile() if budget == args.profile else None
            timer = StatementTimer()
            cpu = cpu_seconds()
            started = time.perf_counter()
            if profile:
                profile.enable()
            timing = connections["default"].execute_wrapper(timer)
            with timing if args.statements else nullcontext():
                run_all(batches)
            if profile:
                profile.disable()
            seconds = time.perf_counter() - started
            cpu = cpu_seconds() - cpu
            done = Unit.objects.filter(campaign__name=name, state=UnitState.SUCCEEDED).count()
            print(
                f"{source}, token budget {budget}: {len(batches)} batches, {done} of "
                f"{len(texts)} units done, {args.processes} "
                f"process{'es' if args.processes > 1 else ''}, {seconds:.2f} s, "
                f"{1000 * seconds / len(texts):.3f} ms a unit, "
                f"{1000 * cpu / len(texts):.3f} CPU ms a unit, "
                f"{1000 * seconds / len(batches):.1f} ms a batch"
            )
            key = f"{source}, token budget {budget}"
            wall_ms, cpu_ms = 1000 * seconds / len(texts), 1000 * cpu / len(texts)
            kept = best.get(key, (wall_ms, cpu_ms))
            best[key] = (min(kept[0], wall_ms), min(kept[1], cpu_ms))
            if args.statements:
                timer.report(len(batches))
            if profile:
                pstats.Stats(profile).sort_stats("cumulative").print_stats(40)
                if args.profile_out:
                    profile.dump_stats(args.profile_out)
        if args.rounds > 1:
            print(f"best of {args.rounds} rounds, ms a unit (wall, CPU):")
            for key, (wall_ms, cpu_ms) in best.items():
                print(f"  {key}: {wall_ms:.3f}, {cpu_ms:.3f}")


def cpu_seconds() -> float:
    """User + system time of this process and of its children waited for."""
    mine, children = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return mine.ru_utime + mine.ru_stime + children.ru_utime + children.ru_stime


def write_records(files: dict[str, Path], texts: list[str]) -> None:
    """The texts as rows {"id": "doc-00000", "text": …} of a JSONL and a Parquet file."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [f"doc-{i:05d}" for i in range(len(texts))]
    files["jsonl"].parent.mkdir(parents=True, exist_ok=True)
    with open(files["jsonl"], "w", encoding="utf-8") as fh:
        for uid, text in zip(ids, texts, strict=True):
            fh.write(json.dumps({"id": uid, "text": text}) + "\n")
    pq.write_table(pa.table({"id": ids, "text": texts}), files["parquet"])


class StatementTimer:
    """A connection's execute wrapper: the time each kind of statement took,
    from sending it to its answer (named by its first words)."""

    def __init__(self):
        self.seconds: dict[str, list[float]] = defaultdict(list)

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds[" ".join(sql.split()[:6])[:70]].append(time.perf_counter() - started)

    def report(self, batches: int) -> None:
        total = sum(sum(t) for t in self.seconds.values())
        print(f"  statements: {1000 * total / batches:.2f} ms a batch")
        for key, times in sorted(self.seconds.items(), key=lambda kv: -sum(kv[1])):
            print(
                f"  {1000 * sum(times) / batches:6.2f} ms a batch, "
                f"{len(times) / batches:4.1f} a batch  {key}"
            )


if __name__ == "__main__":
    main()
